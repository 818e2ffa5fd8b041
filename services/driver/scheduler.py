"""The scheduler: Ready jobs onto live workers, as the planner decides.

Each cycle, per pool (instance collection):
1. the live instances (only those whose worker has a session with this
   driver and takes jobs: `Dispatcher.live_instances`), with their free
   cores, memory and scratch storage;
2. the pool's snapshot (`services.db.plan_snapshot`): each user's queue as
   deep as the planner looks, the candidates' locks and those their billing
   projects' running jobs hold, the projects' budgets;
3. `services.policy.planner.plan`: the placements, and why every other
   candidate waits (ExplainJob reports the same reasons); jobs that can
   never run under their project's limit are cancelled, saying why;
4. SJ in bulk per instance, then a Run command per scheduled job down the
   worker's session. A worker that does not take its command in time gets
   the job unscheduled by the dead-worker path, never blocks the cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Protocol

from services.db.database import Database
from services.db.plan_snapshot import read_demand, read_snapshot, read_workers
from services.db.store import JobStore, wall_clock_ms
from services.driver.loop import Loop
from services.policy import planner
from services.policy.fair_share import UserDemand

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    """A job put on an instance under a new attempt."""

    batch_id: int
    job_id: int
    attempt_id: str
    instance: str
    cores_mcpu: int


class Dispatcher(Protocol):
    """How the scheduler reaches workers (the session registry in production)."""

    def live_instances(self) -> set[str]:
        """Names of instances whose worker holds a session with this driver."""

    async def run(self, placements: Sequence[Placement]) -> None:
        """Send the Run commands (never waits on one slow worker)."""


class Scheduler(Loop):
    """See the module docstring."""

    name = "scheduler"

    def __init__(self, db: Database, store: JobStore, dispatcher: Dispatcher, epoch: Callable[[], int | None],
                 period_s: float = 1.0, jobs_per_cycle: int = planner.JOBS_PER_CYCLE, clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._db = db
        self._store = store
        self._dispatcher = dispatcher
        self._epoch = epoch
        self._clock_ms = clock_ms
        self.jobs_per_cycle = jobs_per_cycle
        self.scheduled_total = 0
        self.last_plans: dict[str, planner.Plan] = {}
        """The last cycle's plan of each pool (for tests and the curious)."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        live = self._dispatcher.live_instances()
        workers = {pool: [w for w in ws if w.name in live and w.free_cores_mcpu > 0]
                   for pool, ws in (await read_workers(self._db)).items()}
        workers = {pool: ws for pool, ws in workers.items() if ws}
        placed = 0
        demand = await read_demand(self._db) if workers else {}
        for pool in sorted(workers):
            placed += await self._schedule_pool(epoch, pool, workers[pool], demand.get(pool, []))
        self.scheduled_total += placed
        if placed:
            self.notify()  # there may be more to place on what is still free

    async def _schedule_pool(self, epoch: int, pool: str, workers: list[planner.Worker],
                             demands: list[UserDemand]) -> int:
        if not demands:
            return 0
        snapshot = await read_snapshot(self._db, pool, workers, demands, self.jobs_per_cycle,
                                       self._clock_ms() / 1000)
        plan = planner.plan(snapshot)
        self.last_plans[pool] = plan
        if plan.never_fit:  # they would wait forever: cancelled, saying why
            n = await self._store.cancel_unaffordable_jobs(
                epoch, [{"batch_id": b, "job_id": j} for b, j in plan.never_fit])
            if n:
                log.info("scheduler: cancelled %d jobs of pool %s that can never run under their project's limit",
                         n, pool)
        placements = [Placement(p.key[0], p.key[1], secrets.token_hex(6), p.worker, p.cores_mcpu)
                      for p in plan.placements]
        scheduled: list[Placement] = []
        for instance in sorted({p.instance for p in placements}):
            mine = [p for p in placements if p.instance == instance]
            outcomes = await self._store.schedule_jobs(
                epoch, instance, [{"batch_id": p.batch_id, "job_id": p.job_id, "attempt_id": p.attempt_id}
                                  for p in mine])
            ok = {(o["batch_id"], o["job_id"]) for o in outcomes if o["outcome"] == "scheduled"}
            scheduled += [p for p in mine if (p.batch_id, p.job_id) in ok]
        if scheduled:
            await self._dispatcher.run(scheduled)
        return len(scheduled)
