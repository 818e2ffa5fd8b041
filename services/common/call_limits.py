"""Limits a server puts on every call, whatever the service: the size of a
request, the fields in it, how long a unary call may run, and how many
server streams one caller may hold open.

`services.common.server.serve` takes a `CallLimits`; its request
interceptor enforces them, so no servicer has to remember to.
"""

from __future__ import annotations

import dataclasses

from services.common.errors import ResourceExhausted
from services.common.fields import FieldLimits

DEFAULT_MAX_RECEIVE_MESSAGE_BYTES = 4 * 1024 * 1024
"""gRPC's own default, set explicitly so that it is a decision, not an accident."""


@dataclasses.dataclass(frozen=True)
class CallLimits:
    """What every call to one process's servers must stay within."""

    max_receive_message_bytes: int = DEFAULT_MAX_RECEIVE_MESSAGE_BYTES
    """Largest serialized request; gRPC refuses a larger one with RESOURCE_EXHAUSTED."""
    unary_deadline_s: float | None = None
    """Longest a unary call may run on the server (DEADLINE_EXCEEDED after); None: no limit
    but the client's own deadline. Server streams are exempt."""
    max_streams_per_caller: int | None = None
    """Server streams one principal may hold open at once across the process's listeners
    (RESOURCE_EXHAUSTED for one more); None: no limit."""
    field_limits: FieldLimits | None = None
    """Each request's fields are checked against this table (services.common.fields)
    before the servicer sees it: INVALID_ARGUMENT naming every field over its limit."""


class StreamSlots:
    """Server streams open per caller, shared by every listener of one process."""

    def __init__(self, max_per_caller: int):
        self.max_per_caller = max_per_caller
        self._open: dict[str, int] = {}

    def acquire(self, caller: str) -> None:
        """Take a slot for `caller`, or raise ResourceExhausted naming the limit."""
        n = self._open.get(caller, 0)
        if n >= self.max_per_caller:
            raise ResourceExhausted(
                f"{caller} already has {n} streams open on this server, the most allowed "
                f"(max_streams_per_user = {self.max_per_caller}); close one first")
        self._open[caller] = n + 1

    def release(self, caller: str) -> None:
        """Give back a slot `acquire` took."""
        n = self._open[caller] - 1
        if n:
            self._open[caller] = n
        else:
            del self._open[caller]

    def open_streams(self, caller: str) -> int:
        """How many streams `caller` holds open now."""
        return self._open.get(caller, 0)
