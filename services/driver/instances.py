"""Machines: the provider interface, the local provider, the autoscaler and the
dead-worker detector.

`InstanceProvider` is the one seam between the driver and a cloud (design
§6); `LocalProvider` makes a "machine" a worker process on this host with a
declared number of cores, and the autoscaler drives it exactly as it will
drive a cloud: it records the instance (pending) with a fresh activation
token, then asks the provider to create it; the worker activates itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Protocol

from services.common import lifeline
from services.common.processes import PidFiles, Recorded, end_processes
from services.db.database import Database
from services.db.store import JobStore, wall_clock_ms
from services.db.plan_snapshot import read_demand
from services.driver.loop import Loop
from services.driver.metrics import PROVIDER_REFUSALS
from services.driver.pricing.products import LOCAL, Machine
from services.driver.providers.errors import InvalidRequest, PermissionDenied, ProviderError, TransientError
from services.policy.placement import Backoffs, BackoffSettings, RegionDemand, Refusal, place

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InstanceRequest:
    """What the autoscaler asks a provider for."""

    name: str
    inst_coll: str
    cores_mcpu: int
    memory_bytes: int
    region: str
    activation_token: str = dataclasses.field(repr=False)
    """One-time; never in a log line (hence not in the repr)."""
    preemptible: bool = False
    """A spot machine, which the cloud may reclaim."""
    storage_bytes: int = 0
    """Its scratch storage (the pool's machine's; 0: not known)."""
    machine_type: str = ""
    """A cloud machine type to use as is (a job-private pool's); '': the provider picks one from the
    pool's cores and memory."""
    any_region: bool = False
    """The jobs it is for may run in any region: a provider may place it in another of its regions when
    `region` has no quota or capacity left."""


class InstanceProvider(Protocol):
    """Creates and deletes machines that run a corral worker."""

    def machine(self, request: InstanceRequest) -> Machine:
        """What the machine for `request` is, for its price: series or size, spot or not, `request.region`."""

    def machine_kinds(self) -> set[Machine]:
        """Every machine it may create, for their prices (services.driver.pricing)."""

    async def create(self, request: InstanceRequest) -> str | None:
        """Start a machine; its worker will call ActivateWorker with the token. The region it is in, where
        that is not `request.region` (an `any_region` request placed elsewhere); None: the one asked for."""

    async def delete(self, name: str) -> None:
        """Stop a machine (idempotent)."""

    async def alive(self) -> set[str]:
        """Names of machines that exist (for cleaning up orphans)."""


def _worker_environment(activation_token: str) -> dict[str, str]:
    """A local worker's environment: the driver's, less its database URL (a worker never talks to the
    database), plus the worker's one-time activation token."""
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_DATABASE_URL"}
    return {**env, "CORRAL_ACTIVATION_TOKEN": activation_token}


class LocalProvider:
    """Worker processes on this host; `command(request)` builds each one's argv. The activation token goes
    in the worker's environment (CORRAL_ACTIVATION_TOKEN), never on its command line, which every local
    user (and, without isolation, every job) can read.

    Each worker is recorded in `pid_files` as `worker-NAME`, so that any driver can delete a local
    machine by its name, as a cloud's API deletes a VM, including one a driver that has since died
    started (it kept serving: its parent's death is not its own), and so that `corral up` finds every
    worker when it stops. A worker started under `corral up` is handed its lifeline
    (services.common.lifeline): it ends with `corral up`, whichever driver started it."""

    def __init__(self, command: Callable[[InstanceRequest], Sequence[str]], log_dir: Path,
                 forget: Callable[[str], None] = lambda name: None, pid_files: PidFiles | None = None):
        self._command = command
        self._log_dir = log_dir
        self._forget = forget
        """Called with an instance's name once its process is gone (removes what `command` prepared)."""
        self._pid_files = pid_files
        self._processes: dict[str, subprocess.Popen[bytes]] = {}

    def machine(self, request: InstanceRequest) -> Machine:
        return LOCAL

    def machine_kinds(self) -> set[Machine]:
        return {LOCAL}

    async def create(self, request: InstanceRequest) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_dir / f"{request.name}.log", "ab") as log_file:
            process = subprocess.Popen(
                list(self._command(request)), stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                env=_worker_environment(request.activation_token), pass_fds=lifeline.pass_on())
        self._processes[request.name] = process
        if self._pid_files is not None:
            self._pid_files.record(f"worker-{request.name}", process.pid)

    async def delete(self, name: str) -> None:
        process = self._processes.pop(name, None)
        if process is None:
            await self._delete_adopted(name)
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                # In a thread: a worker deactivates itself on SIGTERM, through this driver's own loop.
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                await asyncio.to_thread(process.wait)
        self._gone(name)

    async def _delete_adopted(self, name: str) -> None:
        """A worker another driver started (found from its pid file), stopped as that driver would."""
        pid_files = self._pid_files
        record = pid_files.read(f"worker-{name}") if pid_files is not None else None
        if pid_files is None or record is None or not record.alive():
            return
        log.info("stopping %s (pid %d), started by another driver", name, record.pid)
        await asyncio.to_thread(end_processes, [Recorded(record)], 10.0, log.info)
        pid_files.forget(f"worker-{name}")
        self._forget(name)

    def _gone(self, name: str) -> None:
        if self._pid_files is not None:
            self._pid_files.forget(f"worker-{name}")
        self._forget(name)

    async def alive(self) -> set[str]:
        """The workers this provider started that still run, and, with `pid_files`, those another driver
        started that it recorded there (after a failover, the new leader's reconciler must not take a worker
        its predecessor started for a vanished machine)."""
        for name in [n for n, p in self._processes.items() if p.poll() is not None]:
            self._processes.pop(name).wait()
            self._gone(name)
        adopted = set()
        if self._pid_files is not None:
            adopted = {r.name.removeprefix("worker-") for r in self._pid_files.live("worker-")}
        return set(self._processes) | adopted

    def pid(self, name: str) -> int | None:
        process = self._processes.get(name)
        return process.pid if process else None

    async def close(self) -> None:
        """Stop every worker process this provider started."""
        for name in list(self._processes):
            await self.delete(name)


_POOLS = """
SELECT c.name, c.worker_cores, c.worker_memory_bytes, c.worker_storage_bytes, c.max_instances,
       c.max_new_instances_per_loop, c.preemptible,
       (SELECT COALESCE(SUM(i.free_cores_mcpu), 0) FROM instances i
          WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active')) AS free_cores_mcpu,
       (SELECT COUNT(*) FROM instances i WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active'))
         AS n_live,
       -- Jobs that must run on on-demand machines (few: on_demand_jobs lists them), and the room for them.
       IF(c.preemptible, (SELECT COALESCE(SUM(j.cores_mcpu), 0) FROM on_demand_jobs o
                          JOIN jobs j ON j.batch_id = o.batch_id AND j.job_id = o.job_id AND j.state = 'Ready'
                          WHERE o.inst_coll = c.name), 0) AS on_demand_ready_mcpu,
       (SELECT COALESCE(SUM(i.free_cores_mcpu), 0) FROM instances i
          WHERE i.inst_coll = c.name AND i.state IN ('pending', 'active') AND NOT i.preemptible)
         AS on_demand_free_mcpu
FROM instance_collections c
WHERE c.is_pool AND c.enabled
"""


def instances_to_create(ready_mcpu: int, free_mcpu: int, worker_cores_mcpu: int, n_live: int, max_instances: int,
                        max_new: int) -> int:
    """How many machines to start: enough for the ready demand that does not
    fit in free cores, bounded per loop and by the pool's maximum."""
    missing = max(0, ready_mcpu - free_mcpu)
    wanted = math.ceil(missing / worker_cores_mcpu) if worker_cores_mcpu > 0 else 0
    return max(0, min(wanted, max_new, max_instances - n_live))


_READY_BY_REGIONS = """
SELECT regions_bits, SUM(cores_mcpu) AS cores_mcpu
FROM (SELECT regions_bits, cores_mcpu FROM jobs WHERE state = 'Ready' AND inst_coll = %s LIMIT {limit}) ready
GROUP BY regions_bits
"""
REGION_SAMPLE_JOBS = 10_000
"""How many of a pool's Ready jobs the autoscaler reads to split its demand by region: the split of the
first this many (by the queue index) is taken as the split of the whole, so a pool with a million Ready
jobs costs no more than one with ten thousand."""

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


class Autoscaler(Loop):
    """Starts machines per pool when ready demand exceeds free cores, in the pool's regions.

    The pool's regions are the regions of the `regions` table (the regions jobs may name; a worker's
    region is matched to a job's by it) that the provider has (`provider_regions`; None: all of them),
    `region` first and then by region_id. A refused machine's instance is ended at once (it holds no capacity and its
    activation token is void), and the pool or region waits (`Backoffs`): see services.policy.placement."""

    name = "autoscaler"

    def __init__(self, db: Database, store: JobStore, provider: InstanceProvider, epoch: Callable[[], int | None],
                 region: str = "local", period_s: float = 15.0, any_region: bool = False,
                 backoff: BackoffSettings = BackoffSettings(), clock_s: Callable[[], float] = time.monotonic,
                 provider_regions: Collection[str] | None = None):
        """`region`: the pool's preferred region; `any_region`: a machine for jobs that may all run anywhere
        is asked for with `InstanceRequest.any_region`, so that the provider itself may try its other
        regions in the same call; `backoff`: how long a refused pool or region waits; `clock_s`: the
        back-offs' clock; `provider_regions`: the regions the provider makes machines in (a cloud's
        configured ones: a region of the table it does not have, such as `local`, gets none)."""
        super().__init__(period_s)
        self._db = db
        self._store = store
        self._provider = provider
        self._epoch = epoch
        self._region = region
        self._any_region = any_region
        self._provider_regions = None if provider_regions is None else frozenset(provider_regions)
        self._clock_s = clock_s
        self.backoffs = Backoffs(backoff)
        self.created: list[str] = []

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        # One read of the fair-share view for every pool: it scans every counter
        # row whatever the pool, so a read per pool paid for the same scan again.
        demand = await read_demand(self._db)
        regions: dict[int, str] | None = None
        for pool in await self._db.fetchall(_POOLS, name="autoscaler_pools"):
            if not self.backoffs.pool_open(pool["name"], self._clock_s()):
                continue
            cores_mcpu = int(pool["worker_cores"]) * 1000
            ready_mcpu = sum(d.ready_cores_mcpu for d in demand.get(pool["name"], []))
            n_live, max_new = int(pool["n_live"]), int(pool["max_new_instances_per_loop"])
            # A spot pool's jobs that must run on demand (RetryPolicy.max_preemptions_before_on_demand,
            # ProvisioningModel) get on-demand machines of the pool first.
            n_on_demand = instances_to_create(int(pool["on_demand_ready_mcpu"]), int(pool["on_demand_free_mcpu"]),
                                              cores_mcpu, n_live, int(pool["max_instances"]), max_new)
            n = instances_to_create(ready_mcpu, int(pool["free_cores_mcpu"]), cores_mcpu, n_live + n_on_demand,
                                    int(pool["max_instances"]), max_new - n_on_demand)
            if n_on_demand + n == 0:
                continue
            if regions is None:
                regions = await self._regions()
            pool_regions = self._pool_regions(regions)
            placed = place(n_on_demand + n, cores_mcpu, pool_regions,
                           self.backoffs.open_regions(pool["name"], pool_regions, self._clock_s()),
                           await self._demand_by_region(pool["name"], ready_mcpu, regions))
            for i, placement in enumerate(placed):
                preemptible = bool(pool["preemptible"]) and i >= n_on_demand
                created = await self._create(epoch, InstanceRequest(
                    f"{pool['name']}-{secrets.token_hex(4)}", pool["name"], cores_mcpu,
                    int(pool["worker_memory_bytes"] or 0), placement.region, secrets.token_hex(16), preemptible,
                    int(pool["worker_storage_bytes"] or 0), any_region=self._any_region and placement.anywhere))
                if not created:
                    # Placed again at once, without the region or pool that refused.
                    self.notify()
                    break

    async def _regions(self) -> dict[int, str]:
        rows = await self._db.fetchall("SELECT region_id, name FROM regions ORDER BY region_id",
                                       name="autoscaler_regions")
        return {int(r["region_id"]): r["name"] for r in rows}

    def _pool_regions(self, regions: dict[int, str]) -> list[str]:
        """Where the pool's machines may go, in order of preference."""
        return [self._region, *(name for name in regions.values() if name != self._region
                                and (self._provider_regions is None or name in self._provider_regions))]

    async def _demand_by_region(self, pool: str, ready_mcpu: int, regions: dict[int, str]) -> list[RegionDemand]:
        """The pool's ready cores by the regions their jobs may run in, scaled from a sample (one region:
        all of it anywhere, nothing read)."""
        if len(self._pool_regions(regions)) <= 1:
            return [RegionDemand(None, ready_mcpu)]
        rows = await self._db.fetchall(_READY_BY_REGIONS.format(limit=REGION_SAMPLE_JOBS), (pool,),
                                       name="autoscaler_ready_regions")
        sampled_mcpu = sum(int(r["cores_mcpu"]) for r in rows)
        if sampled_mcpu <= 0:
            return [RegionDemand(None, ready_mcpu)]
        return [RegionDemand(None if r["regions_bits"] is None else
                             frozenset(name for bit, name in regions.items() if (int(r["regions_bits"]) >> bit) & 1),
                             int(r["cores_mcpu"]) * ready_mcpu // sampled_mcpu) for r in rows]

    async def _create(self, epoch: int, request: InstanceRequest) -> bool:
        """Record the instance, then ask the cloud for it, and record where the cloud put it; False if it
        was refused (by the cloud, or because its machine has no price)."""
        machine = self._provider.machine(request)
        await self._store.create_instance(epoch, request.name, request.inst_coll, request.cores_mcpu,
                                          request.activation_token, region=request.region,
                                          memory_bytes=request.memory_bytes, preemptible=request.preemptible,
                                          storage_bytes=request.storage_bytes,
                                          products=(machine.cpu_product, machine.memory_product))
        if not await self._priced(machine):
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

    async def _priced(self, machine: Machine) -> bool:
        row = await self._db.fetchone("SELECT COUNT(*) AS n FROM latest_product_versions WHERE product IN (%s, %s)",
                                      (machine.cpu_product, machine.memory_product), name="autoscaler_priced")
        return row is not None and int(row["n"]) == 2

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

    def __init__(self, db: Database, store: JobStore, provider: InstanceProvider, live: Callable[[], set[str]],
                 epoch: Callable[[], int | None], heartbeat_timeout_s: float = 30.0,
                 activation_timeout_s: float = 120.0, clock_ms: Callable[[], int] = wall_clock_ms,
                 period_s: float = 5.0, watching_since_ms: Callable[[], int] = lambda: 0):
        super().__init__(period_s)
        self._db = db
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
        rows = await self._db.fetchall(
            """SELECT name, state, COALESCE(last_heartbeat_ms, time_activated_ms, time_created_ms) AS seen_ms
               FROM instances WHERE state IN ('pending', 'active')""", name="dead_worker_candidates")
        since = self._watching_since_ms()
        live = self._live()
        for row in rows:
            limit = self._timeout_ms if row["state"] == "active" else self._activation_timeout_ms
            if row["name"] in live or now - max(int(row["seen_ms"]), since) < limit:
                continue
            reason = "missed heartbeats" if row["state"] == "active" else "never activated"
            await self._store.deactivate_instance(epoch, row["name"], reason)
            await self._provider.delete(row["name"])
            self.deactivated.append(row["name"])
            log.warning("deactivated %s: %s", row["name"], reason)
