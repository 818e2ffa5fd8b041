"""Wiring of a driver process: election, loops, worker sessions, provider.

Every driver process campaigns for the leader lease (services.driver.leader);
the one holding it runs the loops (scheduler, the cancellers of Ready/Pending
and of Running jobs, the releaser of completed parents' children,
autoscaler, dead-worker detector, reconciler of instances and machines,
cancel after N failures, completion re-check and callbacks, billing
limits), serves workers and says SERVING on
gRPC health. The others stand by: NOT_SERVING, they answer GetLeader, send
workers to the leader, and take over once its lease has run out (a crashed,
paused or cut-off leader) or at once when it gives the lease up on a clean
shutdown. A leader that steps down ends its workers' sessions, so they find
the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from corral.driver.v1 import driver_service_pb2_grpc, worker_enrollment_service_pb2_grpc
from services.common.call_limits import CallLimits
from services.common.files import write_atomically
from services.common.image_refs import Mirror
from services.common.prepull import for_pool
from services.common.processes import PidFiles
from services.common.sealing import Opener
from services.common.server import (
    Listener,
    RunningServers,
    Service,
    database_probe,
    run_until_signalled,
    serve,
    write_ports_file,
)
from services.common.storage_access import StorageAccess
from services.common.worker_limits import WorkerLimits
from services.common.telemetry import Tracing
from services.common.tls import TlsFiles, WorkerIssuer
from services.common.urls import CallbackRules, StorageRoots
from services.db.database import Database, DatabaseConfig
from services.driver.autoscaler import Autoscaler, Stopping
from services.driver.billing_limit_canceller import BillingLimitCanceller
from services.driver.callbacks import CompletionCallbacks, HttpCallbackSender
from services.driver.canceller import ReadyCanceller
from services.driver.completions import CompletionChecker
from services.driver.dead_workers import DeadWorkerDetector
from services.driver.enrollment import ENROLL_METHOD, EnrollmentServicer, EnrollmentSettings, enrollee
from services.driver.enrollment import SERVICE_NAME as ENROLLMENT_SERVICE
from services.driver.events import EventPublisher
from services.driver.failure_canceller import FailureCanceller
from services.driver.fleet_gauges import FleetGauges
from services.driver.leader import LeaderElection, LeaseSettings
from services.driver.loop import Loop
from services.driver.reconciler import InstanceReconciler, ReconcileSettings
from services.driver.pricing import price_file
from services.driver.pricing.refresh import PriceRefresh, RefreshSettings
from services.driver.providers.cloud_setup import (CloudSetup, MachineDeleter, close_provider, open_catalog,
                                                   open_provider)
from services.driver.providers.interface import InstanceProvider, InstanceRequest
from services.driver.providers.local import LocalProvider
from services.driver.releaser import ChildReleaser
from services.driver.running_canceller import RunningCanceller
from services.driver.scheduler import DEMAND_REUSE_S, Scheduler
from services.driver.secret_delivery import SecretDelivery
from services.driver.servicer import DriverServicer, SessionSettings
from services.driver.sessions import SessionRegistry
from services.driver.store import DriverStore
from services.common.specs import SpecStore

log = logging.getLogger(__name__)


_DEMAND_UNCHANGED = frozenset({"job_started", "job_ended", "instance_active", "worker_connected",
                               "CHANGE_KIND_BILLING_CHANGED"})
"""Changes after which the scheduler may go on reusing its fair-share read: they move no job into Ready, and
what they move out of Ready or Running the scheduler counts itself (the jobs it starts, and the ends MJC
reports: `job_ended`, a pass of ends that made no job Ready). Every other change (a commit, a cancellation,
an end that released children or retried its job, a lost worker) ends the reuse."""


@dataclasses.dataclass(frozen=True)
class DriverConfig:
    """How to run one driver (run two or more: one leads)."""

    database_url: str
    """mysql://... of corral's database."""
    certs_dir: Path
    """This driver's certificate directory: `ca.pem`, `driver.pem`, `driver.key`, and the worker
    issuer (`worker-issuer.pem`, `.key`) with which the local provider signs each worker's certificate."""
    spec_root_url: str
    """fsspec URL of blob storage (job specs, logs)."""
    data_dir: Path
    """Where local workers keep their scratch space and logs."""
    internal_address: str = "127.0.0.1:0"
    """Listener for workers and the frontend (mutual TLS)."""
    enroll_address: str | None = None
    """A listener of its own for workers that have no certificate yet: TLS with the driver's certificate,
    no client certificate, serving WorkerEnrollmentService alone (its Enroll checks the one-time token), for
    deployments where workers reach the drivers without the internal gateway. None: no such listener (the
    internal gateway's enrollment listener forwards Enroll to the internal address)."""
    enrollment: EnrollmentSettings = EnrollmentSettings()
    """How long activation tokens enroll and enrolled workers' certificates last."""
    local_workers_enroll: bool = False
    """Local workers make their own key and enroll at this driver's enrollment listener (`enroll_address`,
    which it then needs), as cloud workers do, instead of being given a key and certificate the driver made."""
    name: str = "driver"
    """This driver's name, in logs and the election."""
    advertise_host: str = "localhost"
    """The host name the frontend and standbys reach this driver at (its address in the election, with its
    port): on one machine localhost; in Kubernetes the pod's stable name (helm/corral), which its
    certificate names."""
    driver_addresses: tuple[str, ...] = ()
    """Every driver's internal address, given to local workers so they find the leader."""
    autoscaler_period_s: float = 2.0
    """How often the autoscaler looks at demand."""
    fair_share_reuse_s: float = DEMAND_REUSE_S
    """How long the scheduler reuses a fair-share read, kept up to date with the jobs it starts."""
    session: SessionSettings = SessionSettings()
    """Heartbeat and idle settings sent to workers."""
    lease: LeaseSettings = LeaseSettings()
    """How long leadership lasts unrenewed (the failover time of a paused or cut-off leader) and how
    often the leader renews it."""
    ports_file: Path | None = None
    """Where to write the bound port as JSON once serving."""
    trace_exporter: str | None = None
    """Where spans go (see services.common.telemetry); None: $CORRAL_TRACE_EXPORTER, off if unset."""
    storage_roots: tuple[str, ...] = ()
    """URL templates jobs' input and output files must lie under, `{project}` standing for the billing
    project; sent to workers with each job, which check its files again. The frontend's setting."""
    callback_allow_networks: tuple[str, ...] = ()
    """Networks (CIDR) completion callbacks may reach although they are not public, e.g. 10.0.0.0/8;
    checked again when each callback is sent. The frontend's setting."""
    storage_access: StorageAccess = StorageAccess()
    """How local workers reach gs:// and az:// storage: passed on to each (the paths of its secret files,
    never what is in them: the driver reads none)."""
    worker_limits: WorkerLimits = WorkerLimits()
    """The deployment's limits on what jobs take of a worker's host (its cgroups' names and process caps, how often
    processes and storage are checked): passed on to each worker it starts."""
    unisolated_dev_workers: bool = False
    """Start local workers with --unisolated-dev: when not root, they run jobs unisolated as their own user
    instead of refusing them (development only)."""
    worker_runtime: str = "process"
    """How local workers run jobs (their --runtime): process, oci or auto."""
    own_registry: str | None = None
    """corral's own registry, what `localhost/...` names, for the workers it starts (`http://host:port`: plain
    HTTP); None: the deployment has none."""
    own_registry_login_file: Path | None = None
    """The login (a login file, services.common.registry_logins) local workers pull from the own registry
    with: each worker gets a copy in its own certificate directory, as it gets its certificate. None: they
    pull from it anonymously."""
    registry_mirrors: tuple[Mirror, ...] = ()
    """Mirrors the workers it starts ask first (their --registry-mirror; services.worker.pull_sources)."""
    allowed_registries: tuple[str, ...] = ()
    """Registries (`host[:port]`) local workers may pull jobs' images from although they are not public (the
    frontend's setting; services.common.registry_rules)."""
    worker_metrics_dir: Path | None = None
    """Local workers serve Prometheus metrics on a loopback port each, written to `DIR/worker-NAME.port`
    (services.common.metrics); None: they serve none."""
    secrets_key_file: Path | None = None
    """The private key of the deployment's key pair for job secrets (PEM, 0600; services.common.sealing): the
    driver opens a job's secrets with it to send them to the job's worker. None: jobs that mount secrets end
    in Error, saying the driver has no key."""
    reconcile: ReconcileSettings = ReconcileSettings()
    """How often the leader compares the database's instances with the provider's machines, and the grace
    periods before it deactivates a vanished instance or deletes an orphaned machine."""
    cloud: CloudSetup | None = None
    """The cloud whose machines run the workers (`--provider gcp|azure`: its configuration, with the boot
    data every machine is given); None: worker processes on this host (the local provider)."""
    price_file: Path | None = None
    """The prices of the deployment's machines until the cloud's catalogue is read, and the local
    provider's (services.driver.pricing.price_file); None: the file shipped with corral."""
    price_refresh: RefreshSettings = RefreshSettings()
    """How often the leader reads the cloud's price catalogue, and how soon again after a failed read."""
    prepull: Mapping[str | None, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Images the local workers it starts pull when they start (their --prepull), by pool; None: every pool
    (services.common.prepull)."""
    stopping_file: Path | None = None
    """While this file exists the driver starts no machine: `corral up` creates it when it begins to stop, before
    it stops the workers (services.up.app); None: only its own stop stops its autoscaler."""


@dataclasses.dataclass
class DriverApp:
    """A running driver."""

    db: Database
    servers: RunningServers
    election: LeaderElection
    provider: InstanceProvider
    loops: list[Loop]
    tasks: list[asyncio.Task[None]]
    port: int
    closing: contextlib.AsyncExitStack
    """What `start` opened, closed in reverse order by `stop` (see `start`)."""
    sessions: SessionRegistry | None = None
    """The worker sessions this driver serves (where Run and Cancel commands go)."""
    tracing: Tracing | None = None
    enroll_port: int | None = None
    """The port of the enrollment listener (`DriverConfig.enroll_address`), if there is one."""
    stopping: Stopping = dataclasses.field(default_factory=Stopping)
    """Set first thing by `stop`: the autoscaler starts no machine from then on."""

    async def stop(self) -> None:
        """Start no machine any more, stop the loops, give the lease up (a standby takes over at its next look),
        send the workers to it, stop serving, stop the workers started here, close the pool, flush spans."""
        self.stopping.begin()
        await self.closing.aclose()


def _worker_issuer(config: DriverConfig) -> WorkerIssuer | None:
    """The worker issuer in the driver's certificate directory, or None if it was given none (it then
    enrolls no worker: every Enroll is refused, saying so)."""
    try:
        return WorkerIssuer(config.certs_dir)
    except FileNotFoundError:
        log.warning("no worker issuer in %s: this driver enrolls no worker", config.certs_dir)
        return None


REGISTRY_LOGIN = "registry-login.json"
"""In a local worker's certificate directory: its copy of the own registry's pull login."""


def worker_certs_dir(config: DriverConfig, instance_name: str) -> Path:
    """Where a local worker's own key and certificate are kept (0700; removed with the worker)."""
    return config.data_dir / "worker-certs" / instance_name


def local_worker_command(config: DriverConfig, own_address: Callable[[], str],
                         enroll_address: Callable[[], str | None] = lambda: None
                         ) -> Callable[[InstanceRequest], list[str]]:
    """argv of a local worker process for an instance request, after giving the worker a
    certificate of its own (signed by the worker issuer); its activation token is not there: the
    local provider puts it in the environment. Without configured driver addresses (a single driver
    on port 0), the worker is given `own_address()`. With `config.local_workers_enroll`, the worker is
    given the CA certificate alone and enrolls at `enroll_address()` for its certificate, as a cloud
    worker does (its key is made in its own process)."""

    def command(request: InstanceRequest) -> list[str]:
        drivers = config.driver_addresses or (own_address(),)
        certs = worker_certs_dir(config, request.name)
        enroll_at = enroll_address() if config.local_workers_enroll else None
        if enroll_at is not None:
            certs.mkdir(parents=True, exist_ok=True)
            certs.chmod(0o700)
            shutil.copyfile(config.certs_dir / "ca.pem", certs / "ca.pem")
        else:
            WorkerIssuer(config.certs_dir).provision_worker(request.name, certs)
        login = []
        if config.own_registry_login_file is not None:  # as private as the worker's key, beside it
            write_atomically(certs / REGISTRY_LOGIN, config.own_registry_login_file.read_bytes(), 0o600)
            login = ["--own-registry-login-file", str(certs / REGISTRY_LOGIN)]
        return [sys.executable, "-m", "services.worker", "--instance-name", request.name,
                *(["--enroll-address", enroll_at] if enroll_at is not None else []),
                "--cores-mcpu", str(request.cores_mcpu),
                "--memory-bytes", str(request.memory_bytes), "--storage-bytes", str(request.storage_bytes),
                "--region", request.region,
                *config.storage_access.to_args(), *config.worker_limits.to_args(),
                "--driver-addresses", ",".join(drivers), "--certs-dir", str(certs),
                "--scratch-dir", str(config.data_dir / "workers" / request.name),
                "--log-root-url", config.spec_root_url,
                *(["--unisolated-dev"] if config.unisolated_dev_workers else []),
                "--runtime", config.worker_runtime,
                *(["--own-registry", config.own_registry] if config.own_registry else []), *login,
                *(arg for mirror in config.registry_mirrors for arg in ("--registry-mirror", str(mirror))),
                *(["--allowed-registries", ",".join(config.allowed_registries)] if config.allowed_registries else []),
                *(["--metrics-address", "127.0.0.1:0", "--metrics-port-file",
                   str(config.worker_metrics_dir / f"worker-{request.name}.port")]
                  if config.worker_metrics_dir is not None else []),
                *(["--prepull", ",".join(images)] if (images := for_pool(config.prepull, request.inst_coll)) else [])]

    return command


async def start(config: DriverConfig) -> DriverApp:
    """Serve the driver API, campaign for leadership, run the loops while leading. Each step that opens
    something registers its closing on one exit stack, right after it: if a later step fails (the
    listener's port is taken), what was opened is closed before the error propagates; otherwise the
    stack is the app's, and `stop` closes it, in reverse order."""
    storage = StorageRoots(config.storage_roots)
    storage.check_apart_from(config.spec_root_url)
    callback_rules = CallbackRules.parse(config.callback_allow_networks)
    opener = Opener.from_file(config.secrets_key_file) if config.secrets_key_file else None
    prices = price_file.load(config.price_file or price_file.SHIPPED)
    async with contextlib.AsyncExitStack() as stack:
        tracing = Tracing("corral-driver", config.trace_exporter)
        stack.callback(tracing.shutdown)
        db_config = DatabaseConfig.from_url(config.database_url)
        db = await Database.connect(db_config)
        stack.push_async_callback(db.close)
        store = DriverStore(db)
        specs = SpecStore(config.spec_root_url)
        registry = SessionRegistry(store, specs, log_root_url=config.spec_root_url, storage_roots=storage,
                                   secrets=SecretDelivery(store, opener))
        tls = TlsFiles.of(config.certs_dir, "driver")  # every driver is the same service to its peers
        enroll_port: int | None = None
        if config.local_workers_enroll and config.enroll_address is None:
            raise ValueError("local workers enroll at the driver's enrollment listener: give it an enroll_address")
        provider, on_deactivated = _open_provider(config, stack, lambda: LocalProvider(
            local_worker_command(config, lambda: election.state.name,
                                 lambda: f"localhost:{enroll_port}" if enroll_port else None),
            config.data_dir / "worker-logs",
            forget=lambda name: shutil.rmtree(worker_certs_dir(config, name), ignore_errors=True),
            pid_files=PidFiles(config.data_dir / "run" / "pids")))
        election = LeaderElection(db_config, config.name, config.lease)
        state = election.state

        def epoch() -> int | None:
            return state.epoch

        scheduler = Scheduler(store, registry, epoch, demand_reuse_s=config.fair_share_reuse_s)

        def released() -> None:
            scheduler.new_work()  # children became Ready
            canceller.notify()  # or Ready with a failed dependency

        releaser = ChildReleaser(store, epoch, on_released=released)
        canceller = ReadyCanceller(store, epoch, on_cancelled=releaser.notify)
        stopping = Stopping(config.stopping_file)
        autoscaler = Autoscaler(store, provider, epoch, period_s=config.autoscaler_period_s, stopping=stopping,
                                **({"region": config.cloud.region, "any_region": True,
                                    "provider_regions": config.cloud.regions} if config.cloud else {}))
        dead = DeadWorkerDetector(store, provider,
                                  lambda: registry.heard_from(config.session.heartbeat_timeout_s), epoch,
                                  heartbeat_timeout_s=config.session.heartbeat_timeout_s,
                                  watching_since_ms=lambda: state.watching_since_ms)
        running = RunningCanceller(store, registry, epoch)
        # The instances it ends had jobs that are Ready again: as when a worker deactivates.
        reconciler = InstanceReconciler(store, provider, epoch, config.reconcile,
                                        on_deactivated=lambda: on_change("instance_inactive"),
                                        watching_since_ms=lambda: state.watching_since_ms)
        price_refresh = PriceRefresh(store, prices, open_catalog(config.cloud, prices) if config.cloud else None,
                                     provider.machine_kinds(), epoch, config.price_refresh)
        try:  # before the autoscaler runs, so that it finds the file's prices
            await price_refresh.sync_file()
        except Exception:  # noqa: BLE001 - the loop does it again once this driver leads
            log.exception("could not set the price file's prices now; the price loop will")
        await _add_cloud_regions(store, config.cloud)

        def cancelled() -> None:
            scheduler.new_work()  # the cancelled jobs' demand is gone
            canceller.notify()
            running.notify()

        callbacks = CompletionCallbacks(store, epoch, sender=HttpCallbackSender(rules=callback_rules))
        more_loops: list[Loop] = [running, FailureCanceller(store, epoch, on_cancelled=cancelled),
                                  CompletionChecker(store, epoch), callbacks,
                                  BillingLimitCanceller(store, epoch, on_cancelled=cancelled), reconciler,
                                  price_refresh]
        publisher = EventPublisher(store, epoch)
        loops: list[Loop] = [scheduler, canceller, releaser, autoscaler, dead, publisher,
                             FleetGauges(store, lambda: state.epoch is not None)]
        loops += more_loops

        # Who a worker's job events wake, besides the scheduler: each of these runs a cycle of reads, and
        # at hundreds of jobs a second, waking all five on every pass was a good part of the database's
        # work. A job's start moves nothing but its events. Its end frees cores, and may release children
        # (which MJC does itself for a few, possibly with a failed dependency, and queues the rest for the
        # releaser) or retry the job: `job_completed`. A pass of ends that did neither is `job_ended`: it
        # leaves the releaser and the Ready canceller nothing to do, and the autoscaler, which starts
        # machines when Ready demand exceeds free cores, no reason to start one. The running canceller
        # waits for a cancellation (or its period): a start after one is refused by MJS.
        woken_by = {"job_started": (publisher,), "job_completed": (canceller, releaser, autoscaler, publisher),
                    "job_ended": (publisher,)}

        def on_change(kind: str) -> None:
            if kind in _DEMAND_UNCHANGED:
                scheduler.notify()
            else:
                scheduler.new_work()
            for loop in woken_by.get(kind, (canceller, releaser, autoscaler, publisher, running)):
                loop.notify()

        async def on_elected(new_epoch: int) -> None:
            servers.recheck_health()
            price_refresh.notify()  # the file's prices again, then the catalogue, now rather than in a period
            # The instances the last leader left whose machines are gone (every worker of a `corral up` that was
            # stopped or killed) end now, and their jobs run again, rather than after heartbeat deadlines.
            reconciler.notify()
            await _add_cloud_regions(store, config.cloud)
            on_change("elected")

        async def on_deposed() -> None:
            servers.recheck_health()
            ended = servicer.end_sessions("this driver no longer leads")
            log.warning("%s no longer leads; %d worker sessions ended", state.name, ended)

        servicer = DriverServicer(store, registry, epoch, lambda: state.leader, on_change, config.session,
                                  on_deactivated=on_deactivated, on_ended=scheduler.ended, placed=scheduler.placed)
        enrollment = Service(ENROLLMENT_SERVICE, EnrollmentServicer(store, _worker_issuer(config), config.enrollment),
                             worker_enrollment_service_pb2_grpc.add_WorkerEnrollmentServiceServicer_to_server)
        servers = await serve([Service("corral.driver.v1.DriverService", servicer,
                                       driver_service_pb2_grpc.add_DriverServiceServicer_to_server), enrollment],
                              # The internal gateway calls Enroll on its own, for workers without a certificate.
                              [Listener.mutual_tls(config.internal_address, tls, frozenset({ENROLL_METHOD}))],
                              tracer_provider=tracing.provider,
                              # Its callers are corral's own; still, no unary call holds it longer.
                              limits=CallLimits(unary_deadline_s=60.0),
                              # Not ready until elected: the internal gateway routes by this health.
                              serving_at_start=False)
        stack.push_async_callback(servicer.close)  # after the server stopped: no session records any more
        stack.push_async_callback(servers.stop)
        if config.enroll_address is not None:
            enroll_servers = await serve([enrollment], [Listener(config.enroll_address, tls, enrollee, internal=True,
                                                                 require_client_cert=False)],
                                         tracer_provider=tracing.provider,
                                         limits=CallLimits(unary_deadline_s=60.0, max_receive_message_bytes=64 * 1024))
            stack.push_async_callback(enroll_servers.stop)
            enroll_port = enroll_servers.ports[0]
        # Campaign under the address workers and standbys can reach us at.
        state.name = f"{config.advertise_host}:{servers.ports[0]}"
        stack.callback(registry.end_all, "this driver is shutting down; look for the leader")
        stack.push_async_callback(election.resign)
        tasks = [asyncio.create_task(election.run(on_elected, on_deposed))]
        tasks += [asyncio.create_task(loop.run()) for loop in loops]
        stack.push_async_callback(_cancel, tasks)
        # Only the leader is ready: the internal gateway and Kubernetes send workers to it by health.
        servers.watch_health(database_probe(db), ready=lambda: state.epoch is not None)
        if config.ports_file is not None:
            write_ports_file(config.ports_file, {"internal": servers.ports[0],
                                                 **({"enroll": enroll_port} if enroll_port is not None else {})})
        app = DriverApp(db, servers, election, provider, loops, tasks, servers.ports[0], stack.pop_all(),
                        sessions=registry, tracing=tracing, enroll_port=enroll_port, stopping=stopping)
    log.info("driver %s serving on port %d", config.name, app.port)
    return app


async def _add_cloud_regions(store: DriverStore, cloud: CloudSetup | None) -> None:
    """Make the cloud's configured regions regions jobs may name (at start, and again when elected in case
    the database was not reachable at start)."""
    if cloud is None:
        return
    try:
        if added := await store.add_regions(cloud.regions):
            log.info("added %d of the cloud's regions to the regions jobs may name", added)
    except Exception:  # noqa: BLE001 - logged; tried again at the next election
        log.exception("could not add the cloud's regions %s to the regions table", ", ".join(cloud.regions))


def _open_provider(config: DriverConfig, stack: contextlib.AsyncExitStack,
                   local: Callable[[], LocalProvider]) -> tuple[InstanceProvider, Callable[[str], None]]:
    """The machines' provider (the configured cloud's, else `local()`), closed with `stack`; and what to do
    when a worker deactivates itself: a local worker's process ends with it, a cloud machine is deleted."""
    if config.cloud is None:
        provider = local()
        stack.push_async_callback(provider.close)
        return provider, lambda name: None
    cloud = open_provider(config.cloud)
    stack.push_async_callback(close_provider, cloud)
    deleter = MachineDeleter(cloud)
    stack.push_async_callback(deleter.close)  # closed first: the deletes under way finish
    log.info("machines: %s, first in %s", config.cloud.kind, config.cloud.region)
    return cloud, deleter


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the tasks and wait until each has ended."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def run(config: DriverConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    app = await start(config)
    with contextlib.suppress(asyncio.CancelledError):
        await run_until_signalled(app)
