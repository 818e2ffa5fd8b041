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
from typing import Any

from services.db.database import Database
from services.db.store import JobStore
from services.policy.fair_share import cancel_shares
from services.driver.loop import Loop
from services.driver.metrics import JOBS_CANCELLED

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

# Per running batch: its Pending jobs under cancelled groups, from counts the
# procedures keep, not from jobs: a cancelled group's committed jobs minus the
# completed, Ready, Creating and Running ones of its subtree. (Reading Pending
# jobs instead walked the index entries of those cancelled before, which
# InnoDB keeps until it purges them: 90 ms a cycle in a million-job drain.)
# Only the outermost cancelled groups count, so nothing is counted twice;
# always_run jobs count too, though they wait for their parents. The
# subqueries are scalar, read per cancelled group: as EXISTS, MariaDB would
# materialize them over every batch.
_PENDING_DRAINABLE = """
SELECT b.user, b.batch_id,
       SUM(g.n_jobs
           - (SELECT COALESCE(SUM(s.n_completed), 0) FROM job_groups_n_jobs_in_complete_states s
              WHERE s.batch_id = g.batch_id AND s.job_group_id = g.job_group_id)
           - (SELECT COALESCE(SUM(r.n_ready_cancellable_jobs + r.n_ready_always_run_jobs
                                  + r.n_ready_dependency_failed_jobs + r.n_creating_jobs + r.n_running_jobs), 0)
              FROM job_group_self_and_ancestors a
              JOIN user_inst_coll_resources_by_job_group r FORCE INDEX (user_resources_batch)
                ON r.batch_id = a.batch_id AND r.job_group_id = a.job_group_id
              WHERE a.batch_id = g.batch_id AND a.ancestor_id = g.job_group_id)) AS n
FROM batches b FORCE INDEX (batches_state)
JOIN job_groups_cancelled c ON c.batch_id = b.batch_id
JOIN job_groups g ON g.batch_id = c.batch_id AND g.job_group_id = c.job_group_id
WHERE b.state = 'running'
  AND (SELECT COUNT(*) FROM job_group_self_and_ancestors up
       JOIN job_groups_cancelled cu ON cu.batch_id = up.batch_id AND cu.job_group_id = up.ancestor_id
       WHERE up.batch_id = c.batch_id AND up.job_group_id = c.job_group_id AND up.ancestor_id <> c.job_group_id) = 0
GROUP BY b.user, b.batch_id
HAVING n > 0
ORDER BY b.user, b.batch_id
"""


def _nothing() -> None:
    return None


class ReadyCanceller(Loop):
    """Drains Ready and Pending jobs that must not run; see the module docstring."""

    name = "cancel-ready"

    def __init__(self, db: Database, store: JobStore, epoch: Callable[[], int | None], period_s: float = 5.0,
                 per_cycle: int = 5000, minimum_per_user: int = 500, pending_per_cycle: int = 5000,
                 pending_minimum_per_user: int = 500, on_cancelled: Callable[[], None] = _nothing):
        super().__init__(period_s)
        self._db = db
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

    async def drainable(self) -> list[dict[str, Any]]:
        """(user, batch_id, n) of every running batch with Ready jobs to drain."""
        return await self._db.fetchall(_DRAINABLE, name="cancel_ready_drainable")

    async def pending_drainable(self) -> list[dict[str, Any]]:
        """(user, batch_id, n) of every running batch with Pending jobs of cancelled groups
        (always_run ones included)."""
        return await self._db.fetchall(_PENDING_DRAINABLE, name="cancel_pending_drainable")

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
        return cancelled

    async def _drain_pending(self, epoch: int) -> int:
        rows = await self.pending_drainable()
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row["user"]] = by_user.get(row["user"], 0) + int(row["n"])
        shares = cancel_shares(by_user, total=self.pending_per_cycle, minimum=self.pending_minimum_per_user)
        cancelled = 0
        for row in rows:
            left = shares.get(row["user"], 0)
            if left <= 0:
                continue
            n = await self._store.cancel_pending_jobs(epoch, row["batch_id"], min(left, int(row["n"])))
            shares[row["user"]] = left - n
            cancelled += n
        return cancelled
