"""Where new machines go and how long a refused pool or region waits (services.policy.placement)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.policy.placement import (
    Backoff, Backoffs, BackoffSettings, Placement, RegionDemand, Refusal, demand_by_region, place,
)


def regions_of(placed: list[Placement]) -> list[str]:
    return [p.region for p in placed]

REGIONS = ["a", "b", "c", "d"]

region_sets = st.none() | st.frozensets(st.sampled_from(REGIONS), min_size=1)
demands = st.lists(st.builds(RegionDemand, region_sets, st.integers(0, 64_000)), max_size=6)
open_sets = st.sets(st.sampled_from(REGIONS))


def may_run(d: RegionDemand, region: str) -> bool:
    return d.regions is None or region in d.regions


@given(st.integers(0, 20), st.integers(1, 16_000), open_sets, demands)
def test_machines_go_only_to_open_regions_where_some_demand_may_run(n: int, cores: int, open_regions: set[str],
                                                                   demand: list[RegionDemand]) -> None:
    placed = place(n, cores, REGIONS, open_regions, demand)
    assert len(placed) <= n
    for p in placed:
        assert p.region in open_regions
        assert any(d.cores_mcpu > 0 and may_run(d, p.region) for d in demand)
        if p.anywhere:  # only demand that may run anywhere goes there
            assert all(d.regions is None for d in demand if d.cores_mcpu > 0 and d.regions is not None
                       and next((r for r in REGIONS if r in open_regions and may_run(d, r)), None) == p.region)


BIT_OF = {name: bit for bit, name in enumerate(REGIONS)}
heads_of_queues = st.lists(st.tuples(st.none() | st.integers(1, 2 ** len(REGIONS) - 1), st.integers(1, 16_000)),
                           max_size=12)
"""(regions_bits, cores_mcpu) of the jobs at the heads of the queues, the jobs the scheduler looks at."""


@given(st.integers(0, 20), st.integers(1, 16_000), open_sets, heads_of_queues, st.integers(0, 10**7))
def test_every_machine_made_is_for_a_job_the_scheduler_looks_at(n: int, cores: int, open_regions: set[str],
                                                                 heads: list[tuple[int | None, int]],
                                                                 ready: int) -> None:
    """The design's deadlock needs a machine made where no job the scheduler looks at may run: idle, it
    leaves, and is made there again. Split by the heads, demand never brings one."""
    regions = dict(enumerate(REGIONS))
    placed = place(n, cores, REGIONS, open_regions, demand_by_region(heads, ready, regions))
    for p in placed:
        assert any(bits is None or (bits >> BIT_OF[p.region]) & 1 for bits, _ in heads) or not heads, (p, heads)


@given(st.integers(1, 20), st.integers(1, 16_000), st.sampled_from(REGIONS), heads_of_queues, st.integers(1, 10**7))
def test_heads_in_one_region_bring_machines_there_alone(n: int, cores: int, region: str,
                                                        behind: list[tuple[int | None, int]], ready: int) -> None:
    """However much of the queue behind the heads is elsewhere (it is not read), the machines go to the heads'
    region while it is open."""
    only = [(1 << BIT_OF[region], cores_mcpu) for _, cores_mcpu in behind] or [(1 << BIT_OF[region], 1000)]
    placed = place(n, cores, REGIONS, set(REGIONS), demand_by_region(only, ready, dict(enumerate(REGIONS))))
    assert regions_of(placed) == [region] * n


def test_demand_is_split_as_the_heads_are_and_scaled_to_the_whole() -> None:
    regions = {1: "east", 2: "west"}
    split = demand_by_region([(0b10, 1000), (0b100, 3000), (0b10, 1000), (None, 5000)], 100_000, regions)
    assert split == [RegionDemand(frozenset({"east"}), 20_000), RegionDemand(frozenset({"west"}), 30_000),
                     RegionDemand(None, 50_000)]
    assert demand_by_region([], 7000, regions) == [RegionDemand(None, 7000)]


@given(st.integers(0, 20), st.integers(1, 16_000), open_sets, demands)
def test_demand_that_waits_brings_no_machine_beyond_what_the_rest_needs(n: int, cores: int, open_regions: set[str],
                                                                      demand: list[RegionDemand]) -> None:
    placed = place(n, cores, REGIONS, open_regions, demand)
    servable = [d for d in demand if d.cores_mcpu > 0 and any(may_run(d, r) for r in open_regions)]
    if len(servable) < len([d for d in demand if d.cores_mcpu > 0]):  # some demand waits
        needed = sum(math.ceil(d.cores_mcpu / cores) for d in servable)
        assert len(placed) <= needed
    elif servable:  # none waits: the caller's n is placed whole
        assert len(placed) == n


@given(st.integers(0, 20), st.integers(1, 16_000), st.integers(1, 10**6), open_sets)
def test_demand_that_may_run_anywhere_goes_to_the_first_open_region(n: int, cores: int, ready: int,
                                                                    open_regions: set[str]) -> None:
    placed = place(n, cores, REGIONS, open_regions, [RegionDemand(None, ready)])
    first = next((r for r in REGIONS if r in open_regions), None)
    assert placed == ([Placement(first, True)] * n if first is not None else [])


def test_a_closed_region_sends_anywhere_demand_on_and_keeps_its_own_waiting() -> None:
    demand = [RegionDemand(None, 4000), RegionDemand(frozenset({"a"}), 6000)]
    assert regions_of(place(5, 2000, REGIONS, {"a", "b"}, demand)) == ["a"] * 5
    assert place(5, 2000, REGIONS, {"b", "c"}, demand) == [Placement("b", True)] * 2  # a's own 6 cores wait
    assert place(5, 2000, REGIONS, {"c"}, [RegionDemand(frozenset({"b", "c"}), 3000)]) == [Placement("c", False)] * 5
    # Machines go where the most demand is not yet covered.
    assert place(3, 2000, REGIONS, set(REGIONS), [RegionDemand(frozenset({"b"}), 4000), RegionDemand(None, 2000)]) \
        == [Placement("b", False), Placement("a", True), Placement("b", False)]


@given(st.floats(0.1, 1000), st.floats(1, 100), st.integers(1, 200))
def test_a_backoff_grows_and_is_capped(initial: float, factor: float, refusals: int) -> None:
    backoff = Backoff(initial, initial * factor)
    assert initial <= backoff.after(refusals) <= backoff.max_s
    assert backoff.after(refusals) <= backoff.after(refusals + 1)
    assert backoff.after(1) == initial


def test_a_backoff_needs_a_positive_initial_wait_below_its_cap() -> None:
    with pytest.raises(ValueError):
        Backoff(0, 10)
    with pytest.raises(ValueError):
        Backoff(20, 10)


@given(st.lists(st.tuples(st.sampled_from(["p", "q"]), st.sampled_from(REGIONS[:2]), st.sampled_from(list(Refusal)),
                          st.floats(0, 100)), max_size=20))
def test_a_refusal_closes_its_region_or_pool_until_its_wait_ends_and_a_success_reopens_both(
        refusals: list[tuple[str, str, Refusal, float]]) -> None:
    backoffs = Backoffs(BackoffSettings())
    now = 0.0
    for pool, region, kind, step in refusals:
        now += step
        wait = backoffs.refused(pool, region, kind, now)
        if kind is Refusal.REGION:
            assert region not in backoffs.open_regions(pool, REGIONS, now)
            assert region in backoffs.open_regions(pool, REGIONS, now + wait)
        else:
            assert not backoffs.pool_open(pool, now) and backoffs.pool_open(pool, now + wait)
    for pool in ["p", "q"]:
        for region in REGIONS[:2]:
            backoffs.succeeded(pool, region)
        assert backoffs.pool_open(pool, now) and backoffs.open_regions(pool, REGIONS, now) == REGIONS


def test_refusals_in_a_row_double_the_wait_and_a_success_starts_over() -> None:
    backoffs = Backoffs(BackoffSettings(region=Backoff(60, 200)))
    assert [backoffs.refused("p", "a", Refusal.REGION, 0) for _ in range(4)] == [60, 120, 200, 200]
    assert backoffs.refused("p", "b", Refusal.REGION, 0) == 60  # another region's count is its own
    assert backoffs.open_regions("q", REGIONS, 0) == REGIONS and backoffs.pool_open("q", 0)  # another pool's too
    backoffs.succeeded("p", "a")
    assert backoffs.refused("p", "a", Refusal.REGION, 0) == 60
