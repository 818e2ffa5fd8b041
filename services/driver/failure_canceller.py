"""Cancel after N failures: the driver's re-check (design §4).

A batch (its root group) or a job group with `cancel_after_n_failures` is
cancelled once that many of its jobs have failed or errored. MJC does this
itself for the groups of the failures it records, but it reads the
tokenized counters inside its own transaction, so two failures committed
concurrently can each see the count one short of the threshold and neither
cancels (docs/known-limits.md). This loop closes that gap:
each cycle, one set-based procedure cancels up to `per_cycle` running
groups whose committed failures reached their threshold, and the
cancellers are told so they start draining at once.
"""

from __future__ import annotations

from services.driver.loop import BoundedCanceller


class FailureCanceller(BoundedCanceller):
    """Cancels groups whose failures reached their threshold; see the module docstring."""

    name = "cancel-after-failures"
    cancelled_what = "job groups whose failures reached their threshold"

    async def cancel(self, epoch: int, limit: int, now_ms: int) -> int:
        return await self._store.cancel_failed_job_groups(epoch, limit, now_ms)
