"""The reads behind what the driver reports outward: the body of a completed batch's callback, and the
queue and fleet gauges of services/driver/metrics.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from services.db.database import Database

_CALLBACK_DETAILS = """
SELECT b.batch_id, b.user, b.billing_project,
       EXISTS (SELECT 1 FROM job_groups_cancelled c WHERE c.batch_id = b.batch_id AND c.job_group_id = 0)
         AS cancelled,
       (SELECT COALESCE(SUM(a.`usage` * r.rate_usd), 0)
        FROM aggregated_job_group_resources a JOIN resources r ON r.resource_id = a.resource_id
        WHERE a.batch_id = b.batch_id AND a.job_group_id = 0) AS cost_usd,
       COALESCE(SUM(s.n_completed), 0) AS n_completed, COALESCE(SUM(s.n_succeeded), 0) AS n_succeeded,
       COALESCE(SUM(s.n_failed), 0) AS n_failed, COALESCE(SUM(s.n_errored), 0) AS n_errored,
       COALESCE(SUM(s.n_cancelled), 0) AS n_cancelled
FROM batches b
LEFT JOIN job_groups_n_jobs_in_complete_states s ON s.batch_id = b.batch_id AND s.job_group_id = 0
WHERE b.batch_id IN ({ids})
GROUP BY b.batch_id, b.user, b.billing_project
"""

_BATCH_ATTRIBUTES = "SELECT batch_id, `key`, `value` FROM batch_attributes WHERE batch_id IN ({ids})"

# Only users with work queued or running: the series of a user whose jobs all ended go (every user who
# ever ran anything keeps rows in the table).
_QUEUES = """
SELECT user, inst_coll,
       SUM(n_ready_cancellable_jobs + n_ready_always_run_jobs) AS ready_jobs,
       SUM(ready_cancellable_cores_mcpu + ready_always_run_cores_mcpu) AS ready_mcpu,
       SUM(n_creating_jobs + n_running_jobs) AS running_jobs,
       SUM(running_cores_mcpu) AS running_mcpu
FROM user_inst_coll_resources_by_job_group
GROUP BY user, inst_coll
HAVING ready_jobs > 0 OR running_jobs > 0
"""

_WORKERS = """
SELECT inst_coll, state, COUNT(*) AS n FROM instances WHERE state <> 'deleted' GROUP BY inst_coll, state
"""


@dataclasses.dataclass(frozen=True)
class QueueLoad:
    """One user's queued and running work in one pool."""

    user: str
    inst_coll: str
    ready_jobs: int
    ready_mcpu: int
    running_jobs: int
    """Creating and Running."""
    running_mcpu: int


@dataclasses.dataclass(frozen=True)
class WorkerCount:
    """How many instances of a pool are in a state (not deleted)."""

    inst_coll: str
    state: str
    n: int


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class ReportReads:
    """The reads behind callbacks and gauges (module docstring)."""

    db: Database

    async def callback_details(self, batch_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        """Per batch: batch_id, user, billing_project, cancelled, cost_usd and its root group's n_completed,
        n_succeeded, n_failed, n_errored and n_cancelled."""
        rows = await self.db.fetchall(_CALLBACK_DETAILS.format(ids=_marks(len(batch_ids))), tuple(batch_ids),
                                      name="callback_details")
        return {int(r["batch_id"]): r for r in rows}

    async def batch_attributes(self, batch_ids: Sequence[int]) -> dict[int, dict[str, str]]:
        """Each batch's attributes (a batch without any: {})."""
        attributes: dict[int, dict[str, str]] = {int(i): {} for i in batch_ids}
        for a in await self.db.fetchall(_BATCH_ATTRIBUTES.format(ids=_marks(len(batch_ids))), tuple(batch_ids),
                                        name="callback_attributes"):
            attributes[int(a["batch_id"])][a["key"]] = a["value"]
        return attributes

    async def queue_loads(self) -> list[QueueLoad]:
        """Per user and pool with work queued or running: its Ready and running jobs and cores."""
        return [QueueLoad(r["user"], r["inst_coll"], int(r["ready_jobs"]), int(r["ready_mcpu"]),
                          int(r["running_jobs"]), int(r["running_mcpu"]))
                for r in await self.db.fetchall(_QUEUES, name="metrics_queues")]

    async def worker_counts(self) -> list[WorkerCount]:
        """Instances by pool and state, the deleted left out."""
        return [WorkerCount(r["inst_coll"], r["state"], int(r["n"]))
                for r in await self.db.fetchall(_WORKERS, name="metrics_workers")]
