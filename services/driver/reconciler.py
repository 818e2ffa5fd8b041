"""The reconciler: the database's machines against the cloud's (issue 16).

Every period the leader lists the deployment's machines in the cloud (`InstanceProvider.alive`) and reads
the instances the database has as live (pending or active):

- an instance the cloud no longer runs (preempted, deleted by hand, a create that never took) is
  deactivated, once it is older than `vanished_grace_s` (a machine being created is not raced) and this
  leader has been watching that long (a new leader cannot tell how long ago its predecessor began a create:
  it waits a whole grace, as the dead-worker detector gives a whole heartbeat deadline), or at once
  if the provider knows its machine is gone for good (`InstanceProvider.gone`: a local worker process
  that ended, such as every one of an earlier `corral up`): its running jobs' attempts end (`preempted`
  on a spot machine, `worker_lost` otherwise) and the jobs run again, as deactivate_instance does for a
  dead worker;
- a machine the cloud runs that the database does not know, or knows as ended (a delete that failed, a
  refused create that went through after all, a database restored from a backup), is deleted once it has
  been seen so for `orphan_grace_s`. When it was first seen is kept in memory only: a driver that
  restarts, or becomes leader, starts every grace again, so it can only delete later, never sooner.

A listing that fails fails the cycle (the loop logs it and backs off): an error is never read as "no
machines". The driver runs a cycle as soon as it is elected (issue 36: a restarted `corral up` must not wait
for its predecessor's workers to miss their heartbeats, or for their pending instances to "never activate",
before their jobs run again), and tells the scheduler and autoscaler (`on_deactivated`) of the jobs it
made Ready.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from services.db.store import wall_clock_ms
from services.driver.providers.interface import InstanceProvider
from services.driver.loop import Loop
from services.driver.metrics import INSTANCES_RECONCILED
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class ReconcileSettings:
    """How often the reconciler looks, and how long it leaves a mismatch alone."""

    period_s: float = 60.0
    """Seconds between two listings of the cloud's machines."""
    vanished_grace_s: float = 300.0
    """An instance younger than this (since the autoscaler recorded it) is not deactivated for missing from
    the cloud's listing: its machine may still be being created."""
    orphan_grace_s: float = 300.0
    """A machine the database does not have as live is deleted only after being seen so this long."""

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.vanished_grace_s < 0 or self.orphan_grace_s < 0:
            raise ValueError("the reconciler's period must be positive and its grace periods not negative")


class InstanceReconciler(Loop):
    """Deactivates live instances the cloud no longer has; deletes machines the database has not as live."""

    name = "reconciler"

    def __init__(self, store: DriverStore, provider: InstanceProvider, epoch: Callable[[], int | None],
                 settings: ReconcileSettings = ReconcileSettings(), clock_ms: Callable[[], int] = wall_clock_ms,
                 on_deactivated: Callable[[], None] = lambda: None,
                 watching_since_ms: Callable[[], int] = lambda: 0):
        super().__init__(settings.period_s)
        self._store = store
        self._provider = provider
        self._epoch = epoch
        self._settings = settings
        self._vanished_grace_ms = int(settings.vanished_grace_s * 1000)
        self._orphan_grace_ms = int(settings.orphan_grace_s * 1000)
        self._clock_ms = clock_ms
        self._on_deactivated = on_deactivated
        """Called after a cycle that deactivated instances (their jobs may be Ready again)."""
        self._watching_since_ms = watching_since_ms
        """When this driver began to lead (services.driver.leader): no vanished grace runs from before then."""
        self._orphans_since_ms: dict[str, int] = {}
        """Machines seen running without a live instance, and when first seen so (by this leader)."""
        self.deactivated: list[str] = []
        self.deleted: list[str] = []

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            self._orphans_since_ms.clear()  # a leader to come starts every grace again
            return
        # The cloud first: an instance recorded after the listing is young, and its grace covers it.
        running = await self._provider.alive()
        now = self._clock_ms()
        unlisted = [i for i in await self._store.live_instances() if i.name not in running]
        gone = await self._provider.gone([i.name for i in unlisted]) if unlisted else set()
        since = self._watching_since_ms()
        deactivated = 0
        for instance in unlisted:
            if instance.name in gone or now - max(instance.created_ms, since) >= self._vanished_grace_ms:
                await self._vanished(epoch, instance.name, instance.preemptible, known_gone=instance.name in gone)
                deactivated += 1
        if deactivated:
            self._on_deactivated()
        await self._orphans(running, now)

    async def _vanished(self, epoch: int, name: str, preemptible: bool, known_gone: bool) -> None:
        end_reason = "preempted" if preemptible else "worker_lost"
        why = "its machine has ended" if known_gone else "its machine is gone from the cloud"
        status = await self._store.deactivate_instance(epoch, name, why, end_reason)
        self.deactivated.append(name)
        INSTANCES_RECONCILED.labels("vanished_deactivated").inc()
        log.warning("reconciler: %s %s: deactivated (%s); %s job(s) to run again, %s ended", name,
                    "has ended" if known_gone else "is gone from the cloud", end_reason,
                    status.get("n_rescheduled", 0), status.get("n_ended", 0))

    async def _orphans(self, running: set[str], now: int) -> None:
        """Delete the machines that have run without a live instance for the grace period."""
        orphans = running - await self._store.live_among(sorted(running))
        for name in list(self._orphans_since_ms):
            if name not in orphans:
                del self._orphans_since_ms[name]  # gone, or live after all
        for name in sorted(orphans):
            if name not in self._orphans_since_ms:
                self._orphans_since_ms[name] = now
                log.info("reconciler: %s runs in the cloud with no live instance; deleted in %.0f s unless that "
                         "changes", name, self._settings.orphan_grace_s)
            since = self._orphans_since_ms[name]
            if now - since >= self._orphan_grace_ms:
                await self._provider.delete(name)
                del self._orphans_since_ms[name]
                self.deleted.append(name)
                INSTANCES_RECONCILED.labels("orphan_deleted").inc()
                log.warning("reconciler: deleted %s, which ran in the cloud with no live instance for %.0f s",
                            name, (now - since) / 1000)
