"""Limits a server puts on every call, whatever the service: the size of a
request, the fields in it, how long a unary call may run, how many
server streams one caller may hold open, and how much one user may ask
(`UserQuotas`: requests a second, reads at once, submissions a minute).

`services.common.server.serve` takes a `CallLimits`; its request
interceptor enforces them, so no servicer has to remember to.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from services.common.errors import RateLimited, ResourceExhausted
from services.common.fields import FieldLimits
from services.common.identity import Principal
from services.common.rate_limits import NS_PER_S, Buckets, Slots, TokenBucket

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC's own default, set explicitly so that it is a decision, not an accident."""


@dataclasses.dataclass(frozen=True)
class CallLimits:
    """What every call to one process's servers must stay within."""

    max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
    """Largest serialized request; gRPC refuses a larger one with RESOURCE_EXHAUSTED."""
    unary_deadline_s: float | None = None
    """Longest a unary call may run on the server (DEADLINE_EXCEEDED after); None: no limit
    but the client's own deadline. Streams are exempt, server streams and client streams (an image's
    upload, which its servicer bounds) alike."""
    max_streams_per_caller: int | None = None
    """Server streams one principal may hold open at once across the process's listeners
    (RESOURCE_EXHAUSTED for one more); None: no limit."""
    field_limits: FieldLimits | None = None
    """Each request's fields are checked against this table (services.common.fields)
    before the servicer sees it: INVALID_ARGUMENT naming every field over its limit."""
    user_quotas: UserQuotas | None = None
    """How much one user may ask of this process (None: no quota)."""


class StreamSlots:
    """Server streams open per caller, shared by every listener of one process."""

    def __init__(self, max_per_caller: int):
        self.max_per_caller = max_per_caller
        self._open = Slots(max_per_caller)

    def acquire(self, caller: str) -> None:
        """Take a slot for `caller`, or raise ResourceExhausted naming the limit."""
        if not self._open.try_acquire(caller):
            raise ResourceExhausted(
                f"{caller} already has {self._open.held(caller)} streams open on this server, the most allowed "
                f"(max_streams_per_user = {self.max_per_caller}); close one first")

    def release(self, caller: str) -> None:
        """Give back a slot `acquire` took."""
        self._open.release(caller)

    def open_streams(self, caller: str) -> int:
        """How many streams `caller` holds open now."""
        return self._open.held(caller)


@dataclasses.dataclass(frozen=True)
class UserQuotas:
    """What one user may ask of one server process, so that no tenant takes it from the others.
    Every caller but a corral service (a certificate on an internal listener) is a user here:
    people, administrators and service accounts alike, each by their name. The names in
    refusals are the frontend's settings (services.frontend.limits)."""

    requests: TokenBucket | None = None
    """Calls of every kind, stream openings included (None: no limit)."""
    max_concurrent_reads: int | None = None
    """Unary calls of `read_methods` running at once (None: no limit)."""
    read_methods: frozenset[str] = frozenset()
    """Full method names (/package.Service/Method) counted as reads."""
    read_retry_after_s: float = 1.0
    """What a refusal for reads at once says to wait: when one ends is not known in advance."""
    submissions: TokenBucket | None = None
    """Calls of `submission_methods` (None: no limit)."""
    submission_methods: frozenset[str] = frozenset()
    """Full method names counted as submissions."""


class UserLimiter:
    """`UserQuotas` kept for one process: a bucket and a count of reads per user, shared by
    its listeners."""

    def __init__(self, quotas: UserQuotas, clock_ns: Callable[[], int] = time.monotonic_ns):
        self.quotas = quotas
        self._clock_ns = clock_ns
        self._requests = Buckets(quotas.requests) if quotas.requests else None
        self._submissions = Buckets(quotas.submissions) if quotas.submissions else None
        self._reads = Slots(quotas.max_concurrent_reads) if quotas.max_concurrent_reads else None

    def admit(self, principal: Principal, method: str) -> str | None:
        """Admit one call of `principal` to `method`, or raise RateLimited naming the limit and
        when to retry. Returns the key of the read slot the call holds (give it back with
        `release` however the call ends), or None."""
        if principal.kind == "service":
            return None  # corral's own services: never starved by users (their pool is apart too)
        user, now_ns, quotas = principal.name, self._clock_ns(), self.quotas
        if self._requests is not None and quotas.requests is not None:
            wait_ns = self._requests.take(user, now_ns)
            if wait_ns:
                raise _refusal(
                    f"{user} sent more requests than this server takes from one user: "
                    f"{quotas.requests.per_s:g} a second (max_requests_per_user_per_s), "
                    f"{quotas.requests.burst} at once (max_request_burst_per_user)",
                    wait_ns / NS_PER_S, "max_requests_per_user_per_s", user)
        if self._submissions is not None and quotas.submissions is not None and method in quotas.submission_methods:
            wait_ns = self._submissions.take(user, now_ns)
            if wait_ns:
                raise _refusal(
                    f"{user} made more submissions (new batches and updates) than this server takes from one "
                    f"user: {quotas.submissions.burst} a minute (max_submissions_per_user_per_minute)",
                    wait_ns / NS_PER_S, "max_submissions_per_user_per_minute", user)
        if self._reads is not None and method in quotas.read_methods:
            if not self._reads.try_acquire(user):
                raise _refusal(
                    f"{user} already has {self._reads.held(user)} reads running on this server, the most "
                    f"allowed (max_concurrent_reads_per_user = {self._reads.max_per_key}); one at a time is "
                    f"enough for paging", quotas.read_retry_after_s, "max_concurrent_reads_per_user", user)
            return user
        return None

    def release(self, read_slot: str | None) -> None:
        """Give back the read slot `admit` returned (None: nothing)."""
        if read_slot is not None and self._reads is not None:
            self._reads.release(read_slot)

    def reads_running(self, user: str) -> int:
        """Reads `user` has running now."""
        return 0 if self._reads is None else self._reads.held(user)


def _refusal(message: str, retry_after_s: float, quota: str, user: str) -> RateLimited:
    return RateLimited(f"{message}; retry in {retry_after_s:.3g} s", retry_after_s, quota, f"user:{user}")
