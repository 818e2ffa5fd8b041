"""The event publisher: numbers the batch events producers left in the outbox.

Every job state change, commit, cancellation and completion appends a row
to `batch_event_outbox` in its own transaction, unnumbered (numbering there
would serialize a batch's completions on one counter row). This loop, run
only by the leading driver, calls `publish_batch_events` to move committed
rows into `batch_events` with each batch's next contiguous ids, a page at a
time, until a page comes back short; WatchBatch streams from there. Rows of
transactions still open are skipped by the procedure and moved by a later
cycle, so nothing is lost (docs/driver.md, "Events").

It wakes on the driver's job changes and otherwise every `period_s`: events
written by the frontend (commits, cancellations) wait at most that long.
With `cost_period_s` set, every that often a cycle also asks for cost
events of running batches whose cost grew.
"""

from __future__ import annotations

from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.store import DriverStore


class EventPublisher(Loop):
    """Moves the outbox into the batch event log while this driver leads."""

    name = "publish-events"

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None], period_s: float = 0.25,
                 page_size: int = 1000, cost_period_s: float | None = 5.0,
                 clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.page_size = page_size
        """Outbox rows moved per transaction: short transactions, bounded lock sets."""
        self.cost_period_ms = None if cost_period_s is None else round(cost_period_s * 1000)
        """Least time between two cost events of one batch; None: no cost events."""
        self._clock_ms = clock_ms
        self._last_cost_pass_ms: int | None = None
        self.published_total = 0
        """Outbox rows moved since this loop started."""
        self.cost_events_total = 0
        """Cost events written since this loop started."""

    def _cost_pass_due(self) -> bool:
        if self.cost_period_ms is None:
            return False
        now_ms = self._clock_ms()
        if self._last_cost_pass_ms is not None and now_ms - self._last_cost_pass_ms < self.cost_period_ms:
            return False
        self._last_cost_pass_ms = now_ms
        return True

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        # The procedure throttles cost events per batch too; asking only every
        # cost period keeps the scan of running batches off most cycles.
        cost_interval_ms = self.cost_period_ms if self._cost_pass_due() else None
        while True:
            status = await self._store.publish_batch_events(epoch, self.page_size, cost_interval_ms)
            moved = int(status["n_published"])
            self.published_total += moved
            self.cost_events_total += int(status["n_cost_events"])
            cost_interval_ms = None
            if moved < self.page_size:
                return
