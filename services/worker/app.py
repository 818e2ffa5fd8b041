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
import signal

from corral.worker.v1 import worker_service_pb2_grpc
from services.common import lifeline
from services.common.server import Listener, RunningServers, Service, serve
from services.common.telemetry import Tracing
from services.common.tls import TlsFiles
from services.worker.agent import Worker
from services.worker.attempts import AttemptTable
from services.worker.config import WorkerConfig
from services.worker.images import ImageCache
from services.worker.object_stores import ObjectStores
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
        runtime = runtime or ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=config.unisolated_dev,
                                                                 object_stores=stores))
        stack.push_async_callback(runtime.close)  # the job launcher, once the jobs are gone
        worker = Worker(config, runtime, attempts, tls)
        # Opened now so that ListImages reports what a worker before this one left; the OCI runtime
        # will pull through it.
        images = ImageCache(config.image_cache_dir or config.scratch_dir / "images", config.default_registry,
                            config.image_cache_bytes)
        stack.push_async_callback(images.close)
        servers = await serve([Service("corral.worker.v1.WorkerService", WorkerServicer(worker, images),
                                       worker_service_pb2_grpc.add_WorkerServiceServicer_to_server)],
                              [Listener.mutual_tls(config.listen_address, tls)],
                              tracer_provider=tracing.provider)
        stack.push_async_callback(servers.stop, 1.0)
        address = f"{config.advertise_host}:{servers.ports[0]}"
        log.info("worker %s: WorkerService at %s", config.instance_name, address)
        return WorkerApp(worker, servers, address, asyncio.create_task(worker.run(address)), tracing,
                         stack.pop_all())


LIFELINE_EXIT_S = 20.0
"""After `corral up` is gone, how long the worker's shutdown may take before the process exits anyway."""


async def run(config: WorkerConfig) -> int:
    """The worker process: serve until the worker leaves; SIGTERM and SIGINT shut it down, and so does
    the end of the `corral up` it was started under (services.common.lifeline), whichever driver
    started it."""
    app = await start(config)
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
