"""The completion re-check (design §4, docs/known-limits.md).

Groups and batches complete in `check_completions`, which runs *after* the
COMMIT of the call that finished their last jobs (the counters are
tokenized: no transaction can see whether it finished a group). A process
that dies between its COMMIT and that check leaves a finished group
running, and its batch without a completion (and so without a callback),
until something checks again. A retried call re-checks by itself; this loop
covers the calls that are never retried. Each cycle one procedure finds up
to `per_cycle` running groups whose committed completions reached `n_jobs`
(from the tokenized counters), plus running batches whose root group
completed without them, and runs the same check on them. The check decides
under row locks, so running it on a group that is not finished, or that
another caller completes first, changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.store import DriverStore

log = logging.getLogger(__name__)


class CompletionChecker(Loop):
    """Completes finished groups and batches left running; see the module docstring."""

    name = "completion-recheck"

    def __init__(self, store: DriverStore, epoch: Callable[[], int | None], period_s: float = 30.0,
                 per_cycle: int = 1000, clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._store = store
        self._epoch = epoch
        self.per_cycle = per_cycle
        self._clock_ms = clock_ms
        self.completed_groups_total = 0
        """Groups found finished and complete after this loop's check, since it started."""

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        status = await self._store.recheck_completions(epoch, self.per_cycle, self._clock_ms())
        n_checked, n_complete = int(status["n_checked"]), int(status["n_complete"])
        if n_complete:
            self.completed_groups_total += n_complete
            # Healthy processes leave nothing for this loop: each find means a
            # call died between its COMMIT and its check.
            log.warning("%s: completed %d job groups (%d batches) left running", self.name, n_complete,
                        int(status["n_batches_complete"]))
        if n_checked >= self.per_cycle:
            self.notify()  # there may be more beyond this cycle's bound
