"""The lock monitor's rules (ListLocks, `corral locks`), after Ganeti's lock
monitor: for one lock, which ready jobs wait for it, why, and in what order.

A lock is one (billing project, level, name), as `job_locks` stores it: a
name for SHARED and EXCLUSIVE, the empty name for a hold on the whole level
(ALL_* and UNKNOWN_*), and level `*` for the big lock. Running (and
starting) jobs hold their locks; a Ready job *waits* on one of its locks
when taking that lock alone would clash with a lock a running job of the
project holds (`HeldLocks.blocking`, the scheduler's rule, whether the
clashing lock is this one, a hold on the whole level or the big lock).
Waiters are ordered as the planner orders a queue: priority, then the aged
lock weight (`planner.lock_weight`), then (batch, job).

Pure: the caller reads the holders and the waiting jobs from the database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from services.policy.lock_contention import BIG_LOCK_LEVEL, HeldLocks, LockMode, LockRequest, Locks
from services.policy.planner import JobKey, lock_weight

MAX_WAITERS = 100
"""Waiters listed per lock (LockStatus.waiters); n_waiters counts them all."""
MAX_BLOCKED_BY = 10
"""Holders named per waiter (LockWaiter.blocked_by)."""


@dataclasses.dataclass(frozen=True)
class Wanting:
    """A Ready job's need of one lock: its `job_locks` row there, with what ordering it takes."""

    key: JobKey
    mode: LockMode
    priority: int
    created_s: float
    """When the job was created (the age aging counts from)."""
    locks: Locks
    """All its locks, by level (its weight depends on every one)."""


@dataclasses.dataclass(frozen=True)
class Waiting:
    """A job waiting on a lock, with its place in the order."""

    key: JobKey
    mode: LockMode
    priority: int
    created_s: float
    weight: float
    """`planner.lock_weight`: within a priority, lower is tried sooner."""
    blocked_by: tuple[JobKey, ...]
    """The first MAX_BLOCKED_BY running jobs whose locks clash with this one."""


def request(level: str, mode: LockMode, name: str) -> LockRequest:
    """What one `job_locks` row asks for on its own: the named lock, or the whole level."""
    if level == BIG_LOCK_LEVEL:
        return LockRequest(LockMode.ALL_EXCLUSIVE)
    return LockRequest(mode, frozenset({name}) if mode.named else frozenset())


def blockers(held: HeldLocks, level: str, mode: LockMode, name: str) -> list[JobKey]:
    """The running jobs (keys of `held`) that keep a job from taking this lock in `mode`, in `held`'s order."""
    return held.blocking(level, request(level, mode, name))  # type: ignore[return-value]


def waiting_modes(held: HeldLocks, level: str, name: str) -> frozenset[LockMode]:
    """The modes in which needing this lock means waiting now: a job's wait on a lock depends on nothing but
    the lock, its mode and the holders, so the waiters can be counted in the database by mode."""
    modes = [LockMode.ALL_EXCLUSIVE] if level == BIG_LOCK_LEVEL else [m for m in LockMode if m is not LockMode.NONE]
    return frozenset(m for m in modes if blockers(held, level, m, name))


def order_waiters(wanting: Iterable[Wanting], held: HeldLocks, level: str, name: str, now_s: float,
                  limit: int = MAX_WAITERS) -> list[Waiting]:
    """Of the jobs needing this lock, those that wait, in the planner's order (priority, aged lock weight,
    key), at most `limit`."""
    by_level = held.by_level()
    waiting = []
    for job in wanting:
        blocking = blockers(held, level, job.mode, name)
        if blocking:
            waiting.append(Waiting(job.key, job.mode, job.priority, job.created_s,
                                   lock_weight(job.locks, by_level, now_s - job.created_s),
                                   tuple(blocking[:MAX_BLOCKED_BY])))
    waiting.sort(key=lambda w: (-w.priority, w.weight, w.key))
    return waiting[:limit]
