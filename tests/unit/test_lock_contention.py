"""Resource locks: Ganeti's contention table, weights, aging, conflicts and
the order of candidates (services/policy/lock_contention.py)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.policy.lock_contention import (
    BIG_LOCK,
    Candidate,
    HeldLocks,
    LockMode,
    LockRequest,
    aged_weight,
    blocking_jobs,
    conflicts,
    contention,
    locks_from_rows,
    order_candidates,
    running_locks_by_level,
    static_weight,
)

M = LockMode
SCHEMA = Path(__file__).resolve().parents[2] / "sql" / "migrations" / "0001_schema.sql"


def req(mode: LockMode, *names: str) -> LockRequest:
    return LockRequest(mode, frozenset(names))


# Ganeti's table transcribed from the design document (seed 001), row =
# the pending job's mode, column = the mode held by a running job; "3|0.3"
# reads "if the named sets intersect then 3 else 0.3".
GANETI_TABLE = """
                   NONE  SHARED  UNKNOWN_SHARED  ALL_SHARED  EXCLUSIVE  UNKNOWN_EXCLUSIVE  ALL_EXCLUSIVE
NONE               0     0       0               0           0          0                  0
SHARED             0.3   0       0               0           3|0.3      1.5                3
UNKNOWN_SHARED     0.3   0.3     0.3             0.3         1.5        1.5                3
ALL_SHARED         0.3   0.3     0.3             0.3         3          3                  3
EXCLUSIVE          0.5   3|0.5   1.5             3           3|0.5      1.5                3
UNKNOWN_EXCLUSIVE  0.5   1.5     1.5             3           1.5        1.5                3
ALL_EXCLUSIVE      0.5   3       3               3           3          3                  3
"""


def _cells() -> list[tuple[LockMode, LockMode, str]]:
    lines = GANETI_TABLE.strip().splitlines()
    columns = [M[c] for c in lines[0].split()]
    cells = []
    for line in lines[1:]:
        row, *values = line.split()
        cells += [(M[row], col, value) for col, value in zip(columns, values, strict=True)]
    return cells


def _example(mode: LockMode, names: frozenset[str]) -> LockRequest:
    return LockRequest(mode, names if mode.named else frozenset())


@pytest.mark.parametrize(("pending", "held", "expected"), _cells(), ids=lambda x: getattr(x, "name", x))
def test_ganeti_table_cell(pending: LockMode, held: LockMode, expected: str) -> None:
    hit, _, miss = expected.partition("|")
    overlapping = contention(_example(pending, frozenset("ab")), _example(held, frozenset("bc")))
    disjoint = contention(_example(pending, frozenset("a")), _example(held, frozenset("c")))
    assert overlapping == float(hit)
    assert disjoint == float(miss or hit)


def test_table_has_49_cells() -> None:
    assert len(_cells()) == 49


def test_from_db_knows_every_mode_the_schema_stores() -> None:
    enum = re.search(r"mode ENUM\(([^)]*)\)", SCHEMA.read_text())
    assert enum is not None
    stored = re.findall(r"'([a-z_]+)'", enum.group(1))
    assert {LockMode.from_db(m) for m in stored} == set(LockMode) - {M.NONE}
    with pytest.raises(ValueError):
        LockMode.from_db("SHARED")


def test_names_only_for_named_modes() -> None:
    with pytest.raises(ValueError):
        LockRequest(M.SHARED)
    with pytest.raises(ValueError):
        LockRequest(M.ALL_SHARED, frozenset({"x"}))
    assert LockRequest(M.UNKNOWN_EXCLUSIVE).names == frozenset()


def test_weights_on_an_idle_and_a_busy_system() -> None:
    job = {"node": req(M.SHARED, "n1"), "instance": req(M.EXCLUSIVE, "i1")}
    assert static_weight(job, {}) == pytest.approx(1 + 0.3 + 0.5)
    busy = {"node": [req(M.EXCLUSIVE, "n1")], "instance": [req(M.SHARED, "i2")]}
    assert static_weight(job, busy) == pytest.approx(1 + 3 + 0.5)
    assert static_weight({}, busy, base=2.0) == 2.0


def test_every_lock_at_five_levels_weighs_base_plus_15() -> None:
    levels = ["nodegroup", "instance", "node", "noderes", "network"]
    job = {level: req(M.ALL_EXCLUSIVE) for level in levels}
    running = {level: [req(M.ALL_EXCLUSIVE)] for level in levels}
    assert static_weight(job, running) == 1 + 15
    assert static_weight(job, running, base=0.5) == 0.5 + 15


def test_the_big_lock_weighs_base_plus_3_per_level_whatever_runs() -> None:
    assert static_weight(BIG_LOCK, {}, n_levels=5) == 1 + 15
    assert static_weight(BIG_LOCK, {"node": [req(M.SHARED, "a")]}, n_levels=5) == 1 + 15
    assert static_weight(BIG_LOCK, {"node": [], "net": []}) == 1 + 6
    # A running big lock is ALL_EXCLUSIVE at every level.
    assert static_weight({"node": req(M.SHARED, "a")}, {"*": [req(M.ALL_EXCLUSIVE)]}) == 1 + 3
    with pytest.raises(ValueError):
        static_weight({"*": req(M.ALL_SHARED)}, {})
    with pytest.raises(ValueError):
        static_weight({"a": req(M.UNKNOWN_SHARED), "b": req(M.UNKNOWN_SHARED)}, {}, n_levels=1)


def test_aging() -> None:
    assert aged_weight(10.0, 0) == 10.0
    assert aged_weight(10.0, 29.9) == 10.0
    assert aged_weight(10.0, 30) == pytest.approx(9.5)
    assert aged_weight(10.0, 300) == pytest.approx(5.0)
    assert aged_weight(10.0, 600) == 0.0
    assert aged_weight(10.0, 10**7) == 0.0
    assert aged_weight(10.0, -100) == 10.0
    assert aged_weight(4.0, 10, tick_s=5, k_ticks=4) == pytest.approx(2.0)


def test_conflicts_examples() -> None:
    assert not conflicts({"node": req(M.SHARED, "a")}, {"node": [req(M.SHARED, "a")]})
    assert conflicts({"node": req(M.SHARED, "a")}, {"node": [req(M.EXCLUSIVE, "a", "b")]})
    assert not conflicts({"node": req(M.EXCLUSIVE, "a")}, {"node": [req(M.EXCLUSIVE, "b")]})
    assert not conflicts({"node": req(M.EXCLUSIVE, "a")}, {"instance": [req(M.EXCLUSIVE, "a")]})
    assert conflicts({"node": req(M.UNKNOWN_SHARED)}, {"node": [req(M.EXCLUSIVE, "z")]})
    assert not conflicts({"node": req(M.UNKNOWN_SHARED)}, {"node": [req(M.ALL_SHARED)]})
    assert conflicts({"node": req(M.EXCLUSIVE, "a")}, {"node": [req(M.ALL_SHARED)]})
    # The big lock against anyone holding anything, and back.
    assert conflicts(BIG_LOCK, {"net": [req(M.SHARED, "x")]})
    assert not conflicts(BIG_LOCK, {"net": []})
    assert conflicts({"net": req(M.SHARED, "x")}, {"*": [req(M.ALL_EXCLUSIVE)]})
    assert not conflicts({}, {"*": [req(M.ALL_EXCLUSIVE)]})
    assert conflicts(BIG_LOCK, {"*": [req(M.ALL_EXCLUSIVE)]})


def test_blocking_jobs_and_running_locks_by_level() -> None:
    running = {
        (1, 1): {"node": req(M.EXCLUSIVE, "a")},
        (1, 2): {"node": req(M.SHARED, "b")},
        (2, 1): {"net": req(M.ALL_EXCLUSIVE)},
    }
    assert blocking_jobs({"node": req(M.EXCLUSIVE, "a", "b")}, running) == [(1, 1), (1, 2)]
    assert blocking_jobs({"node": req(M.SHARED, "b")}, running) == []
    by_level = running_locks_by_level(running.values())
    assert by_level == {"node": [req(M.EXCLUSIVE, "a"), req(M.SHARED, "b")], "net": [req(M.ALL_EXCLUSIVE)]}


def test_locks_from_rows() -> None:
    rows = [("node", "exclusive", "a"), ("node", "exclusive", "b"), ("net", "unknown_shared", ""),
            ("inst", "shared", "x"), ("inst", "exclusive", "y"), ("disk", "all_shared", ""),
            ("disk", "exclusive", "d")]
    assert locks_from_rows(rows) == {
        "node": req(M.EXCLUSIVE, "a", "b"),
        "net": req(M.UNKNOWN_SHARED),
        "inst": req(M.EXCLUSIVE, "x", "y"),  # two modes at one level: the stronger, conservatively
        "disk": req(M.ALL_EXCLUSIVE),
    }


def test_order_candidates_priority_then_weight_then_key_and_aging() -> None:
    running = {"node": [req(M.EXCLUSIVE, "busy")]}
    now = 10_000.0
    blocked = Candidate((1, 1), 0, {"node": req(M.EXCLUSIVE, "busy")}, ready_since_s=now)
    free = Candidate((1, 2), 0, {"node": req(M.EXCLUSIVE, "idle")}, ready_since_s=now)
    plain = Candidate((1, 3), 0, {}, ready_since_s=now)
    urgent = Candidate((1, 4), 5, {"node": req(M.EXCLUSIVE, "busy")}, ready_since_s=now)
    tie = Candidate((0, 9), 0, {}, ready_since_s=now)
    order = order_candidates([blocked, free, plain, urgent, tie], running, now)
    assert [c.job_key for c in order] == [(1, 4), (0, 9), (1, 3), (1, 2), (1, 1)]
    # After K ticks of waiting the blocked job weighs 0 and goes first.
    old = Candidate((1, 1), 0, blocked.locks, ready_since_s=now - 20 * 30)
    assert order_candidates([free, old], running, now)[0] is old


# ---------------------------------------------------------------- properties

LEVELS = ["l0", "l1", "l2", "l3", "l4"]
modes = st.sampled_from(list(LockMode))
name_sets = st.frozensets(st.sampled_from("abcd"), min_size=1, max_size=3)
requests = st.builds(_example, modes, name_sets)
named_requests = st.builds(_example, st.sampled_from([M.SHARED, M.EXCLUSIVE]), name_sets)
job_locks = st.dictionaries(st.sampled_from(LEVELS), requests, max_size=5)
running = st.dictionaries(st.sampled_from(LEVELS), st.lists(requests, max_size=4), max_size=5)
bases = st.floats(min_value=0, max_value=10)


@given(job_locks, running, bases)
def test_weight_is_between_base_and_the_worst_case(job: dict, held: dict, base: float) -> None:
    weight = static_weight(job, held, base=base)
    n_levels = len(set(job) | set(held))
    assert base <= weight <= base + 3 * n_levels


@given(job_locks, running, st.sampled_from(LEVELS), requests)
def test_a_new_running_lock_never_lowers_a_weight(job: dict, held: dict, level: str, extra: LockRequest) -> None:
    more = {**held, level: [*held.get(level, []), extra]}
    assert static_weight(job, more, n_levels=5) >= static_weight(job, held, n_levels=5)


@given(job_locks, running, st.sampled_from(LEVELS))
def test_none_contributes_nothing(job: dict, held: dict, level: str) -> None:
    with_none = {**job, level: LockRequest(M.NONE)}
    without = {k: v for k, v in job.items() if k != level}
    assert static_weight(with_none, held, n_levels=5) == static_weight(without, held, n_levels=5)


@given(st.floats(min_value=0, max_value=100), st.floats(min_value=0, max_value=10**6),
       st.floats(min_value=0, max_value=10**6), st.integers(min_value=1, max_value=100))
def test_aging_never_increases_and_ends_at_zero(weight: float, age1: float, age2: float, k: int) -> None:
    young, old = sorted((age1, age2))
    assert aged_weight(weight, old, k_ticks=k) <= aged_weight(weight, young, k_ticks=k) <= weight
    assert aged_weight(weight, 30.0 * k, k_ticks=k) == 0.0


@given(requests, requests, st.sampled_from(LEVELS))
def test_conflicts_is_symmetric(a: LockRequest, b: LockRequest, level: str) -> None:
    assert conflicts({level: a}, {level: [b]}) == conflicts({level: b}, {level: [a]})


@given(name_sets, name_sets)
def test_exclusive_exclusive_conflicts_iff_the_names_meet(a: frozenset, b: frozenset) -> None:
    x, y = LockRequest(M.EXCLUSIVE, a), LockRequest(M.EXCLUSIVE, b)
    assert conflicts({"l": x}, {"l": [y]}) == conflicts({"l": y}, {"l": [x]}) == bool(a & b)


@given(named_requests, named_requests)
def test_disjoint_named_sets_never_conflict(a: LockRequest, b: LockRequest) -> None:
    b = LockRequest(b.mode, frozenset(n.upper() for n in b.names))  # disjoint from a
    assert not conflicts({"l": a}, {"l": [b]})


@given(requests, requests)
def test_conflict_is_exactly_a_table_cell_of_at_least_1_5(a: LockRequest, b: LockRequest) -> None:
    """The reader/writer rules and Ganeti's table agree: every cell where the
    job would (maybe or surely) wait is a conflict, and no other."""
    assert conflicts({"l": a}, {"l": [b]}) == (contention(a, b) >= 1.5)


candidates = st.lists(
    st.builds(Candidate, st.tuples(st.integers(0, 3), st.integers(0, 50)), st.integers(-2, 2), job_locks,
              st.floats(min_value=0, max_value=2_000)),
    max_size=12, unique_by=lambda c: c.job_key,
)


@given(candidates, running, st.randoms(use_true_random=False))
def test_order_is_deterministic_and_by_priority_first(cands: list, held: dict, rnd: random.Random) -> None:
    order = order_candidates(cands, held, now_s=2_000.0)
    assert sorted(c.job_key for c in order) == sorted(c.job_key for c in cands)
    assert [c.priority for c in order] == sorted((c.priority for c in cands), reverse=True)
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    assert order_candidates(shuffled, held, now_s=2_000.0) == order


# Many jobs holding few distinct locks, some the big lock: the index answers as the plain functions do.
holders = st.lists(st.one_of(st.just(dict(BIG_LOCK)), job_locks), max_size=12)


@given(holders, st.sampled_from([*LEVELS, "*"]), requests)
def test_held_locks_answers_as_conflicts_does(jobs: list, level: str, request: LockRequest) -> None:
    if level == "*" and request.mode not in (M.NONE, M.ALL_EXCLUSIVE):
        request = BIG_LOCK["*"]
    running_jobs = {(1, i): locks for i, locks in enumerate(jobs)}
    index = HeldLocks(running_jobs)
    assert index.blocking(level, request) == blocking_jobs({level: request}, running_jobs)
    plain = running_locks_by_level(running_jobs.values())
    for job in ({level: request}, *jobs):
        assert static_weight(job, index.by_level(), n_levels=5) == static_weight(job, plain, n_levels=5)
