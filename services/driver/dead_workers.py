"""The dead-worker detector: instances whose worker fell silent are deactivated and their machines
deleted; their running jobs run again as new attempts."""

from __future__ import annotations

import logging
from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.loop import Loop
from services.driver.providers.interface import InstanceProvider
from services.driver.store import DriverStore

log = logging.getLogger(__name__)


class DeadWorkerDetector(Loop):
    """Deactivates instances whose heartbeats stopped and whose worker has not been heard from on a
    session within the deadline (`live`: a session that stays open but silent, as a partitioned worker's
    does, does not keep it alive); their running jobs go back to Ready and run again as a new attempt.

    A deadline is only fair if the driver could see the worker all along. So
    it runs from the instance's last heartbeat (or activation, or creation),
    but never from before `watching_since_ms()`: the moment this driver was
    elected, or its database came back after an outage. A worker whose
    heartbeats went unrecorded while there was no leader, or no database, gets
    a full deadline from then to report in. (Issue 10: a new leader declared
    two live workers dead 7 s after a 45 s database outage.) Every time here
    is this driver's clock: `last_heartbeat_ms` is written with the leader's
    clock, and an older leader's (skewed) one is bounded by this driver's own
    election moment."""

    name = "dead-workers"

    def __init__(self, store: DriverStore, provider: InstanceProvider, live: Callable[[], set[str]],
                 epoch: Callable[[], int | None], heartbeat_timeout_s: float = 30.0,
                 activation_timeout_s: float = 120.0, clock_ms: Callable[[], int] = wall_clock_ms,
                 period_s: float = 5.0, watching_since_ms: Callable[[], int] = lambda: 0):
        super().__init__(period_s)
        self._store = store
        self._provider = provider
        self._live = live
        self._epoch = epoch
        self._timeout_ms = int(heartbeat_timeout_s * 1000)
        self._activation_timeout_ms = int(activation_timeout_s * 1000)
        self._clock_ms = clock_ms
        self._watching_since_ms = watching_since_ms
        self.deactivated: list[str] = []

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        now = self._clock_ms()
        instances = await self._store.seen_instances()
        since = self._watching_since_ms()
        live = self._live()
        for instance in instances:
            limit = self._timeout_ms if instance.state == "active" else self._activation_timeout_ms
            if instance.name in live or now - max(instance.seen_ms, since) < limit:
                continue
            reason = "missed heartbeats" if instance.state == "active" else "never activated"
            await self._store.deactivate_instance(epoch, instance.name, reason)
            await self._provider.delete(instance.name)
            self.deactivated.append(instance.name)
            log.warning("deactivated %s: %s", instance.name, reason)
