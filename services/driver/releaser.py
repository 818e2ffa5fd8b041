"""The releaser: finishes releasing the children of completed parents, in chunks.

A completion (MJC, the cancellers' drains) releases at most a thousand
children of the jobs it completes in its own transaction and queues the
rest in `job_child_releases` (see `complete_jobs_core.sql`). Each cycle of
this loop calls `release_children` once: up to `per_call` children (5,000)
of up to `max_parents` queued parents (100), the least recently served
first, so a parent with a million children takes 200 short transactions and
shares them with every other queued parent instead of holding up their
children. Children left without pending parents become Ready; the loop
tells the scheduler and the canceller (`on_released`) and runs again at once
while the queue has more.

Every call is fenced by the leader epoch and moves the queue and the
children in one transaction, so a failover in the middle loses nothing and
counts nothing twice: the next leader goes on from the last committed row.
"""

from __future__ import annotations

from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.store import DriverStore


def _nothing() -> None:
    return None


class ChildReleaser(Loop):
    """Drains `job_child_releases`; see the module docstring."""

    name = "release-children"

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None], period_s: float = 1.0,
                 per_call: int = 5000, max_parents: int = 100, clock_ms: Callable[[], int] = wall_clock_ms,
                 on_released: Callable[[], None] = _nothing):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.per_call = per_call
        """Children released per transaction, at most."""
        self.max_parents = max_parents
        """Queued parents served per transaction, at most (they share `per_call`)."""
        self._clock_ms = clock_ms
        self._on_released = on_released
        self.released_total = 0
        """Children this loop has released since it started."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        status = await self._store.release_children(epoch, self.per_call, self.max_parents, self._clock_ms())
        n_children, n_parents = int(status["n_children"]), int(status["n_parents"])
        if n_children:
            self.released_total += n_children
            self._on_released()
        if n_parents > int(status["n_finished"]) or n_parents == self.max_parents:
            self.notify()  # parents with children left, or more parents queued
