"""Wiring of the frontend: database, spec and log storage, auth client, driver
notifier, servicers, listeners."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import grpc

from corral.batch.v1 import batch_service_pb2_grpc, job_group_service_pb2_grpc, job_service_pb2_grpc
from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.client import RemoteTokenVerifier
from services.common.identity import BearerAuthenticator, peer_certificate
from services.common.server import (
    Listener,
    RunningServers,
    Service,
    run_until_signalled,
    serve,
    write_ports_file,
)
from services.common.telemetry import Tracing
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.batch_store import BatchStore
from services.frontend.batches import BatchServicer
from services.frontend.billing import BillingServicer
from services.frontend.billing_store import BillingStore
from services.frontend.explain_store import ExplainStore
from services.frontend.group_store import GroupReadStore
from services.frontend.job_groups import JobGroupServicer
from services.frontend.job_store import JobReadStore
from services.frontend.jobs import JobServicer
from services.frontend.limits import Limits
from services.frontend.logs import StoredLogs, WorkerLogs
from services.frontend.notify import DriverNotifier
from services.frontend.specs import SpecStore

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
    token_cache_s: float = 10.0
    """How long a verified token is trusted before asking auth again."""
    ports_file: Path | None = None
    """Where to write the bound ports as JSON once serving."""
    driver_addresses: tuple[str, ...] = ()
    """host:port of every driver's internal listener; the frontend notifies the leader
    among them when work appears or is cancelled (none: the drivers' periods only)."""
    notify_deadline_s: float = 1.0
    """Deadline of each notification to a driver (sent in the background)."""
    trace_exporter: str | None = None
    """Where spans go (see services.common.telemetry); None: $CORRAL_TRACE_EXPORTER, off if unset."""
    limits: Limits = Limits()
    """What one request or one user may ask for (services.frontend.limits, docs/security.md)."""


@dataclasses.dataclass
class FrontendApp:
    """A running frontend."""

    db: Database
    auth_channel: grpc.aio.Channel
    servers: RunningServers
    public_port: int
    notifier: DriverNotifier
    worker_logs: WorkerLogs
    tracing: Tracing

    async def stop(self) -> None:
        """Stop serving (letting calls finish), then stop notifying the driver, close the
        worker and auth channels and the pool."""
        await self.servers.stop()
        await self.notifier.close()
        await self.worker_logs.close()
        await self.auth_channel.close()
        await self.db.close()
        self.tracing.shutdown()


async def start(config: FrontendConfig) -> FrontendApp:
    """Connect to the database and auth, then serve."""
    tracing = Tracing("corral-frontend", config.trace_exporter)
    db = await Database.connect(DatabaseConfig.from_url(config.database_url))
    tls = DevCertificateAuthority(config.certs_dir).issue(config.identity)
    auth_channel = grpc.aio.secure_channel(config.auth_address, tls.channel_credentials())
    authenticate = BearerAuthenticator(RemoteTokenVerifier(auth_channel), cache_s=config.token_cache_s)
    notifier = DriverNotifier(tls, config.driver_addresses, deadline_s=config.notify_deadline_s)
    worker_logs = WorkerLogs(tls)
    jobs, batches, specs = JobStore(db), BatchStore(db), SpecStore(config.spec_root_url)
    services = [
        Service("corral.batch.v1.BatchService", BatchServicer(jobs, batches, specs, notifier, limits=config.limits),
                batch_service_pb2_grpc.add_BatchServiceServicer_to_server),
        Service("corral.batch.v1.JobService",
                JobServicer(batches, JobReadStore(db), ExplainStore(db), specs, StoredLogs(config.spec_root_url),
                            worker_logs),
                job_service_pb2_grpc.add_JobServiceServicer_to_server),
        Service("corral.batch.v1.JobGroupService", JobGroupServicer(jobs, batches, GroupReadStore(db), notifier),
                job_group_service_pb2_grpc.add_JobGroupServiceServicer_to_server),
        Service("corral.billing.v1.BillingService", BillingServicer(BillingStore(db)),
                billing_service_pb2_grpc.add_BillingServiceServicer_to_server),
    ]
    listeners = [Listener(config.public_address, tls, authenticate, internal=False)]
    if config.internal_address:
        listeners.append(Listener(config.internal_address, tls, peer_certificate, internal=True))
    servers = await serve(services, listeners, tracer_provider=tracing.provider)
    if config.driver_addresses:
        notifier.start()
    app = FrontendApp(db, auth_channel, servers, servers.ports[0], notifier, worker_logs, tracing)
    if config.ports_file is not None:
        write_ports_file(config.ports_file, {"public": servers.ports[0], "internal": servers.ports[1:]})
    log.info("frontend serving on port %d", app.public_port)
    return app


async def run(config: FrontendConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    await run_until_signalled(await start(config))
