"""Billing limits (design §4): cancel the running batches of every billing
project whose cost reached its limit.

The cost of a project is kept current by the billing triggers
(`aggregated_billing_project_resources`, a few hundred rows per project at
most), so each cycle one procedure compares every limited project's cost
with its `limit_usd` and cancels up to `per_cycle` of the running batches
of those over it (`cancelled_by` 'corral', reason 'billing limit
reached'), the oldest first; the cancellers then drain them. The limit is
enforced after the fact: what runs until the next cycle is still billed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.db.store import JobStore, wall_clock_ms
from services.driver.loop import Loop

log = logging.getLogger(__name__)

def _nothing() -> None:
    return None


class BillingLimits(Loop):
    """Cancels the running batches of projects over their limit; see the module docstring."""

    name = "billing-limits"

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
        """Batches this loop has cancelled since it started."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        n = await self._store.cancel_batches_over_limit(epoch, self.per_cycle, self._clock_ms())
        if n:
            self.cancelled_total += n
            log.info("%s: cancelled %d batches of billing projects over their limit", self.name, n)
            self._on_cancelled()
        if n == self.per_cycle:
            self.notify()  # there may be more beyond this cycle's bound
