"""The driver's store: every SQL statement and procedure call of the driver, as named methods.

The loops and servicers of `services/driver/` reach the database only through a `DriverStore`, which
the wiring (`app.py`) builds on the pool and passes to each, as the frontend's wiring passes its
stores; `tests/unit/test_driver_store_boundary.py` fails on SQL anywhere else in the driver. It is

- the state machine's procedures, one method each (`services.db.store.JobStore`, which the frontend's
  submissions and the procedure tests call too);
- the planner's snapshot of a pool (`services.db.plan_snapshot`, the one read ExplainJob makes too);
- and the driver's own reads, by who makes them: the cancellers' (`cancellers.py`), those about
  machines (`instances.py`), those behind a worker's commands (`sessions.py`) and those behind
  callbacks and gauges (`reports.py`).

Each of the driver's own reads is one statement in autocommit, retried whole on deadlock like every
call (`Database.retrying`), under a name that labels its retries (`corral_db_retries`); of the
snapshot's, the demand read is one read-only transaction and the queues one call of `read_ready_heads`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from services.db import plan_snapshot
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore, wall_clock_ms
from services.driver.store.cancellers import CancellerReads, Drainable, StartedJob
from services.driver.store.instances import (InstanceReads, LiveInstance, PoolState, SeenInstance,
                                             WorkerCredentials)
from services.driver.store.reports import QueueLoad, ReportReads, WorkerCount
from services.driver.store.sessions import SealedSecret, SessionReads, UnstartedAttempt
from services.policy.fair_share import UserDemand
from services.policy.planner import Candidate, Snapshot, Worker

__all__ = ["DriverStore", "Drainable", "LiveInstance", "PoolState", "QueueLoad", "SealedSecret", "SeenInstance",
           "StartedJob", "UnstartedAttempt", "WorkerCount", "WorkerCredentials"]


class DriverStore(CancellerReads, InstanceReads, SessionReads, ReportReads, JobStore):
    """The driver's every database call (module docstring)."""

    @classmethod
    async def connect(cls, config: DatabaseConfig, clock_ms: Callable[[], int] = wall_clock_ms) -> DriverStore:
        """A store on a pool of its own (the election's: its renewals never queue behind the loops)."""
        return cls(await Database.connect(config), clock_ms)

    async def close(self) -> None:
        """Close the store's pool."""
        await self.db.close()

    async def lease_holder(self) -> str | None:
        """The driver holding a lease that has not run out by the database's clock, if any."""
        row = await self.db.fetchone("SELECT holder_name FROM leader_lease WHERE expires_at > UTC_TIMESTAMP(6)",
                                     name="leader_lease")
        return None if row is None else str(row["holder_name"] or "")

    # -- the scheduler's snapshot (services/db/plan_snapshot.py) -----------

    async def read_demand(self) -> dict[str, list[UserDemand]]:
        """Each pool's users with ready work, with their running and ready cores (`plan_snapshot.read_demand`)."""
        return await plan_snapshot.read_demand(self.db)

    async def read_workers(self) -> dict[str, list[Worker]]:
        """Active instances with free cores, by pool (`plan_snapshot.read_workers`)."""
        return await plan_snapshot.read_workers(self.db)

    async def read_queues(self, looks: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, list[Candidate]]]:
        """Per pool, each user's queue as deep as the planner looks there (`plan_snapshot.read_queues`)."""
        return await plan_snapshot.read_queues(self.db, looks)

    async def snapshot_of(self, pool: str, workers: Sequence[Worker], demands: Sequence[UserDemand],
                          queues: Mapping[str, Sequence[Candidate]], jobs_per_cycle: int, now_s: float) -> Snapshot:
        """The pool's snapshot from its queues: held locks and budgets, read now (`plan_snapshot.snapshot_of`)."""
        return await plan_snapshot.snapshot_of(self.db, pool, workers, demands, queues, jobs_per_cycle, now_s)
