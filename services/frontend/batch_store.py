"""Reads of batches and updates for the frontend, and the visibility rule.

A batch is visible to members of its billing project and to administrators
and developers. `visible_batch` finds a batch only if the caller may see
it, and `services.frontend.access` answers NOT_FOUND alike for a missing,
deleted or invisible batch; lists simply leave invisible batches out. Counts come from the tokenized
counters, never from scanning a batch's jobs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from services.common.identity import Principal
from services.db.database import Database
from services.db.plan_snapshot import read_deployment
from services.policy.runnable import Deployment

_BATCH_SELECT = """
SELECT b.*, c.cancelled_by, c.reason AS cancel_reason, c.time_cancelled_ms, h.held_by, h.time_held_ms,
       g.cancel_after_n_failures,
       (SELECT COALESCE(SUM(x.`usage` * r.rate_usd), 0) FROM aggregated_job_group_resources x
          JOIN resources r ON r.resource_id = x.resource_id
          WHERE x.batch_id = b.batch_id AND x.job_group_id = 0) AS cost_usd,
       -- In the same statement as the state: every event up to this id is a
       -- change the row already shows (WatchBatch from last_event_id + 1).
       COALESCE((SELECT s.last_event_id FROM batch_event_sequences s WHERE s.batch_id = b.batch_id), 0)
         AS last_event_id
FROM batches b
JOIN job_groups g ON g.batch_id = b.batch_id AND g.job_group_id = 0
LEFT JOIN job_groups_cancelled c ON c.batch_id = b.batch_id AND c.job_group_id = 0
LEFT JOIN job_groups_held h ON h.batch_id = b.batch_id AND h.job_group_id = 0
"""

_VISIBLE = """
(%s OR EXISTS (SELECT 1 FROM billing_project_members m
               WHERE m.billing_project = b.billing_project AND m.user = %s))
"""


@dataclasses.dataclass(frozen=True)
class BatchCounts:
    """Jobs of a batch by state, from the counters."""

    n_jobs: int
    n_ready: int
    n_running: int
    n_succeeded: int
    n_failed: int
    n_errored: int
    n_cancelled: int

    @property
    def n_pending(self) -> int:
        done = self.n_succeeded + self.n_failed + self.n_errored + self.n_cancelled
        return max(0, self.n_jobs - done - self.n_ready - self.n_running)


def sees_everything(principal: Principal) -> bool:
    return bool(principal.roles & {"admin", "developer"})


class BatchStore:
    """SQL reads behind GetBatch, ListBatches and the update RPCs."""

    def __init__(self, db: Database):
        self.db = db

    async def visible_batch(self, batch_id: int, principal: Principal, include_deleted: bool = False
                            ) -> dict[str, Any] | None:
        """The batch row (with cancellation and cost) if it exists and the caller may see it,
        in one statement; None otherwise, and for a deleted one unless `include_deleted`."""
        return await self.db.fetchone(
            f"{_BATCH_SELECT} WHERE b.batch_id = %s AND (%s OR NOT b.deleted) AND {_VISIBLE}",
            (batch_id, include_deleted, sees_everything(principal), principal.name), name="visible_batch")

    async def list_batches(self, where_sql: str, params: list[Any], principal: Principal, before_id: int | None,
                           limit: int) -> list[dict[str, Any]]:
        """Newest first; `where_sql` comes from the query language (parameterized)."""
        return await self.db.fetchall(
            f"""{_BATCH_SELECT}
                WHERE NOT b.deleted AND {_VISIBLE} AND ({where_sql}) AND (%s IS NULL OR b.batch_id < %s)
                ORDER BY b.batch_id DESC LIMIT %s""",
            (sees_everything(principal), principal.name, *params, before_id, before_id, limit), name="list_batches")

    async def attributes(self, batch_ids: list[int]) -> dict[int, dict[str, str]]:
        if not batch_ids:
            return {}
        rows = await self.db.fetchall(
            f"SELECT batch_id, `key`, `value` FROM batch_attributes WHERE batch_id IN ({', '.join(['%s'] * len(batch_ids))})",
            tuple(batch_ids), name="batch_attributes")
        found: dict[int, dict[str, str]] = {i: {} for i in batch_ids}
        for row in rows:
            found[row["batch_id"]][row["key"]] = row["value"] or ""
        return found

    async def counts(self, n_jobs_by_batch: Mapping[int, int]) -> dict[int, BatchCounts]:
        """Each batch's jobs by state (given its number of jobs), in two statements however many batches:
        a page of ListBatches reads its counts at once, not per row."""
        ids = list(n_jobs_by_batch)
        if not ids:
            return {}
        marks = ", ".join(["%s"] * len(ids))
        done = {r["batch_id"]: r for r in await self.db.fetchall(
            f"""SELECT batch_id, SUM(n_succeeded) s, SUM(n_failed) f, SUM(n_errored) e, SUM(n_cancelled) c
                FROM job_groups_n_jobs_in_complete_states WHERE batch_id IN ({marks}) AND job_group_id = 0
                GROUP BY batch_id""", tuple(ids), name="batch_completion_counts")}
        live = {r["batch_id"]: r for r in await self.db.fetchall(
            f"""SELECT batch_id,
                       SUM(n_ready_cancellable_jobs + n_ready_always_run_jobs + n_ready_dependency_failed_jobs) r,
                       SUM(n_running_jobs + n_creating_jobs) n
                FROM user_inst_coll_resources_by_job_group WHERE batch_id IN ({marks}) GROUP BY batch_id""",
            tuple(ids), name="batch_live_counts")}
        nothing = {"s": 0, "f": 0, "e": 0, "c": 0, "r": 0, "n": 0}
        counts = {}
        for batch_id, n_jobs in n_jobs_by_batch.items():
            d, v = done.get(batch_id, nothing), live.get(batch_id, nothing)
            counts[batch_id] = BatchCounts(n_jobs, int(v["r"]), int(v["n"]), int(d["s"]), int(d["f"]), int(d["e"]),
                                           int(d["c"]))
        return counts

    async def deployment(self) -> Deployment:
        """The deployment's instance collections (pools and the job-private one), as operators configured
        them: what a job may ask for, and which pool's machine it is held to."""
        return await read_deployment(self.db)

    async def region_names(self) -> frozenset[str]:
        """The regions jobs may name."""
        rows = await self.db.fetchall("SELECT name FROM regions", name="region_names")
        return frozenset(row["name"] for row in rows)

    async def machine_regions(self) -> list[str]:
        """The regions the deployment's machines are made in, the preferred first (ListRegions): the cloud's
        configured regions in its order where add_regions ranked them, else every region by region_id (a
        deployment with no cloud, whose local provider makes machines in each)."""
        rows = await self.db.fetchall("SELECT name, preference FROM regions ORDER BY region_id",
                                      name="machine_regions")
        ranked = sorted((r for r in rows if r["preference"] is not None), key=lambda r: r["preference"])
        return [r["name"] for r in (ranked or rows)]

    async def get_update(self, batch_id: int, update_id: int) -> dict[str, Any] | None:
        return await self.db.fetchone(
            "SELECT * FROM batch_updates WHERE batch_id = %s AND update_id = %s", (batch_id, update_id),
            name="get_update")
