"""Wiring of a worker process: runtime, attempts, WorkerService, the agent.

`start` serves WorkerService on its own mutual-TLS listener first (the
agent advertises its port when it activates), then runs the agent; `run`
is the process: it turns SIGTERM and SIGINT into the agent's shutdown and
returns its exit code. Tests use `start` to hold a worker in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import signal
from collections.abc import Coroutine
from typing import Any

from corral.worker.v1 import worker_service_pb2_grpc
from services.common import lifeline
from services.common.callback_hosts import SystemResolver
from services.common.registry_logins import read_login_file
from services.common.registry_rules import RegistryRules
from services.common.server import Listener, RunningServers, Service, serve
from services.common.telemetry import Tracing
from services.common.tls import TlsFiles
from services.worker.agent import Worker
from services.worker.attempts import AttemptTable
from services.worker.certificates import CertificateRenewer
from services.worker.cloud import metadata_root
from services.worker.config import WorkerConfig
from services.worker.egress import EgressProxy
from services.worker.image_tools import SkopeoUmoci
from services.worker.image_report import ImageReporter
from services.worker.images import ImageCache
from services.worker.prepull import prepull
from services.worker.metrics import IMAGE_CACHE_BYTES, RUNNING_ATTEMPTS
from services.worker.object_stores import ObjectStores
from services.worker.oci import OciRuntime, OciRuntimeConfig
from services.worker.oci.images import CachedRootfs, DirectoryRootfs, RootfsSource
from services.worker.oci.runtime import AttemptFailed
from services.worker.preemption import AzurePreemptionWatcher, GcpPreemptionWatcher, azure_vm_name
from services.worker.runtime import ContainerRuntime, ProcessRuntime, ProcessRuntimeConfig
from services.worker.secret_files import remove_leftover_secrets
from services.worker.servicer import WorkerServicer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class WorkerApp:
    """A running worker."""

    worker: Worker
    servers: RunningServers
    address: str
    """host:port of WorkerService, as the driver records it."""
    agent: asyncio.Task[int]
    """The agent; its result is the process's exit code."""
    tracing: Tracing
    closing: contextlib.AsyncExitStack
    """What `start` opened (the listener, tracing), closed once the agent is done."""

    async def wait(self) -> int:
        """Wait for the worker to leave (idle, drained, shut down); stop serving; return the exit code."""
        try:
            return await asyncio.shield(self.agent)
        finally:
            if self.agent.done():
                await self.closing.aclose()

    async def stop(self) -> int:
        """SIGTERM's path: kill running jobs, deactivate, stop serving."""
        self.worker.shutdown()
        return await self.wait()


async def start(config: WorkerConfig, runtime: ContainerRuntime | None = None) -> WorkerApp:
    """Serve WorkerService, then activate and run the agent in a task (what is opened before a step
    that fails is closed)."""
    tls = TlsFiles.of(config.certs_dir, f"worker-{config.instance_name}")
    config.scratch_dir.mkdir(parents=True, exist_ok=True)
    if removed := remove_leftover_secrets(config.scratch_dir):  # a worker that died before us left them
        log.warning("removed the secrets of %d attempts a previous worker left in %s", removed, config.scratch_dir)
    async with contextlib.AsyncExitStack() as stack:
        tracing = Tracing("corral-worker")  # $CORRAL_TRACE_EXPORTER, inherited from the driver that started us
        stack.callback(tracing.shutdown)
        attempts = AttemptTable(config.keep_ended_s)
        stores = ObjectStores(config.storage_access)  # reads its secrets: a bad one stops the worker here
        stack.callback(stores.close)
        # Opened first: ListImages reports what a worker before this one left, and the OCI runtime pulls
        # through it.
        images = await _image_cache(config, stack)
        runtime = runtime or await choose_runtime(config, stores, images)
        stack.push_async_callback(runtime.close)  # the job launcher, the containers' state, once the jobs are gone
        # The driver is told what the cache holds, under the names jobs write too (services.worker.image_report).
        reporter = ImageReporter(images, images.reference_of)
        worker = Worker(config, runtime, attempts, tls, images=reporter)
        RUNNING_ATTEMPTS.set_function(lambda: len(attempts.running()))
        IMAGE_CACHE_BYTES.set_function(lambda: images.size_bytes)
        servers = await serve([Service("corral.worker.v1.WorkerService", WorkerServicer(worker, images),
                                       worker_service_pb2_grpc.add_WorkerServiceServicer_to_server)],
                              [Listener.mutual_tls(config.listen_address, tls)],
                              tracer_provider=tracing.provider)
        stack.push_async_callback(servers.stop, 1.0)
        watches = await _watchers(config, tls, worker)
        if config.prepull:
            watches.append(_prepull(images, config.prepull, reporter))
        for watch in watches:
            task = asyncio.create_task(watch)
            task.add_done_callback(_report)
            stack.push_async_callback(_cancel, task)
        address = f"{config.advertise_host}:{servers.ports[0]}"
        log.info("worker %s: WorkerService at %s", config.instance_name, address)
        return WorkerApp(worker, servers, address, asyncio.create_task(worker.run(address)), tracing,
                         stack.pop_all())


async def _image_cache(config: WorkerConfig, stack: contextlib.AsyncExitStack) -> ImageCache:
    """The image cache, its every pull through the egress proxy (services.worker.egress), both closed by
    `stack`: pulls check where they go with one resolver and one set of rules."""
    login = read_login_file(config.own_registry_login_file) if config.own_registry_login_file else None
    resolver = SystemResolver()
    stack.callback(resolver.close)
    egress = EgressProxy(RegistryRules.of(config.own_registry, config.allowed_registries, config.registry_mirrors),
                         resolver)
    await egress.start()
    stack.push_async_callback(egress.close)
    images = ImageCache(config.image_cache_dir or config.scratch_dir / "images", config.own_registry,
                        config.image_cache_bytes, tools=SkopeoUmoci(environment=egress.environment()),
                        own_login=login, allowed_registries=config.allowed_registries, resolve=resolver,
                        mirrors=config.registry_mirrors)
    stack.push_async_callback(images.close)
    return images


async def _watchers(config: WorkerConfig, tls: TlsFiles, worker: Worker) -> list[Coroutine[Any, Any, None]]:
    """What runs beside the agent: the cloud's preemption notices, the certificate's renewal."""
    found: list[Coroutine[Any, Any, None]] = []
    if config.cloud is not None:
        root = metadata_root(config.cloud)
        if config.cloud == "gcp":
            found.append(GcpPreemptionWatcher(root, worker.preempted).run())
        else:
            vm_name = await azure_vm_name(root, config.instance_name)
            found.append(AzurePreemptionWatcher(root, vm_name, worker.preempted).run())
    if config.renew_certificate:
        # The renewed certificate is used from the next channel on: a new session opens one.
        found.append(CertificateRenewer(tls, config.driver_addresses, worker.drop_session,
                                        instance_name=config.instance_name).run())
    return found


async def _prepull(images: ImageCache, names: tuple[str, ...], reporter: ImageReporter) -> None:
    """Pull `names` (`--prepull`); the driver hears of each at the next heartbeat."""
    await prepull(images, names, reporter.ran)


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(BaseException):  # its failure, if any, was logged when it ended
        await task


def _report(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("a worker's watcher failed: %r", task.exception())


RUNTIMES = ("process", "oci", "auto")


async def choose_runtime(config: WorkerConfig, stores: ObjectStores, images: ImageCache | None = None
                         ) -> ContainerRuntime:
    """The runtime `config.runtime` names; 'auto' is the OCI runtime where this machine can run it. An OCI
    runtime has taken the worker's name on the host and cleaned up after dead workers before it returns.
    Raises ValueError if 'oci' was asked for and cannot run here."""
    if config.runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {config.runtime!r}: one of {', '.join(RUNTIMES)}")
    limits = config.limits
    caps = {"deployment": limits.deployment, "cores_mcpu": config.cores_mcpu,
            "max_processes": limits.max_processes_per_job, "max_processes_per_core": limits.max_processes_per_core,
            "max_processes_base": limits.max_processes_base, "deployment_max_processes": limits.deployment_max_processes,
            "process_check_interval_s": limits.process_check_interval_s,
            "storage_check_interval_s": limits.storage_check_interval_s}
    process = ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=config.unisolated_dev, object_stores=stores,
                                                  owner=oci_owner(config.instance_name), **caps))
    if config.runtime == "process":
        return process
    why_not = []
    oci = None
    # Images unpacked beforehand if the worker is given a directory of them, else pulled through its cache.
    source: RootfsSource | None = DirectoryRootfs(config.oci_images_dir) if config.oci_images_dir is not None \
        else CachedRootfs(images) if images is not None else None
    if source is None:
        why_not.append("no images: the OCI runtime needs an image cache or --oci-images-dir (unpacked images)")
    else:
        memory_per_core = {"memory_per_core_bytes": config.memory_bytes * 1000 // config.cores_mcpu} \
            if config.memory_bytes > 0 and config.cores_mcpu > 0 else {}
        oci = OciRuntime(OciRuntimeConfig(source, owner=oci_owner(config.instance_name), object_stores=stores,
                                          private_networks=config.private_networks,
                                          container_runtime=config.container_runtime, **memory_per_core, **caps))
        why_not += oci.host_refusals()
    if oci is not None and not why_not:
        try:
            await oci.start()
            log.info("worker %s: jobs run in OCI containers (%s)", config.instance_name, oci.container_runtime)
            return oci
        except AttemptFailed as e:
            why_not.append(str(e))
    if config.runtime == "oci":
        raise ValueError("the OCI runtime cannot run on this machine: " + "; ".join(why_not))
    log.warning("worker %s: jobs run in the process runtime, not in containers: %s", config.instance_name,
                "; ".join(why_not))
    return process


def oci_owner(instance_name: str) -> str:
    """The worker's name as the OCI runtime's owner (letters, digits, '.', '_' and '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", instance_name).lstrip("._-") or "worker"


LIFELINE_EXIT_S = 20.0
"""After `corral up` is gone, how long the worker's shutdown may take before the process exits anyway."""


async def run(config: WorkerConfig, runtime: ContainerRuntime | None = None) -> int:
    """The worker process: serve until the worker leaves; SIGTERM and SIGINT shut it down, and so does
    the end of the `corral up` it was started under (services.common.lifeline), whichever driver
    started it. `runtime`: the one `config.runtime` names unless given (bench/fleet_worker.py)."""
    try:
        app = await start(config, runtime)
    except ValueError as e:  # a runtime asked for that this machine cannot run
        log.error("worker %s cannot start: %s", config.instance_name, e)
        return 2
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, app.worker.shutdown)
    loop.add_signal_handler(signal.SIGUSR1, app.worker.preempted)

    def exit_now() -> None:
        log.error("%s: shutdown took over %g s; exiting", config.instance_name, LIFELINE_EXIT_S)
        logging.shutdown()
        os._exit(1)  # its jobs die with it (PR_SET_PDEATHSIG): nothing outlives it

    def corral_up_gone() -> None:
        log.warning("%s: corral up is gone (its lifeline closed): shutting down", config.instance_name)
        app.worker.shutdown()
        loop.call_later(LIFELINE_EXIT_S, exit_now)

    lifeline.watch(corral_up_gone)
    return await app.wait()
