"""The autoscaler: machines per pool when ready demand exceeds free cores, in the pool's regions.

It records each instance (pending) with a fresh activation token, then asks the provider
(services.driver.providers.interface) to create it; the worker activates itself. Where a machine
goes and how long a refused pool or region waits is services.policy.placement's.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Collection
from pathlib import Path

from services.driver.loop import Loop
from services.driver.metrics import PROVIDER_REFUSALS
from services.driver.providers.errors import InvalidRequest, PermissionDenied, ProviderError, TransientError
from services.driver.providers.interface import InstanceProvider, InstanceRequest
from services.driver.store import DriverStore
from services.policy.fair_share import UserDemand
from services.policy.placement import Backoffs, BackoffSettings, RegionDemand, Refusal, demand_by_region, place
from services.policy.planner import JOBS_PER_CYCLE, Worker, depths

log = logging.getLogger(__name__)


def instances_to_create(ready_mcpu: int, free_mcpu: int, worker_cores_mcpu: int, n_live: int, max_instances: int,
                        max_new: int) -> int:
    """How many machines to start: enough for the ready demand that does not
    fit in free cores, bounded per loop and by the pool's maximum."""
    missing = max(0, ready_mcpu - free_mcpu)
    wanted = math.ceil(missing / worker_cores_mcpu) if worker_cores_mcpu > 0 else 0
    return max(0, min(wanted, max_new, max_instances - n_live))


def queue_looks(users: list[UserDemand], jobs_per_cycle: int = JOBS_PER_CYCLE) -> dict[str, int]:
    """How deep the autoscaler reads each user's queue of a pool to split its demand by region: as deep as the
    scheduler looks once the pool has room for every user's demand (`planner.depths`: `jobs_per_cycle` shared
    in proportion to ready cores, at least one job each), so the machines it makes are for the jobs the
    scheduler tries first. A cycle reads at most `jobs_per_cycle` jobs plus one per user, however many are
    Ready."""
    room = Worker("", 0, sum(max(0, u.ready_cores_mcpu) for u in users))
    return depths([room], users, jobs_per_cycle)


_REFUSAL_KINDS: tuple[tuple[type[ProviderError], Refusal], ...] = (
    (PermissionDenied, Refusal.CONFIGURATION), (InvalidRequest, Refusal.CONFIGURATION),
    (TransientError, Refusal.TRANSIENT))


def refusal_of(error: ProviderError) -> Refusal:
    """How the autoscaler reacts to `error` (services.policy.placement)."""
    if error.retry_elsewhere:
        return Refusal.REGION
    return next((kind for cls, kind in _REFUSAL_KINDS if isinstance(error, cls)), Refusal.TRANSIENT)


def _kind_label(error: ProviderError) -> str:
    """quota_exceeded, permission_denied, ...: the error's class, for metrics and the instance's reason."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error).__name__).lower()


class Stopping:
    """Whether the deployment is stopping, so that no machine may be started (issue 36: a machine started while
    `corral up` stopped outlived it as a pending instance, which held its pool's cores for two minutes after the
    restart). Either this driver stops (`begin`, on SIGTERM), or `corral up` said the deployment stops by
    creating `flag_file`: it stops the workers before the drivers (each worker deactivates through them), and
    their jobs go back to Ready while the drivers still lead."""

    def __init__(self, flag_file: Path | None = None) -> None:
        self._flag_file = flag_file
        self._driver_stops = False

    def begin(self) -> None:
        """This driver stops: it starts no machine from now on."""
        self._driver_stops = True

    def why(self) -> str | None:
        """Why no machine may be started now; None: one may."""
        if self._driver_stops:
            return "this driver is stopping"
        if self._flag_file is not None and self._flag_file.exists():
            return f"the deployment is stopping ({self._flag_file} exists)"
        return None


class Autoscaler(Loop):
    """Starts machines per pool when ready demand exceeds free cores, in the pool's regions.

    The pool's regions are the regions of the `regions` table (the regions jobs may name; a worker's
    region is matched to a job's by it) that the provider has (`provider_regions`; None: all of them),
    `region` first and then by region_id. A refused machine's instance is ended at once (it holds no capacity and its
    activation token is void), and the pool or region waits (`Backoffs`): see services.policy.placement."""

    name = "autoscaler"

    def __init__(self, store: DriverStore, provider: InstanceProvider, epoch: Callable[[], int | None],
                 region: str = "local", period_s: float = 15.0, any_region: bool = False,
                 backoff: BackoffSettings = BackoffSettings(), clock_s: Callable[[], float] = time.monotonic,
                 provider_regions: Collection[str] | None = None, stopping: Stopping | None = None,
                 jobs_per_cycle: int = JOBS_PER_CYCLE):
        """`region`: the pool's preferred region; `any_region`: a machine for jobs that may all run anywhere
        is asked for with `InstanceRequest.any_region`, so that the provider itself may try its other
        regions in the same call; `backoff`: how long a refused pool or region waits; `clock_s`: the
        back-offs' clock; `provider_regions`: the regions the provider makes machines in (a cloud's
        configured ones: a region of the table it does not have, such as `local`, gets none); `stopping`: when
        no machine may be started, whatever the demand; `jobs_per_cycle`: the scheduler's, how deep the heads
        of the queues that split demand by region are read (`queue_looks`)."""
        super().__init__(period_s)
        self._store = store
        self._provider = provider
        self._epoch = epoch
        self._region = region
        self._any_region = any_region
        self._provider_regions = None if provider_regions is None else frozenset(provider_regions)
        self._clock_s = clock_s
        self.backoffs = Backoffs(backoff)
        self._stopping = stopping or Stopping()
        self._said_stopping: str | None = None
        self.created: list[str] = []
        self.jobs_per_cycle = jobs_per_cycle

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None or self._stopped():
            return
        # One read of the fair-share view for every pool: it scans every counter
        # row whatever the pool, so a read per pool paid for the same scan again.
        demand = await self._store.read_demand()
        regions: dict[int, str] | None = None
        for pool in await self._store.pools():
            if not self.backoffs.pool_open(pool.name, self._clock_s()):
                continue
            cores_mcpu = pool.worker_cores * 1000
            ready_mcpu = sum(d.ready_cores_mcpu for d in demand.get(pool.name, []))
            n_live, max_new = pool.n_live, pool.max_new_instances_per_loop
            # A spot pool's jobs that must run on demand (RetryPolicy.max_preemptions_before_on_demand,
            # ProvisioningModel) get on-demand machines of the pool first.
            n_on_demand = instances_to_create(pool.on_demand_ready_mcpu, pool.on_demand_free_mcpu,
                                              cores_mcpu, n_live, pool.max_instances, max_new)
            n = instances_to_create(ready_mcpu, pool.free_cores_mcpu, cores_mcpu, n_live + n_on_demand,
                                    pool.max_instances, max_new - n_on_demand)
            if n_on_demand + n == 0:
                continue
            if regions is None:
                regions = await self._store.regions()
            pool_regions = self._pool_regions(regions)
            placed = place(n_on_demand + n, cores_mcpu, pool_regions,
                           self.backoffs.open_regions(pool.name, pool_regions, self._clock_s()),
                           await self._demand_by_region(pool.name, demand.get(pool.name, []), ready_mcpu, regions))
            for i, placement in enumerate(placed):
                if self._stopped():  # asked again right before each: the demand read above may be the stop's own
                    return
                preemptible = pool.preemptible and i >= n_on_demand
                created = await self._create(epoch, InstanceRequest(
                    f"{pool.name}-{secrets.token_hex(4)}", pool.name, cores_mcpu,
                    pool.worker_memory_bytes, placement.region, secrets.token_hex(16), preemptible,
                    pool.worker_storage_bytes, any_region=self._any_region and placement.anywhere))
                if not created:
                    # Placed again at once, without the region or pool that refused.
                    self.notify()
                    break

    def _stopped(self) -> bool:
        """Whether no machine may be started now (said once per reason)."""
        why = self._stopping.why()
        if why is not None and why != self._said_stopping:
            log.info("autoscaler: starting no machine: %s", why)
        self._said_stopping = why
        return why is not None

    def _pool_regions(self, regions: dict[int, str]) -> list[str]:
        """Where the pool's machines may go, in order of preference."""
        return [self._region, *(name for name in regions.values() if name != self._region
                                and (self._provider_regions is None or name in self._provider_regions))]

    async def _demand_by_region(self, pool: str, users: list[UserDemand], ready_mcpu: int,
                                regions: dict[int, str]) -> list[RegionDemand]:
        """The pool's ready cores by the regions their jobs may run in, split as the heads of its users' queues
        are (`placement.demand_by_region`), read as the scheduler reads them (`read_ready_heads`, as deep as
        `queue_looks`); one region: all of it anywhere, nothing read."""
        if len(self._pool_regions(regions)) <= 1:
            return [RegionDemand(None, ready_mcpu)]
        queues = (await self._store.read_queues({pool: queue_looks(users, self.jobs_per_cycle)})).get(pool, {})
        heads = [(job.regions_bits, job.cores_mcpu) for queue in queues.values() for job in queue]
        return demand_by_region(heads, ready_mcpu, regions)

    async def _create(self, epoch: int, request: InstanceRequest) -> bool:
        """Record the instance, then ask the cloud for it, and record where the cloud put it; False if it
        was refused (by the cloud, or because its machine has no price)."""
        machine = self._provider.machine(request)
        await self._store.create_instance(epoch, request.name, request.inst_coll, request.cores_mcpu,
                                          request.activation_token, region=request.region,
                                          memory_bytes=request.memory_bytes, preemptible=request.preemptible,
                                          storage_bytes=request.storage_bytes,
                                          products=(machine.cpu_product, machine.memory_product))
        if not await self._store.priced(machine.cpu_product, machine.memory_product):
            # Its attempts would be billed nothing: an operator must price it (services.driver.pricing).
            await self._refused(epoch, request, InvalidRequest(
                f"no price for {machine.cpu_product} and {machine.memory_product}: add the machine to the price "
                "file (--price-file), or let the price refresh read it from the cloud's catalogue",
                region=request.region))
            return False
        try:
            region = await self._provider.create(request) or request.region
        except ProviderError as error:
            await self._refused(epoch, request, error)
            return False
        except Exception as error:
            # Not a refusal the provider understood (a bug, a provider that failed to start a process):
            # the instance is ended all the same, and the loop logs the error and backs off.
            await self._store.deactivate_instance(epoch, request.name,
                                                  f"creation failed: {type(error).__name__}: {error}"[:255])
            raise
        if region != request.region:  # the cloud placed it elsewhere: bill and schedule it there
            placed = dataclasses.replace(machine, region=region)
            await self._store.place_instance(epoch, request.name, region, None,
                                             (placed.cpu_product, placed.memory_product))
        self.backoffs.succeeded(request.inst_coll, region)
        self.created.append(request.name)
        log.info("autoscaler: created %s in %s, region %s%s", request.name, request.inst_coll, region,
                 " (spot)" if request.preemptible else "")
        return True

    async def _refused(self, epoch: int, request: InstanceRequest, error: ProviderError) -> None:
        """End the refused instance (it never ran: no job re-runs; its token is void) and back off."""
        kind, label = refusal_of(error), _kind_label(error)
        region = error.region or request.region
        PROVIDER_REFUSALS.labels(request.inst_coll, region, label).inc()
        await self._store.deactivate_instance(epoch, request.name, f"refused: {label}: {error}"[:255])
        wait_s = self.backoffs.refused(request.inst_coll, region, kind, self._clock_s())
        if kind is Refusal.REGION:
            log.warning("autoscaler: %s refused %s in region %s (%s): %s; the pool avoids %s for %.0f s",
                        label, request.name, region, request.inst_coll, error, region, wait_s)
        elif kind is Refusal.CONFIGURATION:
            log.error("autoscaler: %s: the cloud refused %s (pool %s): %s; an operator must act; pool %s creates "
                      "no machine for %.0f s", label.upper(), request.name, request.inst_coll, error,
                      request.inst_coll, wait_s)
        else:
            log.warning("autoscaler: %s creating %s (pool %s): %s; the pool waits %.0f s", label, request.name,
                        request.inst_coll, error, wait_s)
