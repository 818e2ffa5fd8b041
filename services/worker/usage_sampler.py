"""The loop that samples the resource usage of a worker's running attempts.

Every `interval_s` it asks the runtime for the counters of each attempt
whose command has started (`ContainerRuntime.sample`, in a thread: it reads
cgroup files) and offers the reading to the attempt's bounded series
(usage_series.py). The end-of-attempt reading is not taken here: the
attempt's runner adds it from the outcome (attempts.py), so it is exact
even when the attempt ends between two ticks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from services.worker.attempts import Attempt, AttemptTable, wall_ms
from services.worker.runtime_api import ContainerRuntime
from services.common.usage_series import UsageReading, UsageSample

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0


class UsageSampler:
    """Samples running attempts every `interval_s` (see the module docstring)."""

    def __init__(self, attempts: AttemptTable, runtime: ContainerRuntime, interval_s: float = DEFAULT_INTERVAL_S,
                 clock_ms: Callable[[], int] = wall_ms, on_cycle: Callable[[], None] = lambda: None):
        if interval_s <= 0:
            raise ValueError("the usage interval must be positive")
        self._attempts = attempts
        self._runtime = runtime
        self.interval_s = interval_s
        self._clock_ms = clock_ms
        self._on_cycle = on_cycle
        """Called after every cycle (tests wait on it)."""

    async def run(self) -> None:
        """Sample until cancelled; a failing cycle is logged and the next one comes as usual."""
        while True:
            try:
                await self.sample_once()
            except Exception:  # noqa: BLE001 - a loop that dies silently would stop every series
                log.exception("sampling the running attempts' usage failed")
            self._on_cycle()
            await asyncio.sleep(self.interval_s)

    async def sample_once(self) -> None:
        """One cycle: a reading of each started, running attempt."""
        started = [a for a in self._attempts.running() if a.started_ms is not None]
        if not started:
            return
        readings = await asyncio.to_thread(self._read, started)
        now_ms = self._clock_ms()
        for attempt, reading in zip(started, readings):
            if reading is not None and attempt.running:  # it may have ended while we read
                attempt.usage.add(UsageSample(now_ms, reading))

    def _read(self, attempts: list[Attempt]) -> list[UsageReading | None]:
        readings: list[UsageReading | None] = []
        for attempt in attempts:
            try:
                readings.append(self._runtime.sample(attempt.ref.attempt_id))
            except OSError as e:  # its cgroup went away under us: the attempt is ending
                log.debug("could not sample %s: %s", attempt.key, e)
                readings.append(None)
        return readings
