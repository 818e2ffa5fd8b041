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
import secrets
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from services.common import lifeline
from services.common.processes import PidFiles, Recorded, end_processes
from services.db.database import Database
from services.db.store import JobStore, wall_clock_ms
from services.driver.loop import Loop
from services.db.plan_snapshot import read_demand

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

    async def create(self, request: InstanceRequest) -> None:
        """Start a machine; its worker will call ActivateWorker with the token."""

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
        for name in [n for n, p in self._processes.items() if p.poll() is not None]:
            self._processes.pop(name).wait()
            self._gone(name)
        return set(self._processes)

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


class Autoscaler(Loop):
    """Starts machines per pool when ready demand exceeds free cores."""

    name = "autoscaler"

    def __init__(self, db: Database, store: JobStore, provider: InstanceProvider, epoch: Callable[[], int | None],
                 region: str = "local", period_s: float = 15.0, any_region: bool = False):
        """`region`: where machines are asked for; `any_region`: the provider may place them in another of
        its regions when that one has no room (a cloud's pools serve jobs of any region)."""
        super().__init__(period_s)
        self._db = db
        self._store = store
        self._provider = provider
        self._epoch = epoch
        self._region = region
        self._any_region = any_region
        self.created: list[str] = []

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        # One read of the fair-share view for every pool: it scans every counter
        # row whatever the pool, so a read per pool paid for the same scan again.
        demand = await read_demand(self._db)
        for pool in await self._db.fetchall(_POOLS, name="autoscaler_pools"):
            cores_mcpu = int(pool["worker_cores"]) * 1000
            ready_mcpu = sum(d.ready_cores_mcpu for d in demand.get(pool["name"], []))
            n_live, max_new = int(pool["n_live"]), int(pool["max_new_instances_per_loop"])
            # A spot pool's jobs that must run on demand (RetryPolicy.max_preemptions_before_on_demand,
            # ProvisioningModel) get on-demand machines of the pool first.
            n_on_demand = instances_to_create(int(pool["on_demand_ready_mcpu"]), int(pool["on_demand_free_mcpu"]),
                                              cores_mcpu, n_live, int(pool["max_instances"]), max_new)
            n = instances_to_create(ready_mcpu, int(pool["free_cores_mcpu"]), cores_mcpu, n_live + n_on_demand,
                                    int(pool["max_instances"]), max_new - n_on_demand)
            for preemptible in [False] * n_on_demand + [bool(pool["preemptible"])] * n:
                await self._create(epoch, InstanceRequest(
                    f"{pool['name']}-{secrets.token_hex(4)}", pool["name"], cores_mcpu,
                    int(pool["worker_memory_bytes"] or 0), self._region, secrets.token_hex(16), preemptible,
                    int(pool["worker_storage_bytes"] or 0), any_region=self._any_region))

    async def _create(self, epoch: int, request: InstanceRequest) -> None:
        await self._store.create_instance(epoch, request.name, request.inst_coll, request.cores_mcpu,
                                          request.activation_token, region=request.region,
                                          memory_bytes=request.memory_bytes, preemptible=request.preemptible,
                                          storage_bytes=request.storage_bytes)
        await self._provider.create(request)
        self.created.append(request.name)
        log.info("autoscaler: created %s in %s%s", request.name, request.inst_coll,
                 " (spot)" if request.preemptible else "")


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
