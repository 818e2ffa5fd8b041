"""The planner: which Ready jobs of one pool start this cycle, where, and why
each of the others waits.

`plan(snapshot)` is the one decision. The driver's scheduler reads a
snapshot of a pool, calls it, and starts the placements; ExplainJob reads
the same kind of snapshot and reports the reason the plan gives for one job.
Pure: no I/O, no clock (the snapshot carries `now_s`), no randomness
(attempt ids are the caller's).

A cycle, per pool (a paused pool places nothing: every job looked at waits
with POOL_PAUSED):
1. fair share: the pool's free cores water-filled over the users' ready
   demand (`fair_share.allocate_cores`; a user's demand is capped at what
   their queue's head can start under the quotas, `quota_room`, so that a
   user at a quota leaves their share to the others), and from it how many of each user's
   jobs the cycle looks at (`fair_share.scheduling_shares`, at least one per
   user with demand, so the head of every queue gets a real reason);
2. users in fair-share order (lowest running level, running cores / weight,
   first; a user's weight is `user_weight`); within a user,
   the jobs looked at are tried by priority, then by lock contention aged by
   waiting time (Ganeti's predictive queue, `lock_contention`), then by key;
3. each job is checked against the rules, in this order, and the first that
   stops it is its reason; a stopped job is skipped, not a barrier:
   - RETRY_DELAY: its last attempt exited with a code its retry policy
     retries, and the back-off before the next one has not passed;
   - BILLING_LIMIT_REACHED: its billing project is not open, or its worst
     case (`Candidate.reserve_micro_usd`, what schedule_jobs will reserve)
     does not fit in what the limit leaves once spend, open attempts'
     reservations and the jobs placed before it this cycle are counted; a
     job whose worst case exceeds what the limit leaves after the spend
     alone can never run, says so, and is listed in `Plan.never_fit` (the
     scheduler cancels it, saying why);
   - QUOTA_REACHED: its billing project's or its user's quota (an
     administrator's cap on running cores or running jobs, counted across
     every pool: `Snapshot.quotas`, `Snapshot.usage`) would be passed by
     what runs, what this cycle placed before it and the job itself;
   - BLOCKED_BY_LOCK: one of its locks clashes with a lock held by a running
     job, or by a job placed earlier in this cycle, of the same billing
     project (locks are named per project);
   - NO_CAPACITY_IN_REGIONS: no worker in its regions has room for its cores,
     memory and scratch storage (for a job that must run on demand: no
     on-demand worker; a job retried after a system error skips the worker
     where it happened, unless the pool has no other); the reason says what
     it waits for when the snapshot has the pool's machines
     (`runnable.machine_outlook`: one being created, one to come, or room on
     a pool at its max_instances);
   - OVER_FAIR_SHARE: its user's fair share of this cycle is used up;
4. a job placed goes first-fit onto the workers in order, takes their cores,
   memory and storage, and holds its locks for the jobs after it;
   all else equal, it goes to a worker that already holds its image (`_warm`);
5. the jobs of a user's queue beyond what the cycle looks at wait with
   QUEUED_BEHIND_OWN_JOBS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from services.policy.fair_share import UserDemand, allocate_cores, fair_share_order, scheduling_shares
from services.policy.lock_contention import (
    HeldLocks, Locks, LockRequest, aged_weight, static_weight,
)
from services.policy.runnable import PoolMachines, machine_outlook
from services.policy.sizes import binary_size

JobKey = tuple[int, int]
"""(batch_id, job_id)."""

POOL_PAUSED = "POOL_PAUSED"
RETRY_DELAY = "RETRY_DELAY"
BILLING_LIMIT_REACHED = "BILLING_LIMIT_REACHED"
QUOTA_REACHED = "QUOTA_REACHED"
BLOCKED_BY_LOCK = "BLOCKED_BY_LOCK"
NO_CAPACITY_IN_REGIONS = "NO_CAPACITY_IN_REGIONS"
OVER_FAIR_SHARE = "OVER_FAIR_SHARE"
QUEUED_BEHIND_OWN_JOBS = "QUEUED_BEHIND_OWN_JOBS"
JOBS_PER_CYCLE = 300
"""How many jobs a scheduling cycle looks at, over all users of a pool (the scheduler's default, and
ExplainJob's)."""
RULES = (POOL_PAUSED, RETRY_DELAY, BILLING_LIMIT_REACHED, QUOTA_REACHED, BLOCKED_BY_LOCK, NO_CAPACITY_IN_REGIONS,
         OVER_FAIR_SHARE)
"""The rules a job looked at is checked against, in order (module docstring)."""


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A Ready job the scheduler may start (not in a cancelled group, no failed parent unless always_run)."""

    key: JobKey
    user: str
    billing_project: str
    cores_mcpu: int
    memory_bytes: int = 0
    regions_bits: int | None = None
    """Bit i set: the job may run in region i; None: anywhere."""
    priority: int = 0
    created_s: float = 0.0
    """When the job was created (seconds, the clock of `Snapshot.now_s`): its age, for aging."""
    locks: Locks = dataclasses.field(default_factory=dict)
    reserve_micro_usd: int = 0
    """Its worst-case cost, reserved when it starts (0: its project has no limit): given, as the database
    prices it (job_worst_case_micro_usd, returned by read_ready_heads); the planner prices nothing."""
    on_demand: bool = False
    """It runs only on workers that are not preemptible."""
    avoid_worker: str | None = None
    """Its last attempt failed there for a system error: another worker takes it if the pool has one."""
    not_before_s: float | None = None
    """Its retry back-off: it waits until then (the clock of `Snapshot.now_s`)."""
    storage_bytes: int = 0
    """The scratch storage it reserves."""
    image_names: frozenset[str] = frozenset()
    """Names of its image (as its spec writes it, and normalised): a worker whose cache holds an image by one
    of them starts it sooner. Empty: not known."""


@dataclasses.dataclass(frozen=True)
class Worker:
    """A live worker of the pool, with what is free on it."""

    name: str
    region_id: int
    free_cores_mcpu: int
    free_memory_bytes: int | None = None
    """None: the worker did not say how much memory it has; memory is then not checked there."""
    preemptible: bool = False
    """A spot machine: jobs that must run on demand do not go there."""
    free_storage_bytes: int | None = None
    """Its scratch storage less what its open attempts reserved; None: the worker did not say how much it has,
    storage is then not checked there."""
    images: frozenset[str] = frozenset()
    """Names of the images its cache holds (references they were pulled as, digests), as it last reported."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """A billing project's standing."""

    state: str = "open"
    """open, closed or deleted."""
    limit_usd: float | None = None
    spend_usd: float = 0.0
    reserved_micro_usd: int = 0
    """What open attempts of the project reserved."""

    def left_micro_usd(self) -> float:
        """What the limit leaves (micro-USD), computed as schedule_jobs does; infinite without a limit."""
        if self.limit_usd is None:
            return float("inf")
        return self.limit_usd * 1000000 - self.spend_usd * 1000000 - self.reserved_micro_usd


QuotaKey = tuple[str, str]
"""('project', billing project) or ('user', username)."""


@dataclasses.dataclass(frozen=True)
class Quota:
    """An administrator's caps on what a billing project or a user runs across every pool (None: no cap)."""

    max_running_cores_mcpu: int | None = None
    max_running_jobs: int | None = None
    weight: int = 1
    """Its fair-share weight (services.policy.fair_share)."""
    set_by: str = ""


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a billing project or a user runs now across every pool (Creating and Running jobs)."""

    cores_mcpu: int = 0
    jobs: int = 0


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One pool as the scheduler sees it at the start of a cycle."""

    pool: str
    workers: Sequence[Worker]
    """Live workers, in the order first-fit tries them."""
    demands: Sequence[UserDemand]
    """Every user with Ready work in the pool: running and ready cores."""
    queues: Mapping[str, Sequence[Candidate]]
    """Per user, the head of their queue in priority-then-age order; at least `depths(...)[user]` long,
    or all of it."""
    held: Mapping[str, Mapping[Holder, Locks]] = dataclasses.field(default_factory=dict)
    """Per billing project, the locks of its running (and starting) jobs: by job, or by distinct lock
    (`HeldLock`, what the database's held_locks summary gives); the decisions are the same."""
    budgets: Mapping[str, Budget] = dataclasses.field(default_factory=dict)
    """Per billing project of a candidate; a project not here is open and unlimited."""
    jobs_per_cycle: int = JOBS_PER_CYCLE
    now_s: float = 0.0
    paused_by: str | None = None
    """Who paused the pool (None: it runs): then nothing is placed (POOL_PAUSED)."""
    quotas: Mapping[QuotaKey, Quota] = dataclasses.field(default_factory=dict)
    """The quotas of the candidates' projects and users; one not here has no cap."""
    usage: Mapping[QuotaKey, Usage] = dataclasses.field(default_factory=dict)
    """What each quota's project or user runs now, across every pool; one not here runs nothing."""
    machines: PoolMachines | None = None
    """The pool's machines (starting, active, its max_instances), so that a job finding no room is told what
    it waits for and whether it comes (`runnable.machine_outlook`); None: not read (the scheduler, which
    shows no reasons)."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """A job to start on a worker."""

    key: JobKey
    worker: str
    cores_mcpu: int


@dataclasses.dataclass(frozen=True)
class HeldLock:
    """The running jobs that hold one lock, counted, not named (the held_locks summary)."""

    level: str
    mode: str
    """As stored: shared, exclusive, unknown_shared, ..."""
    name: str
    """Empty for the level-wide modes."""
    n_holders: int


Holder = JobKey | HeldLock
"""Who holds a lock: a job, or the jobs holding one distinct lock."""


def _holders_text(holders: Sequence[Holder]) -> str:
    shown = [f"job {h[0]}/{h[1]}" if isinstance(h, tuple) else
             f"{h.n_holders} running job(s) ({h.mode}{' ' + h.name if h.name else ''})" for h in holders[:10]]
    return ", ".join(shown) + (", ..." if len(holders) > 10 else "")


def blocked_by_lock(level: str, request: LockRequest, holders: Sequence[Holder]) -> Wait:
    """BLOCKED_BY_LOCK: `request` at `level` clashes with what `holders` hold."""
    names = f" {', '.join(sorted(request.names))}" if request.names else ""
    return Wait(BLOCKED_BY_LOCK, f"needs {request.mode.value} lock at level {level}{names}, held by "
                                 f"{_holders_text(holders)}", tuple(holders), level)


@dataclasses.dataclass(frozen=True)
class Wait:
    """Why a job looked at (or not) was not placed this cycle."""

    code: str
    detail: str
    holders: tuple[Holder, ...] = ()
    """BLOCKED_BY_LOCK: who holds what it needs (jobs, or counted `HeldLock`s)."""
    level: str = ""
    """BLOCKED_BY_LOCK: the level of the clashing lock."""


@dataclasses.dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...]
    waits: Mapping[JobKey, Wait]
    """Every candidate of the snapshot that was not placed."""
    allocation: Mapping[str, int]
    """Each user's fair share of the pool's free cores this cycle (mcpu)."""
    never_fit: tuple[JobKey, ...] = ()
    """Jobs whose worst-case cost exceeds what their project's limit leaves after its spend alone: they can
    never run unless the limit is raised: the scheduler cancels them (cancel_unaffordable_jobs), saying why."""


def _cores(mcpu: int) -> str:
    return f"{mcpu / 1000:g}"


def depths(workers: Sequence[Worker], demands: Sequence[UserDemand], jobs_per_cycle: int) -> dict[str, int]:
    """How many jobs of each user's queue a cycle looks at: the user's share of `jobs_per_cycle`, and at
    least one for every user with ready work (the reason of a queue's head is always the planner's)."""
    return _depths(_allocation(workers, demands), demands, jobs_per_cycle)


def _allocation(workers: Sequence[Worker], demands: Sequence[UserDemand]) -> dict[str, int]:
    return allocate_cores(sum(max(0, w.free_cores_mcpu) for w in workers), demands)


def _depths(allocation: Mapping[str, int], demands: Sequence[UserDemand], jobs_per_cycle: int) -> dict[str, int]:
    shares = scheduling_shares(allocation, demands, total_jobs=jobs_per_cycle)
    return {d.user: max(1, shares.get(d.user, 0)) for d in demands if d.ready_cores_mcpu > 0}


def limit_reached(spend_usd: float, limit_usd: float | None) -> bool:
    """Whether a project that spent `spend_usd` has reached `limit_usd` (None: no limit): in whole
    micro-dollars rounded to the nearest, as the API shows both, so a spend that reads as the limit is at it.
    The SQL function billing_limit_reached is the rule the procedures apply; this is its copy, checked
    against it by tests/db/test_budgets.py."""
    return limit_usd is not None and round(spend_usd * 1000000) >= round(limit_usd * 1000000)


def _money(micro_usd: float) -> str:
    return f"${micro_usd / 1000000:.6f}"


def _budget_stop(job: Candidate, budget: Budget | None, placed_micro_usd: int) -> Wait | None:
    """The billing rule for `job`, with `placed_micro_usd` reserved by the project's jobs placed before it."""
    if budget is None:
        return None
    project = job.billing_project
    if budget.state != "open":
        return Wait(BILLING_LIMIT_REACHED, f"billing project {project} is {budget.state}")
    if budget.limit_usd is None:
        return None
    left = budget.left_micro_usd() - placed_micro_usd
    if limit_reached(budget.spend_usd, budget.limit_usd):
        return Wait(BILLING_LIMIT_REACHED, f"billing project {project} spent ${budget.spend_usd:.6f} of its "
                                           f"${budget.limit_usd:.6f} limit")
    if _never_fits(job, budget):
        return Wait(BILLING_LIMIT_REACHED,
                    f"the job can never run under the limit: it may cost up to {_money(job.reserve_micro_usd)} (its "
                    f"cores and memory for its timeout, or the project's longest job) and billing project {project} "
                    f"has {_money(max(0.0, budget.limit_usd * 1000000 - budget.spend_usd * 1000000))} of its "
                    f"${budget.limit_usd:.6f} limit left after its spend; raise the limit or give the job a "
                    "shorter timeout")
    if job.reserve_micro_usd > left:
        return Wait(BILLING_LIMIT_REACHED,
                    f"the job may cost up to {_money(job.reserve_micro_usd)} (its cores and memory for its timeout, "
                    f"or the project's longest job); billing project {project} has {_money(max(0.0, left))} of its "
                    f"${budget.limit_usd:.6f} limit left once spend (${budget.spend_usd:.6f}) and what running jobs "
                    "reserved are counted")
    return None


def _never_fits(job: Candidate, budget: Budget) -> bool:
    if budget.limit_usd is None:
        return False
    return job.reserve_micro_usd > budget.limit_usd * 1000000 - budget.spend_usd * 1000000


def _quota_keys(job: Candidate) -> tuple[QuotaKey, QuotaKey]:
    return ("project", job.billing_project), ("user", job.user)


def _quota_stop(job: Candidate, quotas: Mapping[QuotaKey, Quota], usage: Mapping[QuotaKey, Usage],
                placed: Mapping[QuotaKey, Usage]) -> Wait | None:
    """QUOTA_REACHED if what the project or the user runs (`usage`), plus what this cycle placed before the
    job (`placed`), plus the job, passes one of their caps: the project's first, cores before jobs."""
    for key in _quota_keys(job):
        quota = quotas.get(key)
        if quota is None:
            continue
        now, this_cycle = usage.get(key, Usage()), placed.get(key, Usage())
        whose = f"billing project {key[1]}" if key[0] == "project" else f"user {key[1]}"
        cap = quota.max_running_cores_mcpu
        if cap is not None and now.cores_mcpu + this_cycle.cores_mcpu + job.cores_mcpu > cap:
            return Wait(QUOTA_REACHED,
                        f"the quota of {whose} (set by {quota.set_by or '?'}) caps its running cores at {_cores(cap)}: "
                        f"it runs {_cores(now.cores_mcpu)} across every pool, {_cores(this_cycle.cores_mcpu)} start "
                        f"this cycle, and the job needs {_cores(job.cores_mcpu)}")
        cap = quota.max_running_jobs
        if cap is not None and now.jobs + this_cycle.jobs + 1 > cap:
            return Wait(QUOTA_REACHED,
                        f"the quota of {whose} (set by {quota.set_by or '?'}) caps its running jobs at {cap}: it runs "
                        f"{now.jobs} across every pool and {this_cycle.jobs} start this cycle")
    return None


def _count(placed: dict[QuotaKey, Usage], job: Candidate) -> None:
    for key in _quota_keys(job):
        was = placed.get(key, Usage())
        placed[key] = Usage(was.cores_mcpu + job.cores_mcpu, was.jobs + 1)


def quota_room(queue: Sequence[Candidate], quotas: Mapping[QuotaKey, Quota],
               usage: Mapping[QuotaKey, Usage]) -> int | None:
    """The cores of the jobs of one user's `queue` (as read) that the quotas would let start if the user
    were alone, or None when none of them is stopped by a quota (the user's demand is then not capped):
    the fair share gives a user no more than this, so a user at a quota leaves their share to others."""
    if not quotas:
        return None
    placed: dict[QuotaKey, Usage] = {}
    room, stopped = 0, False
    for job in queue:
        if _quota_stop(job, quotas, usage, placed) is not None:
            stopped = True
            continue
        _count(placed, job)
        room += job.cores_mcpu
    return room if stopped else None


def _lock_stop(job: Candidate, held: HeldLocks | None) -> Wait | None:
    if not job.locks or not held:
        return None
    for level, request in sorted(job.locks.items()):
        holders = held.blocking(level, request)
        if holders:
            return blocked_by_lock(level, request, holders)
    return None


def _allowed(job: Candidate, worker: Worker) -> bool:
    return job.regions_bits is None or bool((job.regions_bits >> worker.region_id) & 1)


@dataclasses.dataclass
class _Room:
    """What is still free on a worker as the cycle places jobs (memory or storage None: not checked there)."""

    cores_mcpu: int
    memory_bytes: int | None
    storage_bytes: int | None

    def fits(self, job: Candidate) -> bool:
        return (self.cores_mcpu >= job.cores_mcpu
                and (self.memory_bytes is None or self.memory_bytes >= job.memory_bytes)
                and (self.storage_bytes is None or self.storage_bytes >= job.storage_bytes))

    def take(self, job: Candidate) -> None:
        self.cores_mcpu -= job.cores_mcpu
        if self.memory_bytes is not None:
            self.memory_bytes -= job.memory_bytes
        if self.storage_bytes is not None:
            self.storage_bytes -= job.storage_bytes


def _and(items: Sequence[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join([", ".join(items[:-1]), items[-1]]) if len(items) > 1 else "".join(items)


def _eligible(job: Candidate, workers: Sequence[Worker]) -> list[Worker]:
    """The workers `job` may go to, in order: in its regions, on demand if it must be, and not the one it
    avoids while the pool has another."""
    allowed = [w for w in workers if _allowed(job, w) and not (job.on_demand and w.preemptible)]
    if job.avoid_worker is not None and any(w.name != job.avoid_worker for w in workers):
        allowed = [w for w in allowed if w.name != job.avoid_worker]
    return allowed


def _retry_stop(job: Candidate, now_s: float) -> Wait | None:
    if job.not_before_s is None or job.not_before_s <= now_s:
        return None
    return Wait(RETRY_DELAY, f"its last attempt exited with a code its retry policy retries; the next attempt "
                             f"waits {job.not_before_s - now_s:.1f} s more (exponential back-off with jitter)")


def lock_weight(locks: Locks, running_by_level: Mapping[str, Sequence[LockRequest]], age_s: float) -> float:
    """A job's place within its priority (lower is tried sooner): its contention weight against the locks
    running jobs of its project hold (`HeldLocks.by_level`), times its aging factor; 0 without locks. The
    scheduler orders by it, and the lock monitor (ListLocks) shows it."""
    if not locks:
        return 0.0
    return aged_weight(static_weight(locks, running_by_level), age_s)


def _order(queue: Sequence[Candidate], running: Mapping[str, HeldLocks], now_s: float,
           by_project: dict[str, dict[str, list[LockRequest]]]) -> list[Candidate]:
    """Priority first; within a priority the least contended (aged) first; then the queue's own order.
    `by_project` caches each project's running locks by level (each distinct lock once)."""

    def weight(job: Candidate) -> float:
        if not job.locks:
            return 0.0
        levels = by_project.get(job.billing_project)
        if levels is None:
            index = running.get(job.billing_project)
            levels = by_project[job.billing_project] = index.by_level() if index is not None else {}
        return lock_weight(job.locks, levels, now_s - job.created_s)

    position = {job.key: i for i, job in enumerate(queue)}
    return sorted(queue, key=lambda job: (-job.priority, weight(job), position[job.key]))


def plan(snapshot: Snapshot) -> Plan:
    """Placements for this cycle and, for every other candidate, the first rule that stopped it."""
    if snapshot.paused_by is not None:
        wait = Wait(POOL_PAUSED, f"pool {snapshot.pool} was paused by {snapshot.paused_by}: nothing new starts "
                                 "there until it is resumed")
        return Plan((), {job.key: wait for queue in snapshot.queues.values() for job in queue}, {}, ())
    first_fit = _plan(snapshot, prefer_holders=False)
    if not _warm(snapshot):
        return first_fit
    # A job goes to a worker holding its image only "all else equal": when that changes which worker, never
    # which jobs start or why the others wait. Going there can leave a worker too full for a later job that
    # first-fit would have placed; then the cycle is planned first-fit.
    preferring = _plan(snapshot, prefer_holders=True)
    return preferring if preferring.waits == first_fit.waits else first_fit


def user_weight(user: str, queue: Sequence[Candidate], quotas: Mapping[QuotaKey, Quota]) -> int:
    """A user's fair-share weight in a pool: their quota's weight times that of the billing project of the
    head of their queue (the job they would start next), each 1 without a quota."""
    weight = quotas[("user", user)].weight if ("user", user) in quotas else 1
    if queue and ("project", queue[0].billing_project) in quotas:
        weight *= quotas[("project", queue[0].billing_project)].weight
    return weight


def weighted(snapshot: Snapshot) -> list[UserDemand]:
    """The snapshot's demands, each with its user's weight (`user_weight`)."""
    if not snapshot.quotas:
        return list(snapshot.demands)
    return [dataclasses.replace(d, weight=user_weight(d.user, snapshot.queues.get(d.user, ()), snapshot.quotas))
            for d in snapshot.demands]


def _within_quotas(snapshot: Snapshot, demands: Sequence[UserDemand]) -> list[UserDemand]:
    """The users' demands, each capped at what their queue could start under the quotas (`quota_room`)."""
    if not snapshot.quotas:
        return list(demands)
    capped = []
    for d in demands:
        room = quota_room(snapshot.queues.get(d.user, ()), snapshot.quotas, snapshot.usage)
        capped.append(d if room is None else dataclasses.replace(d, ready_cores_mcpu=min(d.ready_cores_mcpu, room)))
    return capped


def _warm(snapshot: Snapshot) -> bool:
    """Whether some worker holds some candidate's image (else preferring holders changes nothing)."""
    held = frozenset().union(*(w.images for w in snapshot.workers))
    return bool(held) and any(not job.image_names.isdisjoint(held)
                              for queue in snapshot.queues.values() for job in queue)


def _plan(snapshot: Snapshot, prefer_holders: bool) -> Plan:
    """`plan`, each job going first-fit, or to the first worker with room that holds its image if
    `prefer_holders` (first-fit where none does)."""
    demands = weighted(snapshot)
    allocation = _allocation(snapshot.workers, _within_quotas(snapshot, demands))
    looked_at = _depths(allocation, demands, snapshot.jobs_per_cycle)
    handed_out = _cores(sum(allocation.values()))
    running_by_user = {d.user: d.running_cores_mcpu for d in demands}
    weight_of = {d.user: f" (fair-share weight {d.weight})" for d in demands if d.weight != 1}
    free = {w.name: _Room(w.free_cores_mcpu, w.free_memory_bytes, w.free_storage_bytes) for w in snapshot.workers}
    # The running jobs' locks, indexed (weights read them as they were; the rule's index also takes the
    # locks of the jobs this cycle places).
    running_locks = {p: HeldLocks(locks) for p, locks in snapshot.held.items()}
    held = {p: HeldLocks(locks) for p, locks in snapshot.held.items()}
    weights_cache: dict[str, dict[str, list[LockRequest]]] = {}
    placements: list[Placement] = []
    waits: dict[JobKey, Wait] = {}
    reserved: dict[str, int] = {}
    """Per project, what this cycle's placements reserve."""
    placed_usage: dict[QuotaKey, Usage] = {}
    """Per quota, what this cycle's placements run."""
    never_fit: list[JobKey] = []
    for user in fair_share_order(demands):
        queue = list(snapshot.queues.get(user, ()))
        depth = looked_at.get(user, 0)
        for n, job in enumerate(queue[depth:], start=depth):
            waits[job.key] = Wait(QUEUED_BEHIND_OWN_JOBS, f"{n} of {user}'s ready jobs in pool {snapshot.pool} "
                                                          "come first (higher priority, less contended or older)")
        used = 0
        share = allocation.get(user, 0)
        for job in _order(queue[:depth], running_locks, snapshot.now_s, weights_cache):
            project_held = held.setdefault(job.billing_project, HeldLocks())
            budget = snapshot.budgets.get(job.billing_project)
            stop = _retry_stop(job, snapshot.now_s) or _budget_stop(job, budget, reserved.get(job.billing_project, 0)) \
                or _quota_stop(job, snapshot.quotas, snapshot.usage, placed_usage) or _lock_stop(job, project_held)
            if stop is not None:
                waits[job.key] = stop
                if stop.code == BILLING_LIMIT_REACHED and budget is not None and budget.state == "open" \
                        and _never_fits(job, budget):
                    never_fit.append(job.key)
                continue
            eligible = _eligible(job, snapshot.workers)
            where = next((w for w in eligible if not job.image_names.isdisjoint(w.images) and free[w.name].fits(job)),
                         None) if prefer_holders and job.image_names else None
            where = where or next((w for w in eligible if free[w.name].fits(job)), None)
            if where is None:
                sizes = [f"{_cores(job.cores_mcpu)} cores"]
                sizes += [f"{binary_size(job.memory_bytes)} of memory"] if job.memory_bytes else []
                sizes += [f"{binary_size(job.storage_bytes)} of scratch storage"] if job.storage_bytes else []
                kind = " on-demand" if job.on_demand else ""
                avoid = f" (other than {job.avoid_worker}, where its last attempt failed)" if job.avoid_worker else ""
                waits[job.key] = Wait(NO_CAPACITY_IN_REGIONS,
                                      f"no live{kind} {snapshot.pool} worker{avoid} in the job's regions has "
                                      f"{_and(sizes)} free; {machine_outlook(snapshot.pool, snapshot.machines)}")
                continue
            if used + job.cores_mcpu > share:
                waits[job.key] = Wait(OVER_FAIR_SHARE,
                                      f"user {user} runs {_cores(running_by_user.get(user, 0))} cores of pool "
                                      f"{snapshot.pool}{weight_of.get(user, '')} and is given {_cores(share)} of "
                                      f"the {handed_out} cores handed out this cycle by fair share; others wait too")
                continue
            used += job.cores_mcpu
            reserved[job.billing_project] = reserved.get(job.billing_project, 0) + job.reserve_micro_usd
            _count(placed_usage, job)
            free[where.name].take(job)
            if job.locks:
                project_held.add(job.key, job.locks)
            placements.append(Placement(job.key, where.name, job.cores_mcpu))
    placed = {p.key for p in placements}
    for user, queue in snapshot.queues.items():  # queues of users without demand (a stale read)
        for job in queue:
            if job.key not in waits and job.key not in placed:
                waits[job.key] = Wait(OVER_FAIR_SHARE, f"user {user} has no ready demand in pool "
                                                       f"{snapshot.pool} by the fair-share counters yet")
    return Plan(tuple(placements), waits, allocation, tuple(never_fit))
