"""The canceller of Ready and Pending jobs: drains what must not run, fairly between users.

Cancelling a batch or group wrote one row; this loop does the rest, in two
passes per cycle:

- **Ready jobs.** From the tokenized counters (not by scanning jobs) it
  finds how many Ready jobs of each user's batches must not run — their
  group (or an ancestor) is cancelled, or a parent ended in a state they
  do not accept — gives each user a share (5,000 per cycle, at least 500 each)
  and drains each batch with the set-based `cancel_ready_jobs`. A call
  costs about 4.5 ms plus 37 µs a job, so chunks of thousands are what
  reach 20,000 jobs/s; a 5,000-job call holds its locks for ~0.2 s.
- **Pending jobs of cancelled groups** (not always_run): they could never
  run, so `cancel_pending_jobs` cancels them without waiting for their
  parents, in chunks of thousands (5,000 per cycle shared between users, at
  least 500 each): the bulk of a cancelled million-job fan-out is Pending
  behind its parent, and draining it level by level behind parents ran at
  a few jobs per second. How many each batch has comes from counts the
  procedures keep (a cancelled group's committed jobs minus its completed,
  Ready, Creating and Running ones), again without scanning jobs.

Children of the cancelled jobs are released in the same transactions (the
first thousand; the releaser takes the rest). A child left Ready with a
failed dependency is taken by the next cycle, so a chain of failed
dependencies outside cancelled groups still drains one level per cycle;
the loop re-runs at once while it cancels something, and tells
`on_cancelled` (the releaser) when it did.
"""

from __future__ import annotations

from collections.abc import Callable

from services.policy.fair_share import cancel_shares
from services.driver.loop import Loop
from services.driver.metrics import JOBS_CANCELLED
from services.driver.store import Drainable, DriverStore


def _nothing() -> None:
    return None


class ReadyCanceller(Loop):
    """Drains Ready and Pending jobs that must not run; see the module docstring."""

    name = "cancel-ready"

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None], period_s: float = 5.0,
                 per_cycle: int = 5000, minimum_per_user: int = 500, pending_per_cycle: int = 5000,
                 pending_minimum_per_user: int = 500, on_cancelled: Callable[[], None] = _nothing):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.per_cycle = per_cycle
        """Ready jobs drained per cycle, shared between users."""
        self.minimum_per_user = minimum_per_user
        """Ready jobs each user with some gets per cycle, at least."""
        self.pending_per_cycle = pending_per_cycle
        """Pending jobs of cancelled groups drained per cycle, shared between users."""
        self.pending_minimum_per_user = pending_minimum_per_user
        """Pending jobs each user with some gets per cycle, at least."""
        self._on_cancelled = on_cancelled
        self.cancelled_total = 0
        """Jobs this loop has cancelled since it started."""

    async def drainable(self) -> list[Drainable]:
        """Every running batch with Ready jobs to drain."""
        return await self._store.ready_drainable()

    async def pending_drainable(self) -> list[Drainable]:
        """Every running batch with Pending jobs of cancelled groups (always_run ones included)."""
        return await self._store.pending_drainable()

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        cancelled = await self._drain_ready(epoch) + await self._drain_pending(epoch)
        self.cancelled_total += cancelled
        JOBS_CANCELLED.labels(self.name).inc(cancelled)
        if cancelled:
            self._on_cancelled()
            self.notify()  # more may have become drainable (children of what we cancelled)

    async def _drain_ready(self, epoch: int) -> int:
        rows = await self.drainable()
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row.user] = by_user.get(row.user, 0) + row.n
        shares = cancel_shares(by_user, total=self.per_cycle, minimum=self.minimum_per_user)
        cancelled = 0
        for row in rows:
            left = shares.get(row.user, 0)
            if left <= 0:
                continue
            n = await self._store.cancel_ready_jobs(epoch, row.batch_id, min(left, row.n))
            shares[row.user] = left - n
            cancelled += n
        return cancelled

    async def _drain_pending(self, epoch: int) -> int:
        rows = await self.pending_drainable()
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row.user] = by_user.get(row.user, 0) + row.n
        shares = cancel_shares(by_user, total=self.pending_per_cycle, minimum=self.pending_minimum_per_user)
        cancelled = 0
        for row in rows:
            left = shares.get(row.user, 0)
            if left <= 0:
                continue
            n = await self._store.cancel_pending_jobs(epoch, row.batch_id, min(left, row.n))
            shares[row.user] = left - n
            cancelled += n
        return cancelled
