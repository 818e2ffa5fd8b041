"""The shape of every driver loop: a named object that runs one cycle at a time.

A loop wakes when notified (work appeared, a batch was cancelled) or when its
period passes, runs `cycle()`, and tells anyone waiting that a cycle
finished (tests wait on that instead of sleeping). A failing cycle is
logged and retried after a growing back-off; the loop itself never dies
silently.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.metrics import LOOP_FAILURES, LOOP_SECONDS
from services.driver.store import DriverStore

log = logging.getLogger(__name__)


class Loop(abc.ABC):
    """Subclasses implement `cycle()`; `run()` drives it until cancelled."""

    name: str = "loop"

    def __init__(self, period_s: float, max_backoff_s: float = 30.0):
        self.period_s = period_s
        self.max_backoff_s = max_backoff_s
        self._wake = asyncio.Event()
        self._cycle_done = asyncio.Condition()
        self.cycles = 0
        """Cycles finished, successful or not."""
        self.failures = 0
        """Consecutive failed cycles."""

    @abc.abstractmethod
    async def cycle(self) -> None:
        """One pass of the loop's work."""

    def notify(self) -> None:
        """Run the next cycle now rather than at the end of the period."""
        self._wake.set()

    async def run(self) -> None:
        """Cycle until cancelled."""
        seconds, failures = LOOP_SECONDS.labels(self.name), LOOP_FAILURES.labels(self.name)
        while True:
            self._wake.clear()
            started = time.perf_counter()
            try:
                await self.cycle()
                self.failures = 0
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a loop logs, backs off and goes on
                self.failures += 1
                failures.inc()
                log.exception("%s: cycle failed (%d in a row)", self.name, self.failures)
            seconds.observe(time.perf_counter() - started)
            async with self._cycle_done:
                self.cycles += 1
                self._cycle_done.notify_all()
            delay = self.period_s if not self.failures else min(self.max_backoff_s, self.period_s * 2**self.failures)
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation
            # that arrives as the wake-up completes (CPython gh-86296), and the
            # loop would run on after its task was cancelled.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

    async def wait_cycles(self, n: int = 1, timeout_s: float = 30.0) -> None:
        """Wait until `n` more cycles have finished (for tests and shutdown)."""
        async with self._cycle_done:
            target = self.cycles + n
            async with asyncio.timeout(timeout_s):
                await self._cycle_done.wait_for(lambda: self.cycles >= target)


def _nothing() -> None:
    return None


class BoundedCanceller(Loop):
    """A loop whose cycle is one set-based procedure that cancels up to
    `per_cycle` things (batches, groups) and returns how many; it tells the
    cancellers (`on_cancelled`) and runs again at once while it hits the bound.
    Subclasses name the procedure (`cancel`) and what it cancels (`cancelled_what`)."""

    cancelled_what: str = "things"
    """For the log line: 'cancelled N <cancelled_what>'."""

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None], period_s: float = 10.0,
                 per_cycle: int = 1000, clock_ms: Callable[[], int] = wall_clock_ms,
                 on_cancelled: Callable[[], None] = _nothing):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.per_cycle = per_cycle
        self._clock_ms = clock_ms
        self._on_cancelled = on_cancelled
        self.cancelled_total = 0
        """What this loop has cancelled since it started."""

    @abc.abstractmethod
    async def cancel(self, epoch: int, limit: int, now_ms: int) -> int:
        """Cancel up to `limit`; how many were cancelled."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        n = await self.cancel(epoch, self.per_cycle, self._clock_ms())
        if n:
            self.cancelled_total += n
            log.info("%s: cancelled %d %s", self.name, n, self.cancelled_what)
            self._on_cancelled()
        if n == self.per_cycle:
            self.notify()  # there may be more beyond this cycle's bound
