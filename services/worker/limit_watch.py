"""The watch over a running attempt's limits that the kernel does not end by
itself: processes (a fork refused at the job's own cap: a fork bomb never
stops) and scratch storage (no quota holds a job's writes to its request).
Both runtimes run one per attempt beside the command, and kill the attempt
when it returns (host_limits.py has the rules and the words).

Each `Check` has its own period; a check that took long waits ten times its
own time before it runs again (host_limits.next_check_delay_s), so a job
with a million files costs the worker at most a tenth of a core in walks.
A check that raises is logged and tried again at its next turn: the watch
never dies silently, and never kills a job for the worker's own trouble.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.worker.host_limits import next_check_delay_s

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Check:
    """One limit the watch reads."""

    name: str
    """What it checks, for the log ('processes', 'storage')."""
    interval_s: float
    """How often it runs (at most: see next_check_delay_s)."""
    probe: Callable[[], str | None]
    """Reads the limit; returns why the attempt must be killed, or None. Blocking when `in_thread`."""
    in_thread: bool = False
    """Run the probe in a thread (a walk of a directory tree), not on the event loop (a few small reads)."""


class LimitWatch:
    """Runs its checks until one says the attempt went over its limit (`run` returns its words)."""

    def __init__(self, checks: list[Check], clock: Callable[[], float] = time.monotonic,
                 on_cycle: Callable[[str], None] = lambda name: None):
        self._checks = checks
        self._clock = clock
        self._on_cycle = on_cycle
        """Called with a check's name after each run of it (for tests)."""

    async def run(self) -> str:
        """Check until a limit is passed; returns why. Never returns while the attempt keeps within its limits
        (it is cancelled when the attempt ends)."""
        if not self._checks:
            await asyncio.Event().wait()
        due = {check.name: self._clock() + check.interval_s for check in self._checks}
        while True:
            check = min(self._checks, key=lambda c: due[c.name])
            await asyncio.sleep(max(0.0, due[check.name] - self._clock()))
            began = self._clock()
            try:
                reason = await asyncio.to_thread(check.probe) if check.in_thread else check.probe()
            except Exception:  # noqa: BLE001 - the worker's trouble reading: logged, tried again
                logger.exception("the %s check of a running attempt failed", check.name)
                reason = None
            took = self._clock() - began
            self._on_cycle(check.name)
            if reason is not None:
                return reason
            due[check.name] = self._clock() + next_check_delay_s(check.interval_s, took)
