"""The canceller of Ready jobs: drains what must not run, fairly between users.

Cancelling a batch or group wrote one row; this loop does the rest. Each
cycle it finds, from the tokenized counters (not by scanning jobs), how
many Ready jobs of each user's batches must not run — their group (or an
ancestor) is cancelled, or a parent ended in a state they do not accept —
gives each user a share (about 300 per cycle, at least 20 each) and drains
each batch with the set-based `cancel_ready_jobs` procedure. Children of the
cancelled jobs are updated in the same transactions, so a cancelled chain
drains one level per cycle; the loop re-runs at once while work remains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.db.database import Database
from services.db.store import JobStore
from services.driver.fair_share import cancel_shares
from services.driver.loop import Loop

# Per running batch: Ready jobs that depend on a failed parent, plus the
# cancellable Ready jobs of groups with a cancelled self or ancestor.
_DRAINABLE = """
SELECT r.user, r.batch_id,
       SUM(r.n_ready_dependency_failed_jobs + IF(gc.batch_id IS NULL, 0, r.n_ready_cancellable_jobs)) AS n
FROM user_inst_coll_resources_by_job_group r
JOIN batches b ON b.batch_id = r.batch_id AND b.state = 'running'
LEFT JOIN (SELECT DISTINCT a.batch_id, a.job_group_id
           FROM job_group_self_and_ancestors a
           JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id) gc
  ON gc.batch_id = r.batch_id AND gc.job_group_id = r.job_group_id
GROUP BY r.user, r.batch_id
HAVING n > 0
ORDER BY r.user, r.batch_id
"""


class ReadyCanceller(Loop):
    """Drains Ready jobs that must not run; see the module docstring."""

    name = "cancel-ready"

    def __init__(self, db: Database, store: JobStore, epoch: Callable[[], int | None], period_s: float = 5.0,
                 per_cycle: int = 300, minimum_per_user: int = 20):
        super().__init__(period_s)
        self._db = db
        self._store = store
        self._epoch = epoch
        self.per_cycle = per_cycle
        self.minimum_per_user = minimum_per_user
        self.cancelled_total = 0
        """Jobs this loop has cancelled since it started."""

    async def drainable(self) -> list[dict[str, Any]]:
        """(user, batch_id, n) of every running batch with something to drain."""
        return await self._db.fetchall(_DRAINABLE, name="cancel_ready_drainable")

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        rows = await self.drainable()
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row["user"]] = by_user.get(row["user"], 0) + int(row["n"])
        shares = cancel_shares(by_user, total=self.per_cycle, minimum=self.minimum_per_user)
        cancelled = 0
        for row in rows:
            left = shares.get(row["user"], 0)
            if left <= 0:
                continue
            n = await self._store.cancel_ready_jobs(epoch, row["batch_id"], min(left, int(row["n"])))
            shares[row["user"]] = left - n
            cancelled += n
        self.cancelled_total += cancelled
        if cancelled:
            self.notify()  # more may have become drainable (children of what we cancelled)
