"""The reads behind EstimateBatch: the billing project as its caller may see it, the history of job names in
it, and the prices of a batch's jobs. Every statement reads; none writes or locks.

The prices come from the procedure `estimate_job_prices`, which calls the stored functions that price a
reservation (`job_reserve_ms`, `job_worst_case_micro_usd`) at the view `reservation_rates`: the worst case is
what `schedule_jobs` reserves, by the same rule, not a copy of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from services.db.database import Database

HISTORY_BATCHES = 20
"""A name's history is looked for in the project's newest this many batches: a bounded read however many
batches the project ran."""
HISTORY_ATTEMPTS_PER_NAME = 50
"""At most this many of a name's earlier attempts are read."""
NAMES_PER_STATEMENT = 500
"""Names looked up in one statement (a part of a UNION each)."""
MAX_NAME_CHARS = 100
"""Longer names get no history: the index on job attributes keeps a value's first 100 characters."""
NAME_KEY = "name"
"""The job attribute whose value names a job across batches (the batch file's job `name`)."""


@dataclasses.dataclass(frozen=True)
class ProjectAccess:
    """A billing project as an estimate needs it."""

    state: str
    member: bool
    """Whether the caller is one of its members."""
    limited: bool
    """Whether it has a spending limit (schedule_jobs reserves only then)."""


@dataclasses.dataclass(frozen=True)
class Prices:
    """Sums over priced jobs, in micro-USD."""

    worst_case_micro_usd: int
    expected_micro_usd: int


class EstimateStore:
    """SQL reads of EstimateBatch."""

    def __init__(self, db: Database):
        self.db = db

    async def project(self, name: str, user: str) -> ProjectAccess | None:
        """The project `name` (None: it does not exist, or was deleted) and whether `user` is its member."""
        row = await self.db.fetchone(
            """SELECT p.state, p.limit_usd IS NOT NULL AS limited,
                      EXISTS (SELECT 1 FROM billing_project_members m
                              WHERE m.billing_project = p.name AND m.user = %s) AS member
               FROM billing_projects p WHERE p.name = %s AND p.state <> 'deleted'""",
            (user, name), name="estimate_project")
        if row is None:
            return None
        return ProjectAccess(row["state"], bool(row["member"]), bool(row["limited"]))

    async def history_ms(self, project: str, names: Collection[str]) -> dict[str, list[int]]:
        """For each of `names` that succeeded before in the project's newest HISTORY_BATCHES batches: the
        measured time of each such job, every attempt of it that ran summed (its retries cost too), from at
        most HISTORY_ATTEMPTS_PER_NAME attempts per name."""
        wanted = sorted({n for n in names if 0 < len(n) <= MAX_NAME_CHARS})
        if not wanted:
            return {}
        batches = [r["batch_id"] for r in await self.db.fetchall(
            "SELECT batch_id FROM batches WHERE billing_project = %s ORDER BY batch_id DESC LIMIT %s",
            (project, HISTORY_BATCHES), name="estimate_recent_batches")]
        if not batches:
            return {}
        marks = ", ".join(["%s"] * len(batches))
        # One part per name, each cut at its own LIMIT: a name of a million jobs reads no more than another.
        part = f"""(SELECT ja.`value` AS name, a.batch_id, a.job_id, a.end_time_ms - a.start_time_ms AS ms
                    FROM job_attributes ja
                    JOIN jobs j ON j.batch_id = ja.batch_id AND j.job_id = ja.job_id AND j.state = 'Success'
                    JOIN attempts a ON a.batch_id = ja.batch_id AND a.job_id = ja.job_id
                    WHERE ja.batch_id IN ({marks}) AND ja.`key` = %s AND ja.`value` = %s
                      AND a.start_time_ms IS NOT NULL AND a.end_time_ms IS NOT NULL
                    LIMIT {HISTORY_ATTEMPTS_PER_NAME})"""
        rows: list[dict[str, Any]] = []
        for first in range(0, len(wanted), NAMES_PER_STATEMENT):
            chunk = wanted[first:first + NAMES_PER_STATEMENT]
            params: list[Any] = []
            for name in chunk:
                params += [*batches, NAME_KEY, name]
            rows += await self.db.fetchall(" UNION ALL ".join([part] * len(chunk)), tuple(params),
                                           name="estimate_name_history")
        return job_times(rows)

    async def prices(self, project: str, jobs: Sequence[tuple[int, int, int, int | None, int | None]]) -> Prices:
        """The sums over `jobs`, each (count, cores_mcpu, memory_bytes, timeout_ms, expected_ms) of identical
        jobs, of the worst case (job_worst_case_micro_usd for job_reserve_ms) and of the expected cost (the
        same price for expected_ms, or for the timeout, or for the project's max_job_duration_ms)."""
        if not jobs:
            return Prices(0, 0)
        rows = [{"n": n, "c": cores, "m": memory, **({"t": timeout} if timeout is not None else {}),
                 **({"e": expected} if expected is not None else {})}
                for n, cores, memory, timeout, expected in jobs]
        status, _ = await self.db.call("estimate_job_prices", project, rows)
        return Prices(int(status["worst_micro_usd"]), int(status["expected_micro_usd"]))


def job_times(rows: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    """Attempt rows (name, batch_id, job_id, ms) as each name's jobs' summed times. A name whose read was cut at
    its LIMIT drops its last job, which may be missing attempts."""
    by_job: dict[str, dict[tuple[int, int], int]] = {}
    counts: dict[str, int] = {}
    for row in rows:
        jobs = by_job.setdefault(row["name"], {})
        key = (row["batch_id"], row["job_id"])
        jobs[key] = jobs.get(key, 0) + max(0, int(row["ms"]))
        counts[row["name"]] = counts.get(row["name"], 0) + 1
    times = {}
    for name, jobs in by_job.items():
        found = list(jobs.values())
        if counts[name] >= HISTORY_ATTEMPTS_PER_NAME and len(found) > 1:
            found = found[:-1]
        times[name] = found
    return times
