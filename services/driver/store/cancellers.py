"""The cancellers' reads: what each running batch has to drain, and which of its started jobs to stop.

Every count comes from the tokenized counters (`user_inst_coll_resources_by_job_group`) and the
counts the procedures keep, not from scanning jobs; only the running canceller reads jobs, a
bounded page of one batch at a time.
"""

from __future__ import annotations

import dataclasses

from services.db.database import Database
from services.db.plan_snapshot import CANCELLED_GROUPS

# Per running batch: Ready jobs that depend on a failed parent, plus the
# cancellable Ready jobs of groups with a cancelled self or ancestor.
_READY_DRAINABLE = """
SELECT r.user, r.batch_id,
       SUM(r.n_ready_dependency_failed_jobs + IF(gc.batch_id IS NULL, 0, r.n_ready_cancellable_jobs)) AS n
FROM user_inst_coll_resources_by_job_group r
JOIN batches b ON b.batch_id = r.batch_id AND b.state = 'running'
LEFT JOIN (SELECT DISTINCT batch_id, job_group_id FROM job_groups_cancelled_self_or_ancestor) gc
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

# Per running batch: its Creating and Running jobs that may be cancelled, in
# groups with a cancelled self or ancestor. The counters are per group and
# never touched by a cancellation, so this is a read of a few rows per
# cancelled group.
_RUNNING_DRAINABLE = f"""
SELECT r.user, r.batch_id, SUM(r.n_creating_cancellable_jobs + r.n_running_cancellable_jobs) AS n
FROM {CANCELLED_GROUPS} gc
JOIN user_inst_coll_resources_by_job_group r ON r.batch_id = gc.batch_id AND r.job_group_id = gc.job_group_id
GROUP BY r.user, r.batch_id
HAVING n > 0
ORDER BY r.user, r.batch_id
"""

# Up to N of one batch's cancellable Creating and Running jobs, after a job id.
_CANCELLABLE_STARTED = """
SELECT j.batch_id, j.job_id, j.state, j.attempt_id, a.instance_name
FROM jobs j
JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id AND a.attempt_id = j.attempt_id
WHERE j.batch_id = %s AND j.state IN ('Creating', 'Running') AND NOT j.always_run AND j.job_id > %s
  AND j.job_group_id IN (SELECT x.job_group_id FROM job_groups_cancelled_self_or_ancestor x WHERE x.batch_id = %s)
ORDER BY j.job_id
LIMIT %s
"""


@dataclasses.dataclass(frozen=True)
class Drainable:
    """How many jobs of one user's running batch a canceller has to drain."""

    user: str
    batch_id: int
    n: int


@dataclasses.dataclass(frozen=True)
class StartedJob:
    """A Creating or Running job of a cancelled group, with its current attempt."""

    batch_id: int
    job_id: int
    state: str
    """'Creating' or 'Running'."""
    attempt_id: str
    instance_name: str


class CancellerReads:
    """The reads of the Ready and Running cancellers (module docstring)."""

    db: Database

    async def _drainable(self, sql: str, name: str) -> list[Drainable]:
        return [Drainable(r["user"], int(r["batch_id"]), int(r["n"])) for r in await self.db.fetchall(sql, name=name)]

    async def ready_drainable(self) -> list[Drainable]:
        """Every running batch with Ready jobs to drain (of cancelled groups, or with a failed dependency),
        by user and batch."""
        return await self._drainable(_READY_DRAINABLE, "cancel_ready_drainable")

    async def pending_drainable(self) -> list[Drainable]:
        """Every running batch with Pending jobs of cancelled groups (always_run ones included), by user
        and batch."""
        return await self._drainable(_PENDING_DRAINABLE, "cancel_pending_drainable")

    async def running_drainable(self) -> list[Drainable]:
        """Every running batch with Creating or Running jobs of cancelled groups to stop, by user and batch."""
        return await self._drainable(_RUNNING_DRAINABLE, "cancel_running_drainable")

    async def cancellable_started(self, batch_id: int, after_job_id: int, limit: int) -> list[StartedJob]:
        """Up to `limit` of the batch's Creating and Running jobs of cancelled groups (not always_run), by
        job id after `after_job_id`."""
        rows = await self.db.fetchall(_CANCELLABLE_STARTED, (batch_id, after_job_id, batch_id, limit),
                                      name="cancel_running_jobs")
        return [StartedJob(int(r["batch_id"]), int(r["job_id"]), r["state"], r["attempt_id"], r["instance_name"])
                for r in rows]
