"""Fair share: the water-filling allocation of free cores and the job shares
of the scheduler and the canceller (services/policy/fair_share.py)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.policy.fair_share import (
    UserDemand,
    allocate_cores,
    cancel_shares,
    fair_share_order,
    scheduling_shares,
    water_level,
)

# ---------------------------------------------------------------- examples


def test_rfc_narrative() -> None:
    """The cancellation RFC's description, step by step: the user with the
    fewest running cores is topped up to the next user's level, then both
    rise together, and so on."""
    demands = [
        UserDemand("a", running_cores_mcpu=0, ready_cores_mcpu=100_000),
        UserDemand("b", running_cores_mcpu=4_000, ready_cores_mcpu=100_000),
        UserDemand("c", running_cores_mcpu=10_000, ready_cores_mcpu=100_000),
    ]
    # 4 cores: all to a, who reaches b's level.
    assert allocate_cores(4_000, demands) == {"a": 4_000, "b": 0, "c": 0}
    # 12 more: a and b rise together to c's level (10 cores each).
    assert allocate_cores(16_000, demands) == {"a": 10_000, "b": 6_000, "c": 0}
    # 6 more: all three rise by 2 cores.
    assert allocate_cores(22_000, demands) == {"a": 12_000, "b": 8_000, "c": 2_000}


def test_demand_caps_and_the_rest_goes_to_others() -> None:
    demands = [UserDemand("small", 0, 1_000), UserDemand("big", 0, 50_000)]
    assert allocate_cores(10_000, demands) == {"small": 1_000, "big": 9_000}


def test_users_without_demand_are_present_with_zero() -> None:
    demands = [UserDemand("idle", 0, 0), UserDemand("busy", 8_000, 0), UserDemand("w", 0, 3_000)]
    assert allocate_cores(10_000, demands) == {"idle": 0, "busy": 0, "w": 3_000}


def test_remainders_go_one_mcpu_at_a_time_by_name() -> None:
    demands = [UserDemand(u, 0, 10) for u in ("c", "a", "b")]
    assert allocate_cores(8, demands) == {"a": 3, "b": 3, "c": 2}


def test_no_free_cores_and_no_users() -> None:
    assert allocate_cores(0, [UserDemand("a", 0, 5)]) == {"a": 0}
    assert allocate_cores(1_000, []) == {}


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError):
        UserDemand("a", -1, 0)
    with pytest.raises(ValueError):
        allocate_cores(-1, [])
    with pytest.raises(ValueError):
        allocate_cores(10, [UserDemand("a", 0, 1), UserDemand("a", 0, 2)])


def test_scheduling_shares_are_proportional_with_a_minimum_of_one() -> None:
    demands = [UserDemand("a", 0, 10**6), UserDemand("b", 0, 10**6), UserDemand("c", 0, 0)]
    shares = scheduling_shares({"a": 299_000, "b": 1_000, "c": 0}, demands, total_jobs=300)
    assert shares == {"a": 299, "b": 1, "c": 0}
    shares = scheduling_shares({"a": 2_000, "b": 1_000, "c": 0}, demands, total_jobs=300)
    assert shares == {"a": 200, "b": 100, "c": 0}


def test_scheduling_shares_when_users_outnumber_jobs_go_in_fair_share_order() -> None:
    demands = [UserDemand("a", 5_000, 1), UserDemand("b", 0, 1), UserDemand("c", 1_000, 1)]
    assert fair_share_order(demands) == ["b", "c", "a"]
    assert scheduling_shares({"a": 1, "b": 1, "c": 1}, demands, total_jobs=2) == {"a": 0, "b": 1, "c": 1}


def test_cancel_shares_floor_and_proportion() -> None:
    # One user with a million jobs does not crowd out a user with 30.
    assert cancel_shares({"big": 1_000_000, "small": 30}) == {"big": 280, "small": 20}
    # Nobody is given more than they have; the rest of the budget moves on.
    assert cancel_shares({"a": 5, "b": 1_000}) == {"a": 5, "b": 295}
    assert cancel_shares({"a": 0, "b": 7}) == {"a": 0, "b": 7}
    # Many users: each still gets the minimum, even beyond the total.
    many = cancel_shares({f"u{i}": 100 for i in range(20)})
    assert set(many.values()) == {20}


# ---------------------------------------------------------------- properties

users = st.sampled_from([f"user{i}" for i in range(12)])
mcpu = st.integers(min_value=0, max_value=200_000)
demand_lists = st.dictionaries(users, st.tuples(mcpu, mcpu), max_size=10).map(
    lambda d: [UserDemand(u, r, q) for u, (r, q) in d.items()]
)
free = st.integers(min_value=0, max_value=1_000_000)


@given(free, demand_lists)
def test_allocation_is_bounded_by_free_cores_and_demand(free_mcpu: int, demands: list[UserDemand]) -> None:
    allocation = allocate_cores(free_mcpu, demands)
    assert set(allocation) == {d.user for d in demands}
    assert sum(allocation.values()) <= free_mcpu
    for d in demands:
        assert 0 <= allocation[d.user] <= d.ready_cores_mcpu


def bisected_level(to_give: int, demands: list[UserDemand]) -> int:
    """The water level by its definition: the highest L whose cost is at most `to_give`, by bisection."""
    def cost(level: int) -> int:
        return sum(min(max(level - d.running_cores_mcpu, 0), d.ready_cores_mcpu) for d in demands)
    lo, hi = 0, max((d.running_cores_mcpu + d.ready_cores_mcpu for d in demands), default=0)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if cost(mid) <= to_give else (lo, mid - 1)
    return lo


@given(free, demand_lists)
def test_the_water_level_walked_over_breakpoints_is_the_bisected_one(free_mcpu: int,
                                                                      demands: list[UserDemand]) -> None:
    to_give = min(free_mcpu, sum(d.ready_cores_mcpu for d in demands))
    assert water_level(to_give, demands) == bisected_level(to_give, demands)


@given(free, demand_lists)
def test_allocation_is_work_conserving(free_mcpu: int, demands: list[UserDemand]) -> None:
    allocation = allocate_cores(free_mcpu, demands)
    assert sum(allocation.values()) == min(free_mcpu, sum(d.ready_cores_mcpu for d in demands))


@given(free, demand_lists)
def test_allocation_is_max_min_fair(free_mcpu: int, demands: list[UserDemand]) -> None:
    """Nobody who still wants cores ends below the level of anyone who was
    given cores (1 mcpu of rounding allowed). A user given nothing may stay
    above: their running cores are theirs, fair share never takes back."""
    allocation = allocate_cores(free_mcpu, demands)
    level = {d.user: d.running_cores_mcpu + allocation[d.user] for d in demands}
    for a in demands:
        if allocation[a.user] < a.ready_cores_mcpu:
            for b in demands:
                if allocation[b.user] > 0:
                    assert level[a.user] >= level[b.user] - 1


@given(free, free, demand_lists)
def test_more_free_cores_never_gives_anyone_less(free1: int, free2: int, demands: list[UserDemand]) -> None:
    low, high = sorted((free1, free2))
    before, after = allocate_cores(low, demands), allocate_cores(high, demands)
    assert all(after[u] >= before[u] for u in before)


@given(free, demand_lists, st.randoms(use_true_random=False))
def test_input_order_never_changes_the_allocation(
    free_mcpu: int, demands: list[UserDemand], rnd: random.Random
) -> None:
    shuffled = list(demands)
    rnd.shuffle(shuffled)
    assert allocate_cores(free_mcpu, shuffled) == allocate_cores(free_mcpu, demands)


@given(free, demand_lists, st.integers(min_value=0, max_value=400))
def test_scheduling_shares_properties(free_mcpu: int, demands: list[UserDemand], total_jobs: int) -> None:
    allocation = allocate_cores(free_mcpu, demands)
    shares = scheduling_shares(allocation, demands, total_jobs)
    served = [u for u, a in allocation.items() if a > 0]
    assert set(shares) == {d.user for d in demands}
    assert sum(shares.values()) == (total_jobs if served else 0)
    for user, share in shares.items():
        assert share >= 0
        if allocation[user] == 0:
            assert share == 0
        elif len(served) <= total_jobs:
            assert share >= 1
    # Proportional: more cores never means fewer jobs (up to the minimum of
    # one and one job of rounding).
    for a in served:
        for b in served:
            if allocation[a] > allocation[b]:
                assert shares[a] >= shares[b] - 1


counts = st.dictionaries(users, st.integers(min_value=0, max_value=100_000), max_size=10)


@given(counts, st.integers(min_value=0, max_value=1_000), st.integers(min_value=0, max_value=50))
def test_cancel_shares_properties(cancellable: dict[str, int], total: int, minimum: int) -> None:
    shares = cancel_shares(cancellable, total, minimum)
    assert set(shares) == set(cancellable)
    everything = sum(cancellable.values())
    floors = sum(min(n, minimum) for n in cancellable.values())
    for user, n in cancellable.items():
        assert min(n, minimum) <= shares[user] <= n
    assert sum(shares.values()) == max(floors, min(total, everything))
    assert sum(shares.values()) <= max(total, minimum * len(cancellable))
