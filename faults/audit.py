"""What a fault cost, counted from the database after the batches completed:
jobs lost (never reached a final state, or not the one expected), jobs
completed twice (more than one final change of a job in the batch's event
log, or more than one attempt of it recorded as run to its end: the jobs a
fault program submits all exit 0, so a second 'exited' attempt is a second
committed run), attempts left open, and
every difference the invariant checker finds between corral's maintained
counters and the rows they summarize."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

from faults.stack import FINAL_STATES, Stack
from services.db.database import Database
from services.db.invariants import check_invariants


@dataclasses.dataclass
class Audit:
    jobs: int = 0
    by_state: dict[str, int] = dataclasses.field(default_factory=dict)
    lost: int = 0
    """Jobs not in a final state, or (when the fault must not cost any) not Success."""
    duplicated: int = 0
    """Jobs whose completion was recorded more than once."""
    attempts: int = 0
    rerun_jobs: int = 0
    """Jobs that needed more than one attempt (allowed: a fault may end an attempt)."""
    open_attempts: int = 0
    """Attempts of finished jobs without an end time."""
    problems: list[str] = dataclasses.field(default_factory=list)
    """What the invariant checker found."""

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and self.open_attempts == 0 and not self.problems

    def lines(self) -> list[str]:
        states = ", ".join(f"{n} {state}" for state, n in sorted(self.by_state.items()))
        return [f"jobs: {self.jobs} ({states})",
                f"attempts: {self.attempts} ({self.rerun_jobs} jobs ran more than once, "
                f"{self.open_attempts} attempts left open)",
                f"invariants: {len(self.problems)} problems" + "".join(f"\n  {p}" for p in self.problems),
                f"{self.lost} lost, {self.duplicated} duplicated"]


def audit(stack: Stack, batch_ids: Sequence[int], expect_success: bool = True) -> Audit:
    """Count what the fault cost these batches (see the module docstring)."""

    async def counted() -> Audit:
        db = await Database.connect(stack.database())
        try:
            return await audit_database(db, batch_ids, expect_success)
        finally:
            await db.close()

    return asyncio.run(counted())


async def audit_database(db: Database, batch_ids: Sequence[int], expect_success: bool = True) -> Audit:
    """`audit`, on a database connection."""
    ids = tuple(batch_ids)
    if not ids:
        return Audit(problems=await check_invariants(db))
    marks = ",".join(["%s"] * len(ids))

    async def count(sql: str) -> int:
        row = await db.fetchone(sql, ids, name="fault_audit")
        return int(row["n"]) if row else 0

    result = Audit()
    for row in await db.fetchall(f"SELECT state, COUNT(*) n FROM jobs WHERE batch_id IN ({marks}) GROUP BY state",
                                 ids, name="fault_audit"):
        result.by_state[row["state"]] = int(row["n"])
    result.jobs = sum(result.by_state.values())
    good = ("Success",) if expect_success else FINAL_STATES
    result.lost = sum(n for state, n in result.by_state.items() if state not in good)
    final = ",".join(f"'{s}'" for s in FINAL_STATES)
    result.duplicated = await count(
        f"SELECT COUNT(*) n FROM (SELECT batch_id, job_id FROM batch_events WHERE batch_id IN ({marks}) "
        f"AND kind = 'job_state_changed' AND new_state IN ({final}) GROUP BY batch_id, job_id "
        f"HAVING COUNT(*) > 1) t")
    result.duplicated += await count(
        f"SELECT COUNT(*) n FROM (SELECT batch_id, job_id FROM attempts WHERE batch_id IN ({marks}) "
        f"AND reason = 'exited' GROUP BY batch_id, job_id HAVING COUNT(*) > 1) t")
    result.attempts = await count(f"SELECT COUNT(*) n FROM attempts WHERE batch_id IN ({marks})")
    result.rerun_jobs = await count(
        f"SELECT COUNT(*) n FROM (SELECT batch_id, job_id FROM attempts WHERE batch_id IN ({marks}) "
        f"GROUP BY batch_id, job_id HAVING COUNT(*) > 1) t")
    result.open_attempts = await count(
        f"SELECT COUNT(*) n FROM attempts a JOIN jobs j USING (batch_id, job_id) WHERE a.batch_id IN ({marks}) "
        f"AND j.state IN ({final}) AND a.end_time_ms IS NULL AND a.start_time_ms IS NOT NULL")
    result.problems = await check_invariants(db)
    return result
