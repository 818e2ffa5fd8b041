"""The worker session's protocol number, and which pairs of driver and worker may talk.

The contract only adds (tests/unit/test_contract_compatibility.py), so a
driver understands workers of the release before it. The number says what a
side may expect of the other beyond that; it goes up when a release starts
to rely on something the release before did not do. One direction of a
rolling upgrade is supported: drivers first. A driver takes workers of its
own protocol and of the one before; a worker newer than its driver is
refused, by the driver when it knows the number (FAILED_PRECONDITION on
Hello) and by the worker when the driver predates numbering (its Welcome
says 0): the worker then stops, saying why, rather than run jobs for a
driver that may not understand it. docs/operations.md (Upgrades).
"""

from __future__ import annotations

PROTOCOL = 2
"""This release's. 1: every release before the number was sent."""
OLDEST_WORKER = PROTOCOL - 1
"""The oldest worker protocol a driver of this release takes."""


def spoken(number: int) -> int:
    """The protocol a Hello or Welcome says (0: from before numbering, which is 1)."""
    return number or 1


def worker_refusal(worker: int) -> str:
    """Why a driver of this release refuses a worker speaking `worker`, or ''."""
    if worker > PROTOCOL:
        return (f"this worker speaks session protocol {worker}, newer than this driver's {PROTOCOL}: upgrade the "
                "drivers before the workers")
    if worker < OLDEST_WORKER:
        return (f"this worker speaks session protocol {worker}; this driver takes {OLDEST_WORKER} to {PROTOCOL}: "
                "replace the worker with one of this release")
    return ""


def driver_refusal(driver: int) -> str:
    """Why a worker of this release will not work for a driver speaking `driver`, or ''."""
    if driver < PROTOCOL:
        return (f"the driver speaks session protocol {driver}, older than this worker's {PROTOCOL}: upgrade the "
                "drivers before the workers")
    return ""
