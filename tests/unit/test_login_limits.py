"""Login throttling (services/auth/login_limits.py): delays grow, are capped, are
waited out, reset on success, and bound every key's guess rate, whatever the
sequence of attempts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.auth.login_limits import Backoff, LoginLimits, LoginThrottle, Refused, source_of

LIMITS = LoginLimits(per_user=Backoff(free_failures=3, base_delay_s=1.0, max_delay_s=16.0, forget_after_s=100.0),
                     per_source=Backoff(free_failures=5, base_delay_s=2.0, max_delay_s=64.0, forget_after_s=200.0),
                     max_tracked=50)


class Clock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


backoffs = st.builds(Backoff, free_failures=st.integers(1, 20), base_delay_s=st.floats(0.001, 10.0),
                     max_delay_s=st.floats(10.0, 1000.0), forget_after_s=st.floats(1000.0, 10_000.0))


@given(backoffs, st.integers(0, 10_000))
def test_delays_are_zero_while_free_then_grow_to_the_cap(backoff: Backoff, failures: int) -> None:
    delay = backoff.delay_s(failures)
    assert 0.0 <= delay <= backoff.max_delay_s
    assert (delay == 0.0) == (failures < backoff.free_failures)
    assert backoff.delay_s(failures + 1) >= delay
    if failures >= backoff.free_failures and delay < backoff.max_delay_s:
        assert backoff.delay_s(failures + 1) == pytest.approx(min(2 * delay, backoff.max_delay_s))


def test_nonsense_settings_are_refused() -> None:
    for bad in (dict(free_failures=0), dict(free_failures=1, base_delay_s=0),
                dict(free_failures=1, max_delay_s=0.5), dict(free_failures=1, forget_after_s=10)):
        with pytest.raises(ValueError):
            Backoff(**bad)  # type: ignore[arg-type]


def test_rapid_wrong_passwords_are_refused_after_the_free_ones_until_the_lock_ends() -> None:
    clock = Clock()
    throttle = LoginThrottle(LIMITS, clock)
    assert [throttle.admit("alice", "s1") for _ in range(3)] == [None, None, None]
    refused = throttle.admit("alice", "s2")  # another place: the username is locked
    assert refused == Refused("per_user", 1.0)
    assert "per_user" in refused.message() and "1 s" in refused.message()
    clock.now_s += 1.0
    assert throttle.admit("alice", "s1") is None
    assert throttle.admit("alice", "s1") == Refused("per_user", 2.0)  # doubled
    clock.now_s += 2.0
    throttle.succeeded("alice", "s1")  # right password: the username starts over...
    assert throttle.failures("per_user", "alice") == 0
    assert throttle.failures("per_source", "s1") == 3  # ...the source keeps the other attempts
    assert throttle.admit("alice", "s1") is None


def test_a_source_spraying_usernames_is_locked() -> None:
    throttle = LoginThrottle(LIMITS, Clock())
    assert all(throttle.admit(f"user{i}", "s1") is None for i in range(5))
    assert throttle.admit("user99", "s1") == Refused("per_source", 2.0)
    assert throttle.admit("user99", "s2") is None  # another source may still try


def test_quiet_keys_are_forgotten_and_memory_is_bounded() -> None:
    clock = Clock()
    throttle = LoginThrottle(LIMITS, clock)
    for _ in range(3):
        throttle.admit("alice", "s1")
    clock.now_s += 100.0
    assert throttle.failures("per_user", "alice") == 0
    assert throttle.admit("alice", "s1") is None
    assert throttle.failures("per_user", "alice") == 1
    for i in range(200):
        throttle.admit(f"u{i}", f"s{i}")
        assert throttle.tracked() <= LIMITS.max_tracked
    clock.now_s += 1000.0
    throttle.admit("x", "y")
    assert throttle.tracked() == 2


# One step of a random session: a login attempt (who, from where, right
# password?) after some time has passed.
attempts = st.lists(st.tuples(st.sampled_from(["alice", "bob", "nobody"]), st.sampled_from(["s1", "s2", "s3"]),
                              st.booleans(), st.sampled_from([0.0, 0.0, 0.001, 0.5, 1.0, 3.0, 20.0, 150.0])),
                    max_size=200)


@dataclasses.dataclass
class KeyHistory:
    """What the test saw of one key since it last started over."""

    failures: int = 0
    last_s: float = 0.0


@given(attempts)
def test_every_key_waits_out_its_lock_and_a_refusal_names_the_true_wait(steps: list) -> None:
    """Checked against the test's own account of each key: an attempt is admitted exactly
    when no key of it is locked, and a refusal's wait is the longer lock (so waiting as
    long as told is enough)."""
    clock = Clock()
    throttle = LoginThrottle(LIMITS, clock)
    history: dict[tuple[str, str], KeyHistory] = {}
    for user, source, right, wait_s in steps:
        clock.now_s += wait_s
        keys = [("per_user", user), ("per_source", source)]
        for limit, key in keys:
            seen = history.setdefault((limit, key), KeyHistory())
            if clock.now_s - seen.last_s >= getattr(LIMITS, limit).forget_after_s:
                history[(limit, key)] = KeyHistory()
        refused = throttle.admit(user, source)
        # The lock each key is under, by the test's own account of its failures.
        locks = {limit: history[(limit, key)].last_s + getattr(LIMITS, limit).delay_s(history[(limit, key)].failures)
                 - clock.now_s for limit, key in keys}
        if refused is None:
            assert all(wait <= 0 for wait in locks.values()), locks
            for limit, key in keys:
                history[(limit, key)].failures += 1
                history[(limit, key)].last_s = clock.now_s
            if right:
                throttle.succeeded(user, source)
                history[("per_user", user)] = KeyHistory()
                history[("per_source", source)].failures -= 1
        else:
            assert refused.retry_after_s == pytest.approx(max(locks.values()))
            assert locks[refused.limit] == pytest.approx(refused.retry_after_s)
            assert 0 < refused.retry_after_s <= max(LIMITS.per_user.max_delay_s, LIMITS.per_source.max_delay_s)
        for (limit, key), seen in history.items():
            forgotten = clock.now_s - seen.last_s >= getattr(LIMITS, limit).forget_after_s
            assert throttle.failures(limit, key) == (0 if forgotten else max(seen.failures, 0))


@given(st.integers(1, 300))
def test_concurrent_attempts_cannot_pass_a_key_together(n: int) -> None:
    """Attempts arriving at the same instant, before any password is checked."""
    throttle = LoginThrottle(LIMITS, Clock())
    admitted = sum(throttle.admit("alice", f"s{i}") is None for i in range(n))
    assert admitted == min(n, LIMITS.per_user.free_failures)


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0]), max_size=300))
def test_an_attacker_gets_at_most_the_free_failures_and_one_guess_per_lock(waits: list[float]) -> None:
    clock = Clock()
    throttle = LoginThrottle(LIMITS, clock)
    admitted: list[float] = []
    for wait in waits:
        clock.now_s += wait
        if throttle.admit("alice", f"s{len(admitted)}") is None:
            admitted.append(clock.now_s)
    backoff = LIMITS.per_user
    for i in range(1, len(admitted)):
        # After i failures the key was locked for delay_s(i) (nothing is forgotten: waits < 100 s).
        assert admitted[i] - admitted[i - 1] >= backoff.delay_s(i)


@pytest.mark.parametrize("peer, forwarded_for, source", [
    ("ipv4:10.1.2.3:5555", None, "10.1.2.3"),
    ("ipv6:[::1]:5555", None, "::/64"),
    ("ipv6:[2001:db8:1:2:aaaa::1]:443", None, "2001:db8:1:2::/64"),
    ("ipv6:[::ffff:10.0.0.7]:443", None, "10.0.0.7"),
    ("ipv6:[fe80::1%eth0]:443", None, "fe80::/64"),
    ("unix:/tmp/sock", None, "unix:/tmp/sock"),
    # Behind a trusted gateway: the last entry is the address it saw; the rest is the client's word.
    ("ipv4:10.0.0.2:1000", "6.6.6.6, 192.0.2.9", "192.0.2.9"),
    ("ipv4:10.0.0.2:1000", "2001:db8::5", "2001:db8::/64"),
    ("ipv4:10.0.0.2:1000", "", "10.0.0.2"),
])
def test_sources(peer: str, forwarded_for: str | None, source: str) -> None:
    assert source_of(peer, forwarded_for) == source
