"""The scheduler: Ready jobs onto live workers, as the planner decides.

Each cycle, per pool (instance collection):
1. the live instances (only those whose worker has a session with this
   driver and takes jobs: `Dispatcher.live_instances`), with their free
   cores, memory and scratch storage;
2. the pool's snapshot (`services.db.plan_snapshot`): each user's queue as
   deep as the planner looks (read for every pool at once, at the start of
   the cycle), the candidates' locks and those their billing projects'
   running jobs hold, the projects' budgets (read for each pool in turn,
   after the previous pool's jobs started);
   the queues are kept for the next cycles while the demand read may be
   reused, until half of a queue has run or new work comes (`_KeptQueues`);
3. `services.policy.planner.plan`: the placements, and why every other
   candidate waits (ExplainJob reports the same reasons); jobs that can
   never run under their project's limit are cancelled, saying why;
4. SJ in bulk, one call for all the pool's instances, then a Run command
   per scheduled job down the worker's session. A worker that does not take its command in time gets
   the job unscheduled by the dead-worker path, never blocks the cycle.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from services.db.database import FailedPreconditionError, NotFoundError
from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.metrics import FAIR_SHARE_SECONDS, JOBS_SCHEDULED
from services.driver.store import DriverStore
from services.policy import planner
from services.policy.planner import depths
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
    run: Mapping[str, Any] | None = dataclasses.field(default=None, compare=False)
    """What the Run command needs of the job, as SJ returned it (spec_ref, memory_bytes, storage_bytes,
    timeout_ms, user, billing_project, trace_context, budget_timeout_ms); None: the dispatcher reads it."""


class Dispatcher(Protocol):
    """How the scheduler reaches workers (the session registry in production)."""

    def live_instances(self) -> set[str]:
        """Names of instances whose worker holds a session with this driver."""

    def images_held(self) -> Mapping[str, frozenset[str]]:
        """Per instance, the names of the images its worker's cache holds (none known: absent)."""

    async def run(self, placements: Sequence[Placement]) -> None:
        """Send the Run commands (never waits on one slow worker)."""


DEMAND_REUSE_S = 1.0
"""How long the driver's scheduler reuses a fair-share read (`Scheduler.demand_reuse_s`)."""


@dataclasses.dataclass
class _KeptQueues:
    """One pool's queues as `read_ready_heads` returned them, kept for the next cycles while the demand read
    may be reused (`demand_reuse_s`): a read of 300 candidates cost more than the cycle's SJ while each
    cycle placed a few dozen. Each cycle takes out the jobs it scheduled. A user's queue is read again once
    fewer than half the jobs the planner looks at are left, unless the read reached the queue's end; new
    work (a commit, released children, a cancellation: `new_work`) and age end them. SJ decides whether a
    kept candidate still runs: a placement it refuses (the job was cancelled or already ran, the instance
    went away) drops the pool's queues."""

    read_s: float
    """When they were read (time.monotonic)."""
    changes: int
    """Scheduler._changes before the read: new work since then ends them."""
    queues: dict[str, list[planner.Candidate]]
    ended: set[str]
    """Users whose read returned fewer jobs than asked: their whole queue is here."""

    def enough(self, user: str, depth: int) -> bool:
        """Whether the planner may look at this user's queue from here, `depth` deep."""
        queue = self.queues.get(user)
        return queue is not None and (user in self.ended or len(queue) >= max(1, (depth + 1) // 2))


class Scheduler(Loop):
    """See the module docstring."""

    name = "scheduler"

    def __init__(self, store: DriverStore, dispatcher: Dispatcher, epoch: Callable[[], int | None],
                 period_s: float = 1.0, jobs_per_cycle: int = planner.JOBS_PER_CYCLE,
                 clock_ms: Callable[[], int] = wall_clock_ms, demand_reuse_s: float = 0.0):
        super().__init__(period_s)
        self.demand_reuse_s = demand_reuse_s
        """How long a fair-share read (the demand) serves the cycles after it, kept up to date with the jobs
        they start (design §3: the fair-share result is cached for a few seconds); 0: every cycle reads it.
        `new_work` ends it early. The driver uses DEMAND_REUSE_S."""
        self._demand: dict[str, list[UserDemand]] | None = None
        self._demand_read_s = 0.0
        self._changes = 0
        """How many times new_work was called: a read that one overlapped is not reused."""
        self._kept: dict[str, _KeptQueues] = {}
        self.queue_reads = 0
        """Calls of read_ready_heads (for tests and the curious)."""
        self._store = store
        self._dispatcher = dispatcher
        self._epoch = epoch
        self._clock_ms = clock_ms
        self.jobs_per_cycle = jobs_per_cycle
        self.scheduled_total = 0
        self.last_plans: dict[str, planner.Plan] = {}
        """The last cycle's plan of each pool (for tests and the curious)."""
        self._placing: asyncio.Event | None = None
        """Set when the latest cycle ends (`placed`). Not `_cycle_done`: that is Loop's."""

    def new_work(self) -> None:
        """Work came or went outside this scheduler (a batch committed, children released, jobs cancelled):
        the next cycle, now, reads the demand afresh."""
        self._demand = None
        self._changes += 1
        self.notify()

    async def _read_demand(self) -> dict[str, list[UserDemand]]:
        now = time.monotonic()
        if self._demand is not None and now - self._demand_read_s < self.demand_reuse_s:
            return self._demand
        changes = self._changes
        demand = await self._store.read_demand()
        # Work that came while the read ran may not be in it: this cycle uses it, the next one reads again.
        self._demand = demand if self._changes == changes else None
        self._demand_read_s = now
        return demand

    def _started(self, pool: str, cores_by_user: dict[str, int]) -> None:
        """The demand read, as the jobs this cycle started in `pool` changed it."""
        self._shift(pool, cores_by_user, from_ready=True)

    def ended(self, jobs: Sequence[Mapping[str, Any]]) -> None:
        """Jobs whose attempts left Running for a final state (MJC's outcome rows: user, inst_coll,
        cores_mcpu): the demand read, if reused, no longer counts their cores as running, and the next
        cycle may place work on the cores they freed. A read running now may count them or not; the error,
        at most those cores, lasts until the next read (at most `demand_reuse_s`)."""
        by_pool: dict[str, dict[str, int]] = {}
        for job in jobs:
            users = by_pool.setdefault(job["inst_coll"], {})
            users[job["user"]] = users.get(job["user"], 0) + int(job["cores_mcpu"])
        for pool, cores_by_user in by_pool.items():
            self._shift(pool, {user: -cores for user, cores in cores_by_user.items()}, from_ready=False)
        self.notify()

    def _shift(self, pool: str, cores_by_user: dict[str, int], from_ready: bool) -> None:
        """Add cores to the users' running cores in the reused read of `pool` (never below 0), taking them
        from their Ready cores if `from_ready`."""
        if self._demand is None or pool not in self._demand:
            return
        self._demand[pool] = [
            UserDemand(d.user, max(0, d.running_cores_mcpu + cores_by_user.get(d.user, 0)),
                       max(0, d.ready_cores_mcpu - cores_by_user.get(d.user, 0)) if from_ready
                       else d.ready_cores_mcpu)
            for d in self._demand[pool]]

    async def cycle(self) -> None:
        done = self._placing = asyncio.Event()
        try:
            await self._place()
        finally:
            done.set()

    async def placed(self) -> None:
        """Return once the cycle under way, if any, has ended: the Run commands of what it placed are then
        queued on their workers' sessions. A cycle takes its live instances when it starts, so a worker that
        says it drains while one runs may still be given jobs by it (the servicer waits here before it
        acknowledges a Draining)."""
        if self._placing is not None:
            await self._placing.wait()

    async def _place(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        live = self._dispatcher.live_instances()
        held = self._dispatcher.images_held()
        workers = {pool: [dataclasses.replace(w, images=held.get(w.name, frozenset())) for w in ws
                          if w.name in live and w.free_cores_mcpu > 0]
                   for pool, ws in (await self._store.read_workers()).items()}
        workers = {pool: ws for pool, ws in workers.items() if ws}
        demand = await self._read_demand() if workers else {}
        looks = {pool: depths(ws, demand[pool], self.jobs_per_cycle)
                 for pool, ws in workers.items() if demand.get(pool)}
        try:
            queues = await self._queues(looks)
            placed = 0
            for pool in sorted(queues):
                placed += await self._schedule_pool(epoch, pool, workers[pool], demand[pool], queues[pool])
        except BaseException:
            self._kept.clear()  # what SJ did is not known
            raise
        self.scheduled_total += placed
        if placed:
            self.notify()  # there may be more to place on what is still free

    async def _queues(self, looks: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, list[planner.Candidate]]]:
        """Each pool's queues as deep as `looks`: kept from an earlier cycle where they are still enough
        (`_KeptQueues`), the other pools read in one call."""
        queues: dict[str, dict[str, list[planner.Candidate]]] = {}
        now = time.monotonic()
        for pool, depth_by_user in looks.items():
            kept = self._kept.get(pool)
            if (kept is not None and kept.changes == self._changes and now - kept.read_s < self.demand_reuse_s
                    and all(kept.enough(user, depth) for user, depth in depth_by_user.items() if depth > 0)):
                queues[pool] = {user: kept.queues.get(user, [])[:depth] for user, depth in depth_by_user.items()}
        unread = {pool: depth_by_user for pool, depth_by_user in looks.items() if pool not in queues}
        if unread:
            self.queue_reads += 1
            changes = self._changes
            for pool, read in (await self._store.read_queues(unread)).items():
                queues[pool] = read
                self._kept[pool] = _KeptQueues(
                    now, changes, {user: list(queue) for user, queue in read.items()},
                    {user for user, queue in read.items() if len(queue) < unread[pool].get(user, 0)})
        return queues

    async def _schedule_pool(self, epoch: int, pool: str, workers: list[planner.Worker],
                             demands: list[UserDemand], queues: dict[str, list[planner.Candidate]]) -> int:
        # Held locks and budgets are read now, after the previous pools' jobs started.
        snapshot = await self._store.snapshot_of(pool, workers, demands, queues, self.jobs_per_cycle,
                                                 self._clock_ms() / 1000)
        started = time.perf_counter()
        plan = planner.plan(snapshot)
        FAIR_SHARE_SECONDS.labels(pool).observe(time.perf_counter() - started)
        self.last_plans[pool] = plan
        if plan.never_fit:  # they would wait forever: cancelled, saying why
            n = await self._store.cancel_unaffordable_jobs(
                epoch, [{"batch_id": b, "job_id": j} for b, j in plan.never_fit])
            if n:
                log.info("scheduler: cancelled %d jobs of pool %s that can never run under their project's limit",
                         n, pool)
        placements = [Placement(p.key[0], p.key[1], secrets.token_hex(6), p.worker, p.cores_mcpu)
                      for p in plan.placements]
        scheduled = await self._schedule(epoch, placements)
        self._take_out(pool, placements, scheduled, bool(plan.never_fit))
        if scheduled:
            owners = {c.key: c.user for queue in queues.values() for c in queue}
            cores_by_user: dict[str, int] = {}
            for p in scheduled:
                user = owners[(p.batch_id, p.job_id)]
                cores_by_user[user] = cores_by_user.get(user, 0) + p.cores_mcpu
            self._started(pool, cores_by_user)
            try:
                await self._dispatcher.run(scheduled)
            except Exception as e:  # noqa: BLE001 - whatever stopped the Run commands, their attempts end now
                await self._never_sent(epoch, scheduled, e)
                raise
            JOBS_SCHEDULED.labels(pool).inc(len(scheduled))
        return len(scheduled)

    async def _never_sent(self, epoch: int, scheduled: Sequence[Placement], error: Exception) -> None:
        """End the attempts whose Run commands could not be made (a spec or a secret unreadable now) as
        system errors, so that their jobs run again at once: left open, each would wait for its worker to be
        declared gone, minutes later if the worker idles. Those that were sent run and report as usual: their
        end is recorded once, whichever comes first (MJC of an ended attempt changes nothing)."""
        log.warning("scheduler: the Run commands of %d attempts could not be sent (%s): ending them as system "
                    "errors", len(scheduled), error)
        now = self._clock_ms()
        message = f"its Run command could not be sent: {type(error).__name__}: {error}; not the job's failure"
        await self._store.mark_jobs_complete(epoch, None, [
            {"batch_id": p.batch_id, "job_id": p.job_id, "attempt_id": p.attempt_id, "instance_name": p.instance,
             "state": "Error", "exit_code": None, "error_message": message[:1000], "start_time_ms": None,
             "end_time_ms": now, "reason": "system_error", "cpu_time_ms": None, "peak_memory_bytes": None}
            for p in scheduled])

    def _take_out(self, pool: str, placements: Sequence[Placement], scheduled: Sequence[Placement],
                  cancelled: bool) -> None:
        """The pool's kept queues without the jobs just scheduled; none at all if SJ refused a placement or
        the cycle cancelled jobs."""
        kept = self._kept.get(pool)
        if kept is None:
            return
        if cancelled or len(scheduled) < len(placements):
            del self._kept[pool]
            return
        gone = {(p.batch_id, p.job_id) for p in scheduled}
        if gone:
            kept.queues = {user: [c for c in queue if c.key not in gone] for user, queue in kept.queues.items()}

    async def _schedule(self, epoch: int, placements: list[Placement]) -> list[Placement]:
        """SJ of the pool's placements, all its instances in one call; the scheduled ones, with what their Run
        commands need. An instance that went away since the snapshot refuses the whole call: then each
        instance is called alone, and only the refused one's jobs wait for the next cycle."""
        if not placements:
            return []
        try:
            return self._scheduled(placements, await self._store.schedule_jobs(epoch, None, [
                {"batch_id": p.batch_id, "job_id": p.job_id, "attempt_id": p.attempt_id, "instance_name": p.instance}
                for p in placements]))
        except (NotFoundError, FailedPreconditionError) as refused:
            if len({p.instance for p in placements}) == 1:
                log.info("scheduler: %s", refused.message)
                return []
        scheduled: list[Placement] = []
        for instance in sorted({p.instance for p in placements}):
            mine = [p for p in placements if p.instance == instance]
            try:
                scheduled += self._scheduled(mine, await self._store.schedule_jobs(epoch, instance, [
                    {"batch_id": p.batch_id, "job_id": p.job_id, "attempt_id": p.attempt_id} for p in mine]))
            except (NotFoundError, FailedPreconditionError) as refused:
                log.info("scheduler: %s", refused.message)
        return scheduled

    @staticmethod
    def _scheduled(placements: list[Placement], outcomes: list[Mapping[str, Any]]) -> list[Placement]:
        ok = {(o["batch_id"], o["job_id"]): o for o in outcomes if o["outcome"] == "scheduled"}
        return [dataclasses.replace(p, run=ok[(p.batch_id, p.job_id)]) for p in placements
                if (p.batch_id, p.job_id) in ok]
