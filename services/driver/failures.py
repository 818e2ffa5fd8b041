"""Cancel after N failures: the driver's re-check (design §4).

A batch (its root group) or a job group with `cancel_after_n_failures` is
cancelled once that many of its jobs have failed or errored. MJC does this
itself for the groups of the failures it records, but it reads the
tokenized counters inside its own transaction, so two failures committed
concurrently can each see the count one short of the threshold and neither
cancels (docs/architecture.md, "Known limits"). This loop closes that gap:
each cycle, one set-based procedure cancels up to `per_cycle` running
groups whose committed failures reached their threshold, and the
cancellers are told so they start draining at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.db.store import JobStore, wall_clock_ms
from services.driver.loop import Loop

log = logging.getLogger(__name__)


def _nothing() -> None:
    return None


class FailureCanceller(Loop):
    """Cancels groups whose failures reached their threshold; see the module docstring."""

    name = "cancel-after-failures"

    def __init__(self, store: JobStore, epoch: Callable[[], int | None], period_s: float = 10.0,
                 per_cycle: int = 1000, clock_ms: Callable[[], int] = wall_clock_ms,
                 on_cancelled: Callable[[], None] = _nothing):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.per_cycle = per_cycle
        self._clock_ms = clock_ms
        self._on_cancelled = on_cancelled
        self.cancelled_total = 0
        """Groups this loop has cancelled since it started."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        n = await self._store.cancel_failed_job_groups(epoch, self.per_cycle, self._clock_ms())
        if n:
            self.cancelled_total += n
            log.info("%s: cancelled %d job groups whose failures reached their threshold", self.name, n)
            self._on_cancelled()
        if n == self.per_cycle:
            self.notify()  # there may be more beyond this cycle's bound
