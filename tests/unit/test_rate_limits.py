"""Token buckets and slots (services/common/rate_limits.py), whatever the sequence of calls: no window
admits more than burst + rate × its length, a refusal's wait is exact, waiting never makes the wait
longer, keys are apart, and forgetting full buckets changes no decision."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.rate_limits import NS_PER_S, Buckets, Slots, TokenBucket

buckets = st.builds(TokenBucket, per_s=st.floats(0.01, 10_000.0), burst=st.integers(1, 50))
gaps_ns = st.lists(st.integers(0, 3 * NS_PER_S), min_size=1, max_size=300)
"""Time between successive calls: zero (at once) to three seconds."""


def admitted_times(bucket: TokenBucket, gaps: list[int], start_ns: int = 10 * NS_PER_S) -> list[int]:
    tat, now, admitted = None, start_ns, []
    for gap in gaps:
        now += gap
        tat, wait = bucket.take(tat, now)
        if wait == 0:
            admitted.append(now)
    return admitted


@given(buckets, gaps_ns)
def test_no_window_admits_more_than_burst_plus_rate_times_its_length(bucket: TokenBucket, gaps: list[int]) -> None:
    admitted = admitted_times(bucket, gaps)
    for i, j in itertools.combinations(range(len(admitted)), 2):
        window_ns = admitted[j] - admitted[i]
        calls = j - i + 1
        # The exact bound (integers), which implies burst + per_s * t since the interval is rounded up.
        assert calls <= bucket.burst + window_ns // bucket.interval_ns
        assert calls <= bucket.burst + bucket.per_s * window_ns / NS_PER_S + 1e-9


@given(buckets, gaps_ns)
def test_a_refusals_wait_is_exact(bucket: TokenBucket, gaps: list[int]) -> None:
    tat, now = None, 0
    for gap in gaps:
        now += gap
        new_tat, wait = bucket.take(tat, now)
        if wait:
            assert new_tat == tat  # a refusal takes nothing
            assert bucket.take(tat, now + wait - 1)[1] == 1
            assert bucket.take(tat, now + wait)[1] == 0
        tat = new_tat


@given(buckets, gaps_ns, st.integers(0, 5 * NS_PER_S), st.integers(0, 5 * NS_PER_S))
def test_the_bucket_refills_monotonically(bucket: TokenBucket, gaps: list[int], later_ns: int, more_ns: int) -> None:
    tat, now = None, 0
    for gap in gaps:
        now += gap
        tat, _ = bucket.take(tat, now)
    first = bucket.take(tat, now + later_ns)[1]
    second = bucket.take(tat, now + later_ns + more_ns)[1]
    assert second == max(0, first - more_ns)


@given(buckets)
def test_a_quiet_bucket_admits_a_whole_burst_at_once_and_no_more(bucket: TokenBucket) -> None:
    admitted = admitted_times(bucket, [0] * (bucket.burst + 3))
    assert len(admitted) == bucket.burst


def test_a_bucket_needs_a_rate_and_a_burst() -> None:
    for per_s, burst in ((0, 1), (-1, 1), (float("inf"), 1), (float("nan"), 1), (1, 0)):
        with pytest.raises(ValueError):
            TokenBucket(per_s, burst)


keys = st.sampled_from(["alice", "bob", "carol", "dave"])


@given(buckets, st.lists(st.tuples(keys, st.integers(0, NS_PER_S)), max_size=300), st.integers(1, 5))
def test_keys_are_apart_and_forgetting_full_buckets_changes_no_decision(
        bucket: TokenBucket, calls: list[tuple[str, int]], sweep_every: int) -> None:
    swept = Buckets(bucket)
    swept.SWEEP_EVERY = sweep_every  # sweeps often
    reference: dict[str, int | None] = {}
    now = 0
    for key, gap in calls:
        now += gap
        tat, expected = bucket.take(reference.get(key), now)
        reference[key] = tat
        assert swept.take(key, now) == expected
        assert swept.tracked() <= len(reference)


@given(st.integers(1, 5), st.lists(st.tuples(keys, st.booleans()), max_size=200))
def test_slots_never_exceed_their_maximum_and_come_back(maximum: int, steps: list[tuple[str, bool]]) -> None:
    slots, held = Slots(maximum), {k: 0 for k in ("alice", "bob", "carol", "dave")}
    for key, acquire in steps:
        if acquire:
            assert slots.try_acquire(key) == (held[key] < maximum)
            held[key] = min(maximum, held[key] + 1)
        elif held[key]:
            slots.release(key)
            held[key] -= 1
        assert slots.held(key) == held[key]


def test_a_users_limiter_refuses_naming_the_limit_and_spares_corral_services() -> None:
    from services.common.call_limits import UserLimiter, UserQuotas
    from services.common.errors import RateLimited, to_status
    from services.common.identity import Principal

    now = [0]
    quotas = UserQuotas(requests=TokenBucket(10, 2), max_concurrent_reads=1, read_methods=frozenset({"/R"}),
                        submissions=TokenBucket(1 / 60, 1), submission_methods=frozenset({"/S"}))
    limiter = UserLimiter(quotas, clock_ns=lambda: now[0])
    alice, driver = Principal("alice", "person"), Principal("frontend", "service", role="frontend")
    slot = limiter.admit(alice, "/R")
    assert slot == "alice" and limiter.reads_running("alice") == 1
    with pytest.raises(RateLimited) as refused:
        limiter.admit(alice, "/R")  # a second read at once
    assert refused.value.quota == "max_concurrent_reads_per_user" and refused.value.subject == "user:alice"
    limiter.release(slot)
    assert limiter.reads_running("alice") == 0
    with pytest.raises(RateLimited) as refused:
        limiter.admit(alice, "/other")  # the third call at once: the burst was two
    assert refused.value.quota == "max_requests_per_user_per_s" and refused.value.retry_after_s == pytest.approx(0.1)
    status = to_status(refused.value)
    assert status is not None and len(status.details) == 2  # RetryInfo and QuotaFailure
    now[0] += NS_PER_S
    assert limiter.admit(alice, "/S") is None
    with pytest.raises(RateLimited) as refused:
        limiter.admit(alice, "/S")
    assert refused.value.quota == "max_submissions_per_user_per_minute"
    assert refused.value.retry_after_s == pytest.approx(60.0)
    for _ in range(100):  # corral's own services are held to none of it
        assert limiter.admit(driver, "/R") is None and limiter.admit(driver, "/S") is None
