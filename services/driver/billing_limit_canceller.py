"""The canceller of batches over their billing limit (design §4): it cancels
the running batches of every billing project whose cost reached its limit.

The cost of a project is kept current by the billing triggers
(`aggregated_billing_project_resources`, a few hundred rows per project at
most), so each cycle one procedure compares every limited project's cost
with its `limit_usd` and cancels up to `per_cycle` of the running batches
of those over it (`cancelled_by` 'corral', reason 'billing limit
reached'), the oldest first; the cancellers then drain them. The limit is
enforced after the fact: what runs until the next cycle is still billed.
"""

from __future__ import annotations

from services.driver.loop import BoundedCanceller


class BillingLimitCanceller(BoundedCanceller):
    """Cancels the running batches of projects over their limit; see the module docstring."""

    name = "billing-limits"
    cancelled_what = "batches of billing projects over their limit"

    async def cancel(self, epoch: int, limit: int, now_ms: int) -> int:
        return await self._store.cancel_batches_over_limit(epoch, limit, now_ms)
