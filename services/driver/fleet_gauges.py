"""The queue and fleet gauges of services/driver/metrics.py, read from the database by a loop."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import Gauge

from services.driver.loop import Loop
from services.driver.metrics import READY_CORES, READY_JOBS, RUNNING_CORES, RUNNING_JOBS, WORKERS
from services.driver.store import DriverStore

GAUGES_PERIOD_S = 5.0


class FleetGauges(Loop):
    """Sets the queue and fleet gauges from the database while this driver leads."""

    name = "fleet-gauges"

    def __init__(self, store: DriverStore, leading: Callable[[], bool], period_s: float = GAUGES_PERIOD_S):
        super().__init__(period_s)
        self._store = store
        self._leading = leading

    async def cycle(self) -> None:
        if not self._leading():
            for gauge in (READY_JOBS, READY_CORES, RUNNING_JOBS, RUNNING_CORES, WORKERS):
                gauge.clear()  # the leader's figures are the ones to read
            return
        queues = await self._store.queue_loads()
        workers = await self._store.worker_counts()
        values = {
            READY_JOBS: {(q.inst_coll, q.user): q.ready_jobs for q in queues},
            READY_CORES: {(q.inst_coll, q.user): q.ready_mcpu / 1000 for q in queues},
            RUNNING_JOBS: {(q.inst_coll, q.user): q.running_jobs for q in queues},
            RUNNING_CORES: {(q.inst_coll, q.user): q.running_mcpu / 1000 for q in queues},
            WORKERS: {(w.inst_coll, w.state): w.n for w in workers},
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
