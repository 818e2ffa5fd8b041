""""Why isn't my job running?" (ExplainJob, design §9) as a pure function.

`explain(facts)` turns what the database says about one job, its parents,
its group and what the planner decided for it into the reasons that
currently apply, most decisive first: a reason that makes the job wait for
good (cancelled, a failed parent) comes before one that passes by itself
(parents still running), which comes before the scheduler's. No I/O here:
`services.frontend.explain_store` gathers the facts, the servicer turns the
reasons into protos.

The scheduler's reason is the planner's (`services.policy.planner`): the
store reads the job's pool as the scheduler does and asks `plan` the same
question the scheduler asks, so ExplainJob says why the scheduler would not
start the job now (billing limit, a lock and its holders, no room, fair
share, the user's own queue), or nothing when the next cycle starts it.
Before the planner, the store asks `services.policy.runnable.never_runs`
whether any machine of the deployment can ever run the job (a job accepted
before the deployment changed): then the reason is CANNOT_RUN, saying why.
"""

from __future__ import annotations

import dataclasses
import datetime

from services.policy.planner import BLOCKED_BY_LOCK, Wait

FINAL_STATES = ("Success", "Failed", "Error", "Cancelled")
_STATE_BITS = {"Success": 1, "Failed": 2, "Error": 4, "Cancelled": 8}
JobKey = tuple[int, int]
"""(batch_id, job_id)."""
STATE_WORDS = {"Pending": "pending", "Ready": "ready", "Creating": "creating", "Running": "running",
               "Success": "succeeded", "Failed": "failed", "Error": "error", "Cancelled": "cancelled"}
"""A jobs.state value as the CLI and the API's JobState name it (JOB_STATE_SUCCEEDED is `succeeded`): a reason
says a state in the words shown beside it, never the column's own ("the job ended Success")."""


def state_word(state: str) -> str:
    return STATE_WORDS.get(state, state.lower())


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
class Held:
    """The hold that keeps the job from being scheduled: its own, or its nearest held group's (0 = the
    batch)."""

    job_group_id: int | None
    """None: the job itself is held."""
    held_by: str
    time_held_ms: int


@dataclasses.dataclass(frozen=True)
class LockConflict:
    """One of the job's locks and the running jobs whose locks clash with it."""

    level: str
    mode: str
    """The job's mode at that level, as stored (shared, exclusive, all_exclusive, ...)."""
    names: tuple[str, ...]
    holders: tuple[JobKey, ...]


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """What the planner decided for a Ready job."""

    wait: Wait | None = None
    """Why the scheduler's next cycle would not start it; None: it would."""
    lock: LockConflict | None = None
    """BLOCKED_BY_LOCK: the job's own lock at the clashing level, and its holders."""
    never: str | None = None
    """Why no collection of the deployment can ever run it as it stands (`services.policy.runnable.never_runs`:
    the deployment changed since it was accepted); the planner is not asked then."""


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
    end_reason: str | None = None
    """Why the control plane ended the job, when no attempt says (e.g. it could never run under its limit)."""
    instance: str | None = None
    """Where the current attempt runs (Running, Creating)."""
    parents: tuple[Parent, ...] = ()
    cancelled: Cancelled | None = None
    held: Held | None = None
    scheduling: Scheduling | None = None


@dataclasses.dataclass(frozen=True)
class Reason:
    """One reason, in the terms of job_explanation.proto's WaitReasonCode."""

    code: str
    """The code's name without its prefix, e.g. WAITING_ON_PARENTS."""
    detail: str
    jobs: tuple[JobKey, ...] = ()
    lock: LockConflict | None = None
    regions: tuple[str, ...] = ()


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
        shown = ", ".join(f"{p.job_id} ({state_word(p.state)})" for p in failed[:10])
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


def _scheduling(facts: JobFacts) -> list[Reason]:
    scheduling = facts.scheduling
    if scheduling is None:
        return []
    if scheduling.never is not None:
        return [Reason("CANNOT_RUN", scheduling.never)]  # `corral job`: "why: cannot run: ..."
    wait = scheduling.wait
    if wait is None:
        return []
    regions = facts.regions if wait.code == "NO_CAPACITY_IN_REGIONS" else ()
    lock = scheduling.lock if wait.code == BLOCKED_BY_LOCK else None
    return [Reason(wait.code, wait.detail, wait.holders, lock, regions)]


def _hold(facts: JobFacts) -> list[Reason]:
    h = facts.held
    if h is None or (facts.cancelled is not None and not facts.always_run):  # a cancelled job is not coming back
        return []
    when = datetime.datetime.fromtimestamp(h.time_held_ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC")
    what = ("the job" if h.job_group_id is None else f"batch {facts.batch_id}" if h.job_group_id == 0
            else f"job group {h.job_group_id}")
    return [Reason("HELD", f"{what} was held by {h.held_by} at {when}; it is not scheduled until released")]


def explain(facts: JobFacts) -> list[Reason]:
    """Every reason that applies to the job now, most decisive first.

    A Ready job with nothing in its way gets no reason at all: the
    scheduler places it in its next cycle."""
    if facts.state in FINAL_STATES:
        code = f" with exit code {facts.exit_code}" if facts.exit_code is not None else ""
        why = f": {facts.end_reason}" if facts.end_reason else ""
        return [Reason("FINISHED", f"the job ended {state_word(facts.state)}{code}{why}")]
    if facts.state == "Running":
        return [Reason("RUNNING", f"running on {facts.instance}" if facts.instance else "running")]
    if facts.state == "Creating":
        return [Reason("STARTING", f"its machine {facts.instance} is being created" if facts.instance
                       else "its machine is being created")]
    reasons = _cancellation(facts) + _hold(facts) + _parents(facts)
    if facts.state == "Ready" and not any(r.code in ("BATCH_CANCELLED", "JOB_GROUP_CANCELLED", "PARENT_FAILED",
                                                     "HELD") for r in reasons):
        reasons += _scheduling(facts)
    return reasons
