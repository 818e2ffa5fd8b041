"""Wiring of the frontend: database pools (the users' and one apart for the health probe and
internal calls), spec and log storage, auth client, driver notifier, servicers, listeners."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

import grpc

from corral.batch.v1 import (
    batch_service_pb2_grpc,
    fleet_service_pb2_grpc,
    image_service_pb2_grpc,
    job_group_service_pb2_grpc,
    job_service_pb2_grpc,
    lock_service_pb2_grpc,
    secret_service_pb2_grpc,
)
from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.client import RemoteTokenVerifier
from services.common.call_limits import CallLimits
from services.common.identity import BearerAuthenticator
from services.common.sealing import Sealer
from services.common.server import (
    Listener,
    RunningServers,
    Service,
    database_probe,
    run_until_signalled,
    serve,
    write_ports_file,
)
from services.common.telemetry import Tracing
from services.common.tls import TlsFiles
from services.common.image_refs import Mirror
from services.common.registry_rules import RegistryRules
from services.common.urls import CallbackRules, StorageRoots
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.batch_store import BatchStore
from services.frontend.batches import BatchServicer
from services.frontend.billing import BillingServicer
from services.frontend.billing_store import BillingStore
from services.frontend.explain_store import ExplainStore
from services.frontend.field_limits import request_field_limits
from services.frontend.fleet import FleetServicer
from services.frontend.fleet_store import FleetStore
from services.frontend.group_store import GroupReadStore
from services.frontend.job_groups import JobGroupServicer
from services.frontend.job_store import JobReadStore
from services.frontend.job_changes import JobChanges
from services.frontend.jobs import JobServicer
from services.frontend.limits import Limits
from services.frontend.lock_store import LockStore
from services.frontend.locks import LockServicer
from services.frontend.logs import StoredLogs, WorkerLogs
from services.frontend.notify import DriverNotifier
from services.frontend.quotas import user_quotas
from services.frontend.secret_store import SecretStore
from services.frontend.secrets import SecretServicer
from services.common.specs import SpecStore
from services.common.registry_logins import read_login_file
from services.frontend.image_access import OwnRegistryNames
from services.frontend.image_checks import ImageChecks
from services.frontend.images import ImageServicer
from services.frontend.own_registry import OwnRegistry
from services.frontend.url_checks import UrlChecks

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FrontendConfig:
    """How to run one frontend replica (it is stateless; run several)."""

    database_url: str
    """mysql://... of corral's database."""
    certs_dir: Path
    """Directory of the CA and service certificates."""
    auth_address: str
    """host:port of the auth service's internal (mutual TLS) listener."""
    spec_root_url: str
    """fsspec URL under which job specs and finished logs are stored, e.g. file:///var/lib/corral/blobs."""
    public_address: str = "127.0.0.1:0"
    """Listener for people: TLS and bearer tokens."""
    internal_address: str | None = None
    """Optional listener for services (mutual TLS)."""
    identity: str = "frontend"
    """Common name of this service's certificate."""
    token_cache_s: float = 5.0
    """How long a verified token is trusted before asking auth again (never past its expiry, nor
    past the cache time auth allows): the longest a revoked token keeps working here."""
    ports_file: Path | None = None
    """Where to write the bound ports as JSON once serving."""
    driver_addresses: tuple[str, ...] = ()
    """host:port of every driver's internal listener; the frontend notifies the leader
    among them when work appears or is cancelled (none: the drivers' periods only)."""
    notify_deadline_s: float = 1.0
    """Deadline of each notification to a driver (sent in the background)."""
    trace_exporter: str | None = None
    """Where spans go (see services.common.telemetry); None: $CORRAL_TRACE_EXPORTER, off if unset."""
    storage_roots: tuple[str, ...] = ()
    """URL templates jobs' input and output files must lie under, `{project}` standing for the batch's
    billing project (e.g. file:///var/lib/corral/storage/{project}/); none: jobs may name no files."""
    callback_allow_networks: tuple[str, ...] = ()
    """Networks (CIDR) completion callbacks may reach although they are not public, e.g. 10.0.0.0/8."""
    limits: Limits = Limits()
    """What one request or one user may ask for (services.frontend.limits, docs/security.md)."""
    own_registry: str | None = None
    """corral's own registry, what `localhost/...` names, as the workers are told (`http://host:port` or
    `https://host`): allowed whatever its address (services.common.registry_rules); None: `localhost/...` is
    refused."""
    registry_mirrors: tuple[Mirror, ...] = ()
    """The workers' mirrors: allowed whatever their addresses."""
    allowed_registries: tuple[str, ...] = ()
    """Registries (`host[:port]`) jobs' images may come from although they are not public, e.g. a registry
    on the deployment's private network; every other registry must be public."""
    secrets_public_key_file: Path | None = None
    """The public half of the deployment's key pair for job secrets (PEM; services.common.sealing): new
    secrets are sealed with it, and only the drivers' private half opens them. None: this deployment keeps
    no secrets (CreateSecret is FAILED_PRECONDITION)."""
    own_registry_push: str | None = None
    """The address at which this frontend writes into corral's own registry (`http://host:port` or
    `https://host`): `corral up`'s push registry. With `own_registry_push_login_file`, ImageService imports,
    lists and deletes projects' images there; without, it refuses (FAILED_PRECONDITION)."""
    own_registry_push_login_file: Path | None = None
    """The push login of corral's own registry (a login file, 0600: services.common.registry_logins)."""
    image_import_dir: Path | None = None
    """Where archives being imported are held (each in a private directory, removed after); None: the
    system's temporary directory. It needs room for max_concurrent_image_imports archives."""
    reflect_also: tuple[str, ...] = ()
    """Services of the same address this frontend's server reflection lists although others serve them: behind
    the public gateway, which sends reflection here, auth's (`corral.auth.v1.AuthService`)."""
    internal_pool_size: int = 2
    """Database connections kept apart from the users' pool (whose size is `pool_size=` in `database_url`,
    10 by default) for the health probe and the calls of corral's own services on the internal listener:
    however users fill theirs, health still answers from the database and internal calls still run."""


@dataclasses.dataclass
class FrontendApp:
    """A running frontend."""

    db: Database
    """The users' pool: every call on the public listener."""
    internal_db: Database
    """The pool apart: the health probe and the internal listener's calls."""
    auth_channel: grpc.aio.Channel
    servers: RunningServers
    public_port: int
    notifier: DriverNotifier
    worker_logs: WorkerLogs
    tracing: Tracing
    closing: contextlib.AsyncExitStack
    """What `start` opened, closed in reverse order by `stop`."""
    job_changes: JobChanges
    """What every stream waiting on a job (a log followed before it starts) waits on."""

    async def stop(self) -> None:
        """Stop serving (letting calls finish), then stop notifying the driver, close the
        worker and auth channels and the pool, flush spans."""
        await self.closing.aclose()


async def start(config: FrontendConfig) -> FrontendApp:
    """Connect to the database and auth, then serve. Whatever a step opens is registered on one exit
    stack right after: a later step that fails (a port taken) closes it; otherwise `stop` does."""
    storage = StorageRoots(config.storage_roots)
    storage.check_apart_from(config.spec_root_url)
    urls = UrlChecks(storage, CallbackRules.parse(config.callback_allow_networks))
    images = ImageChecks(RegistryRules.of(config.own_registry, config.allowed_registries, config.registry_mirrors),
                         config.limits.max_registries_per_request)
    limits = config.limits
    tls = TlsFiles.of(config.certs_dir, config.identity)
    sealer = Sealer.from_file(config.secrets_public_key_file) if config.secrets_public_key_file else None
    own_registry = None
    if config.own_registry_push and config.own_registry_push_login_file:
        own_registry = OwnRegistry(config.own_registry_push, read_login_file(config.own_registry_push_login_file))
    own_names = OwnRegistryNames.of(config.own_registry, config.own_registry_push)
    async with contextlib.AsyncExitStack() as stack:
        tracing = Tracing("corral-frontend", config.trace_exporter)
        stack.callback(tracing.shutdown)
        stack.callback(images.close)
        db_config = DatabaseConfig.from_url(config.database_url)
        db = await Database.connect(db_config)
        stack.push_async_callback(db.close)
        # Users can fill their pool (each up to max_concurrent_reads_per_user reads at once, however
        # many users): the health probe and corral's own services must not wait behind them.
        internal_db = await Database.connect(dataclasses.replace(db_config, pool_size=config.internal_pool_size))
        stack.push_async_callback(internal_db.close)
        auth_channel = grpc.aio.secure_channel(config.auth_address, tls.channel_credentials())
        stack.push_async_callback(auth_channel.close)
        authenticate = BearerAuthenticator(RemoteTokenVerifier(auth_channel), cache_s=config.token_cache_s)
        worker_logs = WorkerLogs(tls)
        stack.push_async_callback(worker_logs.close)
        notifier = DriverNotifier(tls, config.driver_addresses, deadline_s=config.notify_deadline_s)
        stack.push_async_callback(notifier.close)
        specs = SpecStore(config.spec_root_url)
        # Every stream that waits on a job (a log followed before it starts) is served by one read a period.
        job_changes = JobChanges(db.time_limited(limits.max_statement_time_s))
        stack.push_async_callback(job_changes.close)

        def services_on(pool: Database) -> list[Service]:
            """Every service, its stores on `pool`. Every read a request drives runs under the statement
            time limit; the procedures that write (JobStore) are not limited."""
            reads = pool.time_limited(limits.max_statement_time_s)
            jobs, batches, secrets = JobStore(pool), BatchStore(reads), SecretStore(reads)
            return [
                Service("corral.batch.v1.BatchService", BatchServicer(jobs, batches, specs, notifier, urls=urls,
                                                                      limits=limits, secrets=secrets, images=images,
                                                                      own_registry=own_names),
                        batch_service_pb2_grpc.add_BatchServiceServicer_to_server),
                Service("corral.batch.v1.JobService",
                        JobServicer(batches, JobReadStore(reads), ExplainStore(reads), specs,
                                    StoredLogs(config.spec_root_url), worker_logs, limits=limits,
                                    changes=job_changes),
                        job_service_pb2_grpc.add_JobServiceServicer_to_server),
                Service("corral.batch.v1.JobGroupService",
                        JobGroupServicer(jobs, batches, GroupReadStore(reads), notifier),
                        job_group_service_pb2_grpc.add_JobGroupServiceServicer_to_server),
                Service("corral.billing.v1.BillingService", BillingServicer(BillingStore(reads)),
                        billing_service_pb2_grpc.add_BillingServiceServicer_to_server),
                Service("corral.batch.v1.LockService", LockServicer(LockStore(reads), BillingStore(reads)),
                        lock_service_pb2_grpc.add_LockServiceServicer_to_server),
                Service("corral.batch.v1.SecretService", SecretServicer(secrets, sealer, limits),
                        secret_service_pb2_grpc.add_SecretServiceServicer_to_server),
                Service("corral.batch.v1.ImageService",
                        ImageServicer(secrets, own_registry, limits, config.image_import_dir,
                                      notifier.held_images if config.driver_addresses else None),
                        image_service_pb2_grpc.add_ImageServiceServicer_to_server),
                Service("corral.batch.v1.FleetService", FleetServicer(FleetStore(reads), notifier),
                        fleet_service_pb2_grpc.add_FleetServiceServicer_to_server),
            ]

        services = services_on(db)
        listeners = [Listener(config.public_address, tls, authenticate, internal=False)]
        if config.internal_address:
            listeners.append(Listener.mutual_tls(config.internal_address, tls, services=services_on(internal_db)))
        call_limits = CallLimits(max_receive_message_bytes=limits.max_request_bytes,
                                 unary_deadline_s=limits.rpc_deadline_s,
                                 max_streams_per_caller=limits.max_streams_per_user,
                                 field_limits=request_field_limits(limits), user_quotas=user_quotas(limits))
        servers = await serve(services, listeners, tracer_provider=tracing.provider, limits=call_limits,
                              also_reflected=config.reflect_also)
        stack.push_async_callback(servers.stop)
        if config.driver_addresses:
            notifier.start()
        servers.watch_health(database_probe(internal_db))
        if config.ports_file is not None:
            write_ports_file(config.ports_file, {"public": servers.ports[0], "internal": servers.ports[1:]})
        app = FrontendApp(db, internal_db, auth_channel, servers, servers.ports[0], notifier, worker_logs, tracing,
                          stack.pop_all(), job_changes)
    log.info("frontend serving on port %d", app.public_port)
    return app


async def run(config: FrontendConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    await run_until_signalled(await start(config))
