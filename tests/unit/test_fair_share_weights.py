"""Weighted fair share (services/policy/fair_share.py): a user's level is running cores / weight, so when
everyone wants more a user of weight 2 ends with twice the cores of one of weight 1; exact and deterministic,
and with every weight 1 the plain water-filling, to the mcpu."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.policy import fair_share
from services.policy.fair_share import UserDemand, allocate_cores, fair_share_order, scheduling_shares

users = st.sampled_from([f"user{i}" for i in range(12)])
mcpu = st.integers(min_value=0, max_value=200_000)
weights = st.integers(min_value=1, max_value=12)
weighted_lists = st.dictionaries(users, st.tuples(mcpu, mcpu, weights), max_size=10).map(
    lambda d: [UserDemand(u, r, q, w) for u, (r, q, w) in d.items()])
free = st.integers(min_value=0, max_value=1_000_000)


def test_a_weight_of_two_gets_twice_the_share_when_both_want_more() -> None:
    demands = [UserDemand("heavy", 0, 100_000, weight=2), UserDemand("light", 0, 100_000, weight=1)]
    assert allocate_cores(9_000, demands) == {"heavy": 6_000, "light": 3_000}
    # From running levels: heavy runs 4 cores (level 2), light 1 (level 1): light is topped up first.
    demands = [UserDemand("heavy", 4_000, 100_000, weight=2), UserDemand("light", 1_000, 100_000, weight=1)]
    assert allocate_cores(1_000, demands) == {"heavy": 0, "light": 1_000}
    assert allocate_cores(4_000, demands) == {"heavy": 2_000, "light": 2_000}  # both at level 3
    assert fair_share_order(demands) == ["light", "heavy"]


def test_demand_still_caps_a_heavy_user() -> None:
    demands = [UserDemand("heavy", 0, 1_000, weight=5), UserDemand("light", 0, 100_000)]
    assert allocate_cores(9_000, demands) == {"heavy": 1_000, "light": 8_000}


def test_a_weight_must_be_a_positive_int() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="weight"):
            UserDemand("a", 0, 0, bad)  # type: ignore[arg-type]


@given(free, weighted_lists)
def test_weighted_allocation_is_bounded_and_work_conserving(free_mcpu: int, demands: list[UserDemand]) -> None:
    allocation = allocate_cores(free_mcpu, demands)
    assert set(allocation) == {d.user for d in demands}
    assert sum(allocation.values()) == min(free_mcpu, sum(d.ready_cores_mcpu for d in demands))
    for d in demands:
        assert 0 <= allocation[d.user] <= d.ready_cores_mcpu


@given(free, weighted_lists)
def test_weighted_allocation_is_weighted_max_min_fair(free_mcpu: int, demands: list[UserDemand]) -> None:
    """Nobody who still wants cores ends below the weighted level ((running + given) / weight) of anyone who
    was given cores, but for one step of rounding: the tolerance is one mcpu per unit of weight."""
    allocation = allocate_cores(free_mcpu, demands)
    level = {d.user: Fraction(d.running_cores_mcpu + allocation[d.user], d.weight) for d in demands}
    for a in demands:
        if allocation[a.user] < a.ready_cores_mcpu:
            for b in demands:
                if allocation[b.user] > 0:
                    assert level[a.user] >= level[b.user] - 1


@given(free, weighted_lists)
def test_when_everyone_wants_more_shares_follow_the_weights(free_mcpu: int, demands: list[UserDemand]) -> None:
    """From nothing running, with demand beyond the free cores for all: each user's cores are their weight's
    share of the free cores, within one mcpu per unit of weight."""
    hungry = [UserDemand(d.user, 0, 2_000_000, d.weight) for d in demands]
    allocation = allocate_cores(free_mcpu, hungry)
    total_weight = sum(d.weight for d in hungry)
    for d in hungry:
        exact = Fraction(free_mcpu * d.weight, total_weight)
        assert abs(allocation[d.user] - exact) <= d.weight


@given(free, free, weighted_lists)
def test_more_free_cores_never_gives_anyone_less_with_weights(free1: int, free2: int,
                                                              demands: list[UserDemand]) -> None:
    low, high = sorted((free1, free2))
    before, after = allocate_cores(low, demands), allocate_cores(high, demands)
    assert all(after[u] >= before[u] for u in before)


@given(free, weighted_lists, st.randoms(use_true_random=False))
def test_weighted_allocation_ignores_input_order(free_mcpu: int, demands: list[UserDemand],
                                                 rnd: random.Random) -> None:
    shuffled = list(demands)
    rnd.shuffle(shuffled)
    assert allocate_cores(free_mcpu, shuffled) == allocate_cores(free_mcpu, demands)
    assert fair_share_order(shuffled) == fair_share_order(demands)


@given(free, weighted_lists)
def test_with_every_weight_one_the_weighted_fill_is_the_plain_one(free_mcpu: int, demands: list[UserDemand]) -> None:
    plain = [UserDemand(d.user, d.running_cores_mcpu, d.ready_cores_mcpu) for d in demands]
    to_give = min(free_mcpu, sum(d.ready_cores_mcpu for d in plain))
    assert fair_share._allocate_weighted(to_give, {d.user: d for d in plain}) == allocate_cores(free_mcpu, plain)


@given(weighted_lists)
def test_the_order_is_by_weighted_level_then_name(demands: list[UserDemand]) -> None:
    order = fair_share_order(demands)
    by_user = {d.user: d for d in demands}
    for a, b in zip(order, order[1:]):
        la = Fraction(by_user[a].running_cores_mcpu, by_user[a].weight)
        lb = Fraction(by_user[b].running_cores_mcpu, by_user[b].weight)
        assert (la, a) < (lb, b)


@given(free, weighted_lists, st.integers(min_value=0, max_value=400))
def test_weighted_scheduling_shares_sum_and_minimum(free_mcpu: int, demands: list[UserDemand],
                                                    total_jobs: int) -> None:
    allocation = allocate_cores(free_mcpu, demands)
    shares = scheduling_shares(allocation, demands, total_jobs)
    served = [u for u, a in allocation.items() if a > 0]
    assert sum(shares.values()) == (total_jobs if served else 0)
    for user in served:
        assert shares[user] >= (1 if len(served) <= total_jobs else 0)
