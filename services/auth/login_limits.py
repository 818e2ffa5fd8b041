"""How often a login may be tried: growing delays after failed passwords.

Two kinds of key are throttled, each with its own `Backoff`:
- the *username* as typed, against guessing one person's password from
  many places;
- the *source* address of the call, against one place trying many
  usernames (password spraying). IPv6 addresses count per /64, the block
  one subscriber usually holds.

A key may fail `free_failures` times back to back; the last of these locks
it for `base_delay_s`, and each further failure for twice the previous
lock, at most `max_delay_s`. A locked key refuses every login at once, right or
wrong password, without checking it (so no guess is made and no hash is
spent); refusals do not extend the lock. A key with no failure for
`forget_after_s` starts over.

An attempt counts as a failure as soon as it is admitted, before its
password is checked, so a thousand concurrent guesses cannot all pass a
key that is one failure from its lock. A right password then settles it:
the username's failures are forgotten (a successful login resets), while
the source only gets back the one failure this attempt had counted. A
source is not reset by success because an attacker with an account of
their own could otherwise log in between guesses at other people's.

Unknown usernames are tracked exactly like existing ones, so a refusal
tells nothing about who exists.

The state is in memory, per auth replica, bounded to `max_tracked` keys
(the least recently failed are dropped first). Several replicas each keep
their own counts, so behind a load balancer an attacker gets at most
replicas x the budget; delays still grow exponentially, so that factor
stays small. The database would give one count for all replicas, but at
the price of a write per failed login that attackers could drive, and of
a dependency of the throttle on the store it protects: memory is the
better trade for a handful of replicas.

Pure: no I/O; the clock (seconds, monotonic) is injected.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import time
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Backoff:
    """Delays after failed logins for one kind of key."""

    free_failures: int
    """Failures in a row that may come back to back; the last of them starts the first lock."""
    base_delay_s: float = 1.0
    """Lock after the `free_failures`-th failure; doubles with each further failure."""
    max_delay_s: float = 60.0
    """The longest lock."""
    forget_after_s: float = 900.0
    """A key with no failure for this long starts over (at least max_delay_s)."""

    def __post_init__(self) -> None:
        if self.free_failures < 1 or self.base_delay_s <= 0 or self.max_delay_s < self.base_delay_s:
            raise ValueError(f"login backoff needs free_failures >= 1 and 0 < base_delay_s <= max_delay_s: {self}")
        if self.forget_after_s < self.max_delay_s:
            raise ValueError(f"login backoff would forget a key before its lock ends: {self}")

    def delay_s(self, failures: int) -> float:
        """How long a key stays locked after its `failures`-th failure in a row (0: not at all)."""
        beyond = failures - self.free_failures
        if beyond < 0:
            return 0.0
        # 2**64 s is far past any cap: keeps the float finite for any count.
        return min(self.base_delay_s * 2.0 ** min(beyond, 64), self.max_delay_s)


@dataclasses.dataclass(frozen=True)
class LoginLimits:
    """Operator settings of login throttling (see the module docstring)."""

    per_user: Backoff = Backoff(free_failures=5, base_delay_s=1.0, max_delay_s=60.0)
    """Per username as typed. A short cap: an attacker can keep a known username locked, and its
    owner then waits at most this long between tries."""
    per_source: Backoff = Backoff(free_failures=10, base_delay_s=1.0, max_delay_s=300.0)
    """Per source address (IPv6: per /64)."""
    max_tracked: int = 100_000
    """Most keys remembered at once (about 100 bytes each); beyond, the least recently failed go."""


UNLIMITED = LoginLimits(per_user=Backoff(free_failures=2**62), per_source=Backoff(free_failures=2**62))
"""No throttling at all (for tests that log in many times)."""


@dataclasses.dataclass(frozen=True)
class Refused:
    """A login refused before its password was checked."""

    limit: str
    """Which key is locked: 'per_user' or 'per_source' (the LoginLimits field)."""
    retry_after_s: float
    """How long until the key unlocks."""

    def message(self) -> str:
        """What the caller is told: the limit and when to try again."""
        what = "for this username" if self.limit == "per_user" else "from this address"
        return (f"too many failed logins {what} (login limit {self.limit}): "
                f"try again in {math.ceil(self.retry_after_s)} s")


@dataclasses.dataclass
class _Failures:
    count: int
    last_s: float


class LoginThrottle:
    """The failures of every throttled key, and the decision for each attempt."""

    def __init__(self, limits: LoginLimits = LoginLimits(), clock_s: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock_s = clock_s
        # Per limit, key -> failures, ordered by last failure (oldest first): the clock
        # is monotonic and every failure moves its key to the end.
        self._failures: dict[str, dict[str, _Failures]] = {"per_user": {}, "per_source": {}}

    def admit(self, username: str, source: str) -> Refused | None:
        """None if the attempt may check its password (and it now counts as a failure
        of both keys until `succeeded`); otherwise why not."""
        now = self._clock_s()
        self._forget_stale(now)
        keys = (("per_user", username), ("per_source", source))
        waits = [Refused(limit, until - now) for limit, key in keys
                 if (until := self._locked_until(limit, key)) > now]
        if waits:
            return max(waits, key=lambda r: r.retry_after_s)
        for limit, key in keys:
            failures = self._failures[limit]
            entry = failures.pop(key, None) or _Failures(0, now)
            entry.count += 1
            entry.last_s = now
            failures[key] = entry
        while self.tracked() > self.limits.max_tracked:
            users, sources = self._failures["per_user"], self._failures["per_source"]
            oldest = min((d for d in (users, sources) if d), key=lambda d: next(iter(d.values())).last_s)
            del oldest[next(iter(oldest))]
        return None

    def succeeded(self, username: str, source: str) -> None:
        """The admitted attempt had the right password: the username starts over, and the
        source forgets this one attempt."""
        self._failures["per_user"].pop(username, None)
        sources = self._failures["per_source"]
        entry = sources.get(source)
        if entry is not None:
            entry.count -= 1
            if entry.count <= 0:
                del sources[source]

    def failures(self, limit: str, key: str) -> int:
        """Failures in a row counted for a key (0 if none or forgotten)."""
        entry = self._failures[limit].get(key)
        if entry is None or self._clock_s() - entry.last_s >= self._backoff(limit).forget_after_s:
            return 0
        return entry.count

    def tracked(self) -> int:
        """How many keys are remembered."""
        return sum(len(d) for d in self._failures.values())

    def _backoff(self, limit: str) -> Backoff:
        backoff: Backoff = getattr(self.limits, limit)
        return backoff

    def _locked_until(self, limit: str, key: str) -> float:
        entry = self._failures[limit].get(key)
        if entry is None:
            return -math.inf
        return entry.last_s + self._backoff(limit).delay_s(entry.count)

    def _forget_stale(self, now: float) -> None:
        for limit, failures in self._failures.items():
            forget_after_s = self._backoff(limit).forget_after_s
            while failures:
                key = next(iter(failures))
                if now - failures[key].last_s < forget_after_s:
                    break
                del failures[key]


def source_of(peer: str, forwarded_for: str | None = None) -> str:
    """The throttling key of a call's source.

    `peer` is gRPC's peer string ('ipv4:10.0.0.1:5000', 'ipv6:[::1]:5000',
    'unix:/path'). `forwarded_for` is the value of a trusted forwarded-for
    header when the operator enabled one: its last entry is the address the
    trusted gateway saw (the ones before it are whatever the client wrote).
    IPv6 addresses are reduced to their /64."""
    address = peer
    if forwarded_for:
        address = forwarded_for.rsplit(",", 1)[-1].strip()
    else:
        kind, _, rest = peer.partition(":")
        if kind == "ipv4":
            address = rest.rsplit(":", 1)[0]
        elif kind == "ipv6":
            address = rest.rsplit(":", 1)[0].strip("[]")
    address = address.split("%", 1)[0]  # an IPv6 zone id is not part of the address
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address  # not an IP (a unix socket): the string itself
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)
