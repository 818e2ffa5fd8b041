"""The queue and fleet gauges of services/driver/metrics.py, read from the database by a loop."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge

from services.db.database import Database
from services.driver.loop import Loop
from services.driver.metrics import READY_CORES, READY_JOBS, RUNNING_CORES, RUNNING_JOBS, WORKERS

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
"""Only users with work queued or running: the series of a user whose jobs all ended go (every user who
ever ran anything keeps rows in the table)."""

_WORKERS = """
SELECT inst_coll, state, COUNT(*) AS n FROM instances WHERE state <> 'deleted' GROUP BY inst_coll, state
"""

GAUGES_PERIOD_S = 5.0


class FleetGauges(Loop):
    """Sets the queue and fleet gauges from the database while this driver leads."""

    name = "fleet-gauges"

    def __init__(self, db: Database, leading: Callable[[], bool], period_s: float = GAUGES_PERIOD_S):
        super().__init__(period_s)
        self._db = db
        self._leading = leading

    async def cycle(self) -> None:
        if not self._leading():
            for gauge in (READY_JOBS, READY_CORES, RUNNING_JOBS, RUNNING_CORES, WORKERS):
                gauge.clear()  # the leader's figures are the ones to read
            return
        queues = await self._db.fetchall(_QUEUES, name="metrics_queues")
        workers = await self._db.fetchall(_WORKERS, name="metrics_workers")
        values = {
            READY_JOBS: {(r["inst_coll"], r["user"]): int(r["ready_jobs"]) for r in queues},
            READY_CORES: {(r["inst_coll"], r["user"]): int(r["ready_mcpu"]) / 1000 for r in queues},
            RUNNING_JOBS: {(r["inst_coll"], r["user"]): int(r["running_jobs"]) for r in queues},
            RUNNING_CORES: {(r["inst_coll"], r["user"]): int(r["running_mcpu"]) / 1000 for r in queues},
            WORKERS: {(r["inst_coll"], r["state"]): int(r["n"]) for r in workers},
        }
        for gauge, by_labels in values.items():
            _set_all(gauge, by_labels)


def _set_all(gauge: Gauge, by_labels: dict[tuple[str, str], float]) -> None:
    """The gauge's series become exactly `by_labels`: those no longer there go (a user whose jobs all ran)."""
    for labels, value in by_labels.items():
        gauge.labels(*labels).set(value)
    for sample in list(gauge.collect()[0].samples):
        labels = tuple(sample.labels.values())
        if labels not in by_labels:
            gauge.remove(*labels)
