"""The scheduler: Ready jobs onto live workers, fairly between users.

Each cycle, per pool (instance collection):
1. the live instances with free cores (only those whose worker has a session
   with this driver: `Dispatcher.live_instances`);
2. fair share: the pool's free cores water-filled over users' ready demand
   (the `user_inst_coll_fair_share` view, which already ignores cancelled
   groups), turned into a number of jobs per user for this cycle;
3. for each user in fair-share order, their Ready jobs that may run (not in a
   cancelled group and no failed dependency, unless always_run), by
   priority then age, as many as fit in the user's allocated cores, placed
   first-fit onto instances in the job's regions;
4. SJ in bulk per instance, then a Run command per scheduled job down the
   worker's session. A worker that does not take its command in time gets
   the job unscheduled by the dead-worker path, never blocks the cycle.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from services.db.database import Database
from services.db.store import JobStore
from services.driver.fair_share import UserDemand, allocate_cores, fair_share_order, scheduling_shares
from services.driver.loop import Loop


@dataclasses.dataclass(frozen=True)
class LiveInstance:
    """An instance with a worker session, as the scheduler sees it."""

    name: str
    inst_coll: str
    region_id: int
    free_cores_mcpu: int


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


_INSTANCES = """
SELECT i.name, i.inst_coll, COALESCE(r.region_id, 0) AS region_id, i.free_cores_mcpu
FROM instances i LEFT JOIN regions r ON r.name = i.region
WHERE i.state = 'active' AND i.free_cores_mcpu > 0
"""

# Every pool at once: the view sums every counter row before any filter on
# the pool applies (the benchmark measured 27 ms for one pool, 31 ms for all
# three), so the scheduler reads it once per cycle, not once per pool. It is
# not cached across cycles, as the design suggests: newly Ready work (the
# next link of a chain) would wait for the cache to expire.
_DEMAND = """
SELECT user, inst_coll, n_ready_jobs, ready_cores_mcpu, running_cores_mcpu FROM user_inst_coll_fair_share
"""


async def read_demand(db: Database) -> dict[str, list[UserDemand]]:
    """Each pool's users that have ready work, with their running and ready cores."""
    by_pool: dict[str, list[UserDemand]] = {}
    for r in await db.fetchall(_DEMAND, name="scheduler_demand"):
        if int(r["ready_cores_mcpu"]) > 0 or int(r["n_ready_jobs"]) > 0:
            by_pool.setdefault(r["inst_coll"], []).append(
                UserDemand(r["user"], int(r["running_cores_mcpu"]), int(r["ready_cores_mcpu"])))
    return by_pool

# The Ready jobs of one user's running batches in one pool that may run now.
_CANDIDATES = """
SELECT j.batch_id, j.job_id, j.cores_mcpu, j.regions_bits, j.priority
FROM batches b
JOIN jobs j ON j.batch_id = b.batch_id AND j.state = 'Ready' AND j.inst_coll = %s
WHERE b.user = %s AND b.state = 'running'
  AND (j.always_run OR (NOT j.dependency_failed AND NOT EXISTS (
        SELECT 1 FROM job_group_self_and_ancestors a
        JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id
        WHERE a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id)))
ORDER BY j.priority DESC, j.batch_id, j.job_id
LIMIT %s
"""


def within(candidates: Sequence[dict[str, Any]], budget_mcpu: int) -> list[dict[str, Any]]:
    """The candidates, in order, whose cores fit in the user's fair-share
    allocation; a job too big for what is left is skipped, not a barrier
    (a job bigger than any machine must not block the user's queue)."""
    taken, used = [], 0
    for job in candidates:
        if used + job["cores_mcpu"] > budget_mcpu:
            continue
        used += job["cores_mcpu"]
        taken.append(job)
    return taken


def fit(candidates: Sequence[dict[str, Any]], instances: list[LiveInstance]) -> list[Placement]:
    """First-fit of jobs (in order) onto instances with enough free cores in an allowed region."""
    free = {i.name: i.free_cores_mcpu for i in instances}
    placements = []
    for job in candidates:
        for instance in instances:
            allowed = job["regions_bits"] is None or (int(job["regions_bits"]) >> instance.region_id) & 1
            if allowed and free[instance.name] >= job["cores_mcpu"]:
                free[instance.name] -= job["cores_mcpu"]
                placements.append(Placement(job["batch_id"], job["job_id"], secrets.token_hex(6), instance.name,
                                            job["cores_mcpu"]))
                break
    return placements


class Scheduler(Loop):
    """See the module docstring."""

    name = "scheduler"

    def __init__(self, db: Database, store: JobStore, dispatcher: Dispatcher, epoch: Callable[[], int | None],
                 period_s: float = 1.0, jobs_per_cycle: int = 300):
        super().__init__(period_s)
        self._db = db
        self._store = store
        self._dispatcher = dispatcher
        self._epoch = epoch
        self.jobs_per_cycle = jobs_per_cycle
        self.scheduled_total = 0

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        live = self._dispatcher.live_instances()
        instances = [LiveInstance(**row) for row in await self._db.fetchall(_INSTANCES, name="scheduler_instances")
                     if row["name"] in live]
        placed = 0
        demand = await read_demand(self._db) if instances else {}
        for inst_coll in sorted({i.inst_coll for i in instances}):
            placed += await self._schedule_pool(epoch, inst_coll, [i for i in instances if i.inst_coll == inst_coll],
                                                demand.get(inst_coll, []))
        self.scheduled_total += placed
        if placed:
            self.notify()  # there may be more to place on what is still free

    async def _schedule_pool(self, epoch: int, inst_coll: str, instances: list[LiveInstance],
                             demands: list[UserDemand]) -> int:
        if not demands:
            return 0
        allocation = allocate_cores(sum(i.free_cores_mcpu for i in instances), demands)
        shares = scheduling_shares(allocation, demands, total_jobs=self.jobs_per_cycle)
        placements: list[Placement] = []
        for user in fair_share_order(demands):
            if shares.get(user, 0) <= 0:
                continue
            candidates = await self._db.fetchall(_CANDIDATES, (inst_coll, user, shares[user]),
                                                 name="scheduler_candidates")
            new = fit(within(candidates, allocation.get(user, 0)), instances)
            placements += new
            used: dict[str, int] = {}
            for p in new:
                used[p.instance] = used.get(p.instance, 0) + p.cores_mcpu
            # What later users can still use.
            instances = [dataclasses.replace(i, free_cores_mcpu=i.free_cores_mcpu - used.get(i.name, 0))
                         for i in instances]
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
