"""The lock monitor's rules (services.policy.lock_monitor): who waits on a
lock is who the scheduler's conflict rule stops, counted by mode alone, and
waiters come in the planner's order."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.policy.lock_contention import BIG_LOCK, HeldLocks, LockMode, LockRequest, conflicts
from services.policy.lock_contention import running_locks_by_level
from services.policy.lock_monitor import Wanting, order_waiters, request, waiting_modes
from services.policy.planner import lock_weight

M = LockMode
LEVELS = ["l0", "l1", "*"]
NAMES = ["a", "b", ""]
rows = st.tuples(st.sampled_from(LEVELS[:2]), st.sampled_from([m for m in M if m is not M.NONE]),
                 st.sampled_from(NAMES[:2]))


def holder(entries: list[tuple[str, LockMode, str]]) -> dict[str, LockRequest]:
    locks: dict[str, LockRequest] = {}
    for level, mode, name in entries:
        locks[level] = request(level, mode, name)
    return locks


holders = st.lists(st.one_of(st.just(dict(BIG_LOCK)), st.lists(rows, min_size=1, max_size=3).map(holder)),
                   max_size=6)


@given(holders, st.sampled_from(LEVELS), st.sampled_from(NAMES))
def test_a_mode_waits_exactly_when_the_scheduler_would_stop_it(jobs: list, level: str, name: str) -> None:
    running = {(1, i): locks for i, locks in enumerate(jobs)}
    held = HeldLocks(running)
    waits = waiting_modes(held, level, name)
    for mode in ([M.ALL_EXCLUSIVE] if level == "*" else [m for m in M if m is not M.NONE]):
        if mode.named and not name:
            continue
        stopped = conflicts({level: request(level, mode, name)}, running_locks_by_level(running.values()))
        assert (mode in waits) == stopped


def test_waiters_in_the_planners_order() -> None:
    held = HeldLocks({(1, 1): {"db": LockRequest(M.SHARED, frozenset({"x"}))}})
    now_s = 10_000.0

    def wanting(job_id: int, mode: LockMode, priority: int = 0, age_s: float = 0.0, **more: LockRequest
                ) -> Wanting:
        locks = {"db": request("db", mode, "x"), **more}
        return Wanting((2, job_id), mode, priority, now_s - age_s, locks)

    other = LockRequest(M.EXCLUSIVE, frozenset({"q"}))
    jobs = [wanting(1, M.EXCLUSIVE), wanting(2, M.SHARED), wanting(3, M.EXCLUSIVE, priority=1),
            wanting(4, M.EXCLUSIVE, other=other), wanting(5, M.EXCLUSIVE, age_s=20 * 30.0, other=other)]
    order = order_waiters(jobs, held, "db", "x", now_s)
    # A shared need does not wait behind a shared holder; priority first; then the lighter weight (a second
    # lock weighs more; aged 20 ticks weighs 0); then the key.
    assert [w.key[1] for w in order] == [3, 5, 1, 4]
    assert [w.blocked_by for w in order] == [((1, 1),)] * 4
    by_level = held.by_level()
    assert [w.weight for w in order] == [lock_weight(j.locks, by_level, now_s - j.created_s)
                                         for j in (jobs[2], jobs[4], jobs[0], jobs[3])]
    assert order_waiters(jobs, held, "db", "x", now_s, limit=2) == order[:2]
