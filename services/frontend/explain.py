""""Why isn't my job running?" (ExplainJob, design §9) as a pure function.

`explain(facts)` turns what the database says about one job, its parents,
its group, its billing project, the locks held around it and its pool into
the reasons that currently apply, most decisive first: a reason that makes
the job wait for good (cancelled, a failed parent) comes before one that
passes by itself (parents still running), which comes before the
scheduler's reasons (billing limit, locks, capacity, fair share, the
user's own queue). No I/O here: `services.frontend.explain_store` gathers
the facts, the servicer turns the reasons into protos.

Fair share is the water-filling of `services.driver.fair_share` applied to
the pool's whole capacity: a user's share is what they would run if every
active core of the pool were handed out fairly over everybody's demand
(running plus ready). A user running at least their share waits while
others are below theirs.
"""

from __future__ import annotations

import dataclasses

from services.driver.fair_share import UserDemand, allocate_cores

FINAL_STATES = ("Success", "Failed", "Error", "Cancelled")
_STATE_BITS = {"Success": 1, "Failed": 2, "Error": 4, "Cancelled": 8}
JobKey = tuple[int, int]
"""(batch_id, job_id)."""


@dataclasses.dataclass(frozen=True)
class Parent:
    """One edge of the job: the parent's id and state, and what the edge accepts."""

    job_id: int
    state: str
    accepted_bits: int
    """1 = Success, 2 = Failed, 4 = Error, 8 = Cancelled."""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES

    @property
    def accepted(self) -> bool:
        return bool(_STATE_BITS.get(self.state, 0) & self.accepted_bits)


@dataclasses.dataclass(frozen=True)
class Cancelled:
    """The nearest cancelled group at or above the job's (0 = the batch)."""

    job_group_id: int
    cancelled_by: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Project:
    """The job's billing project."""

    name: str
    state: str
    """open, closed or deleted."""
    limit_usd: float | None
    spend_usd: float


@dataclasses.dataclass(frozen=True)
class LockConflict:
    """One of the job's locks and the running jobs whose locks clash with it."""

    level: str
    mode: str
    """The job's mode at that level, as stored (shared, exclusive, all_exclusive, ...)."""
    names: tuple[str, ...]
    holders: tuple[JobKey, ...]


@dataclasses.dataclass(frozen=True)
class Pool:
    """The job's instance collection as the scheduler would see it now."""

    name: str
    job_private: bool
    """A collection that makes one machine per job."""
    instances_with_room: int
    """Active instances in the job's regions with at least its cores free."""
    active_cores_mcpu: int
    """Cores of every active instance of the pool."""
    demands: tuple[UserDemand, ...]
    """Every user's running and (not cancelled) ready cores in the pool."""
    jobs_ahead: int
    """The user's runnable Ready jobs the scheduler takes before this one (bounded)."""
    jobs_ahead_capped: bool
    """jobs_ahead hit its bound: there are at least that many."""


@dataclasses.dataclass(frozen=True)
class JobFacts:
    """Everything explain() looks at."""

    batch_id: int
    job_id: int
    state: str
    """The jobs.state value: Pending, Ready, Creating, Running or a final state."""
    user: str
    always_run: bool
    dependency_failed: bool
    cores_mcpu: int
    regions: tuple[str, ...]
    """Names of the regions the job may run in; empty = any."""
    exit_code: int | None = None
    instance: str | None = None
    """Where the current attempt runs (Running, Creating)."""
    parents: tuple[Parent, ...] = ()
    cancelled: Cancelled | None = None
    project: Project | None = None
    lock_conflicts: tuple[LockConflict, ...] = ()
    pool: Pool | None = None


@dataclasses.dataclass(frozen=True)
class Reason:
    """One reason, in the terms of job_explanation.proto's WaitReasonCode."""

    code: str
    """The code's name without its prefix, e.g. WAITING_ON_PARENTS."""
    detail: str
    jobs: tuple[JobKey, ...] = ()
    lock: LockConflict | None = None
    regions: tuple[str, ...] = ()


def _cores(mcpu: int) -> str:
    return f"{mcpu / 1000:g}"


def _cancellation(facts: JobFacts) -> list[Reason]:
    c = facts.cancelled
    if c is None or facts.always_run:
        return []
    why = f" by {c.cancelled_by}" + (f": {c.reason}" if c.reason else "")
    if c.job_group_id == 0:
        return [Reason("BATCH_CANCELLED", f"batch {facts.batch_id} was cancelled{why}")]
    return [Reason("JOB_GROUP_CANCELLED", f"job group {c.job_group_id} was cancelled{why}")]


def _parents(facts: JobFacts) -> list[Reason]:
    reasons = []
    failed = [p for p in facts.parents if p.final and not p.accepted]
    if failed and not facts.always_run:
        shown = ", ".join(f"{p.job_id} ({p.state})" for p in failed[:10])
        reasons.append(Reason("PARENT_FAILED", f"parents ended in states their edge does not accept: {shown}",
                              tuple((facts.batch_id, p.job_id) for p in failed)))
    elif facts.dependency_failed and not facts.always_run:
        reasons.append(Reason("PARENT_FAILED", "a parent ended in a state its edge does not accept"))
    waiting = [p for p in facts.parents if not p.final]
    if waiting and facts.state == "Pending":
        shown = ", ".join(str(p.job_id) for p in waiting[:10]) + (", ..." if len(waiting) > 10 else "")
        reasons.append(Reason("WAITING_ON_PARENTS", f"{len(waiting)} parent(s) not final yet: {shown}",
                              tuple((facts.batch_id, p.job_id) for p in waiting)))
    return reasons


def _billing(project: Project | None) -> list[Reason]:
    if project is None:
        return []
    if project.state != "open":
        return [Reason("BILLING_LIMIT_REACHED", f"billing project {project.name} is {project.state}")]
    if project.limit_usd is not None and project.spend_usd >= project.limit_usd:
        return [Reason("BILLING_LIMIT_REACHED", f"billing project {project.name} spent ${project.spend_usd:.2f} "
                                                f"of its ${project.limit_usd:.2f} limit")]
    return []


def _locks(facts: JobFacts) -> list[Reason]:
    reasons = []
    for conflict in facts.lock_conflicts:
        held = ", ".join(f"{b}/{j}" for b, j in conflict.holders[:10])
        names = f" {', '.join(conflict.names)}" if conflict.names else ""
        reasons.append(Reason("BLOCKED_BY_LOCK", f"needs {conflict.mode} lock at level {conflict.level}{names}, "
                                                 f"held by running job(s) {held}", conflict.holders, conflict))
    return reasons


def fair_share_mcpu(pool: Pool, user: str) -> int:
    """The user's share of the pool's active cores, water-filled over everybody's demand."""
    demands = [UserDemand(d.user, 0, d.running_cores_mcpu + d.ready_cores_mcpu) for d in pool.demands]
    return allocate_cores(pool.active_cores_mcpu, demands).get(user, 0)


def _pool(facts: JobFacts) -> list[Reason]:
    pool = facts.pool
    if pool is None:
        return []
    reasons = []
    where = ", ".join(facts.regions) if facts.regions else "any region"
    if pool.job_private:
        reasons.append(Reason("NO_CAPACITY_IN_REGIONS", f"the job runs on a machine of its own in {where}; the "
                                                        "autoscaler creates it", regions=facts.regions))
        return reasons
    if pool.instances_with_room == 0:
        reasons.append(Reason("NO_CAPACITY_IN_REGIONS",
                              f"no active {pool.name} worker in {where} has {_cores(facts.cores_mcpu)} free "
                              "cores; the autoscaler adds machines while the pool has room",
                              regions=facts.regions))
    running = next((d.running_cores_mcpu for d in pool.demands if d.user == facts.user), 0)
    share = fair_share_mcpu(pool, facts.user)
    others_waiting = any(d.user != facts.user and d.ready_cores_mcpu > 0 for d in pool.demands)
    if others_waiting and running >= share and pool.active_cores_mcpu > 0:
        reasons.append(Reason("OVER_FAIR_SHARE", f"user {facts.user} runs {_cores(running)} cores of pool "
                                                 f"{pool.name}, fair share is {_cores(share)}"))
    if pool.jobs_ahead > 0:
        count = f"at least {pool.jobs_ahead}" if pool.jobs_ahead_capped else str(pool.jobs_ahead)
        reasons.append(Reason("QUEUED_BEHIND_OWN_JOBS", f"{count} of {facts.user}'s ready jobs in pool {pool.name} "
                                                        "come first (higher priority or older)"))
    return reasons


def explain(facts: JobFacts) -> list[Reason]:
    """Every reason that applies to the job now, most decisive first.

    A Ready job with nothing in its way gets no reason at all: the
    scheduler places it in its next cycle."""
    if facts.state in FINAL_STATES:
        code = f" with exit code {facts.exit_code}" if facts.exit_code is not None else ""
        return [Reason("FINISHED", f"the job ended {facts.state}{code}")]
    if facts.state == "Running":
        return [Reason("RUNNING", f"running on {facts.instance}" if facts.instance else "running")]
    if facts.state == "Creating":
        return [Reason("STARTING", f"its machine {facts.instance} is being created" if facts.instance
                       else "its machine is being created")]
    reasons = _cancellation(facts) + _parents(facts)
    if facts.state == "Ready" and not any(r.code in ("BATCH_CANCELLED", "JOB_GROUP_CANCELLED", "PARENT_FAILED")
                                          for r in reasons):
        reasons += _billing(facts.project) + _locks(facts) + _pool(facts)
    return reasons
