"""How much one caller may ask of a server: token buckets and concurrency slots, per key.

Pure: no I/O, no clock of its own (every decision takes `now_ns`, integer
nanoseconds of a monotonic clock), so the arithmetic is exact and the
property tests (tests/unit/test_rate_limits.py) can drive time.

- `TokenBucket` is a rate of `per_s` with bursts of `burst`, as the generic
  cell rate algorithm (GCRA) keeps it: one integer per key, the
  "theoretical arrival time" `tat_ns` of the next call were calls spaced
  evenly. A call at `now_ns` is admitted while `tat_ns - now_ns` stays
  within the burst's tolerance, and then moves `tat_ns` one interval on.
  In any window of t seconds at most `burst + per_s * t` calls are admitted;
  a refusal says exactly when the next call would be (`retry_after_ns`).
- `Buckets` holds a bucket per key (the caller's name), forgetting the keys
  whose bucket is full again: a full bucket is the same as a new one.
- `Slots` counts what each key holds at once (calls running, streams open)
  against a maximum.

services/common/call_limits.py wires them into every call a server takes.
"""

from __future__ import annotations

import dataclasses
import math

NS_PER_S = 1_000_000_000


@dataclasses.dataclass(frozen=True)
class TokenBucket:
    """A rate with bursts: on average `per_s` calls a second, up to `burst` back to back."""

    per_s: float
    """Calls a second, sustained."""
    burst: int
    """Calls that may come at once after a quiet time (the bucket's size)."""

    def __post_init__(self) -> None:
        if not (self.per_s > 0 and math.isfinite(self.per_s)) or self.burst < 1:
            raise ValueError(f"a token bucket needs a rate above 0 and a burst of at least 1: {self}")

    @property
    def interval_ns(self) -> int:
        """Time between two calls at the sustained rate, rounded up: never faster than `per_s`."""
        return max(1, math.ceil(NS_PER_S / self.per_s))

    @property
    def tolerance_ns(self) -> int:
        """How far ahead of `now` the theoretical arrival time may be for a call to be admitted."""
        return (self.burst - 1) * self.interval_ns

    def take(self, tat_ns: int | None, now_ns: int) -> tuple[int, int]:
        """A call at `now_ns` against a bucket whose theoretical arrival time is `tat_ns` (None: a
        new bucket, full). Returns (new tat_ns, 0) when admitted, or (tat_ns unchanged, the
        nanoseconds after which the same call would be admitted) when refused."""
        tat = now_ns if tat_ns is None else max(tat_ns, now_ns)
        wait_ns = tat - self.tolerance_ns - now_ns
        if wait_ns > 0:
            return tat, wait_ns
        return tat + self.interval_ns, 0

    def is_full(self, tat_ns: int, now_ns: int) -> bool:
        """Whether a bucket at `tat_ns` holds `burst` calls again by `now_ns` (then it can be forgotten)."""
        return tat_ns <= now_ns


class Buckets:
    """One `TokenBucket`'s state per key."""

    SWEEP_EVERY = 1024
    """Full buckets are forgotten each time this many new keys came in."""

    def __init__(self, bucket: TokenBucket):
        self.bucket = bucket
        self._tat_ns: dict[str, int] = {}
        self._new_keys = 0

    def take(self, key: str, now_ns: int) -> int:
        """Admit one call of `key` at `now_ns` (0) or say how many nanoseconds until it would be."""
        if key not in self._tat_ns:
            self._new_keys += 1
            if self._new_keys >= self.SWEEP_EVERY:
                self._new_keys = 0
                self._tat_ns = {k: t for k, t in self._tat_ns.items() if not self.bucket.is_full(t, now_ns)}
        tat, wait_ns = self.bucket.take(self._tat_ns.get(key), now_ns)
        self._tat_ns[key] = tat
        return wait_ns

    def tracked(self) -> int:
        """Keys held now (full buckets not yet swept included)."""
        return len(self._tat_ns)


class Slots:
    """What each key holds at once, at most `max_per_key`."""

    def __init__(self, max_per_key: int):
        if max_per_key < 1:
            raise ValueError(f"max_per_key must be at least 1, not {max_per_key}")
        self.max_per_key = max_per_key
        self._held: dict[str, int] = {}

    def try_acquire(self, key: str) -> bool:
        """Take a slot for `key` if it holds fewer than the maximum."""
        n = self._held.get(key, 0)
        if n >= self.max_per_key:
            return False
        self._held[key] = n + 1
        return True

    def release(self, key: str) -> None:
        """Give back a slot `try_acquire` took."""
        n = self._held[key] - 1
        if n:
            self._held[key] = n
        else:
            del self._held[key]

    def held(self, key: str) -> int:
        """Slots `key` holds now."""
        return self._held.get(key, 0)
