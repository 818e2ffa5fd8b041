"""Wiring of the auth service: database, servicer and its two listeners."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from corral.auth.v1 import auth_service_pb2_grpc
from services.auth.field_limits import AUTH_FIELD_LIMITS
from services.auth.login_limits import LoginLimits, LoginThrottle
from services.auth.servicer import ANONYMOUS_METHODS, CACHE_TTL_S, AuthServicer
from services.auth.store import AuthStore, dummy_password_hash
from services.common.call_limits import CallLimits
from services.common.identity import BearerAuthenticator
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
from services.db.database import Database, DatabaseConfig

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AuthConfig:
    """How to run the auth service."""

    database_url: str
    """mysql://... of corral's database."""
    certs_dir: Path
    """Directory of the CA and the service certificates (see services.common.tls)."""
    public_address: str = "127.0.0.1:0"
    """Listener for people: TLS and bearer tokens (Login needs none)."""
    internal_address: str = "127.0.0.1:0"
    """Listener for corral services: mutual TLS (VerifyToken)."""
    identity: str = "auth"
    """Common name of this service's certificate."""
    ports_file: Path | None = None
    """Where to write the bound ports as JSON once serving (for `corral up`)."""
    trace_exporter: str | None = None
    """Where spans go (see services.common.telemetry); None: $CORRAL_TRACE_EXPORTER, off if unset."""
    rpc_deadline_s: float = 30.0
    """Longest a call may run on the server (DEADLINE_EXCEEDED after)."""
    login_limits: LoginLimits = LoginLimits()
    """Delays after failed logins, per username and per source (services.auth.login_limits)."""
    token_cache_ttl_s: float = CACHE_TTL_S
    """How long other services may reuse a VerifyToken answer (its `cache_ttl`): with the frontend's
    own token_cache_s, the longest a revoked token keeps working there (docs/security.md)."""
    forwarded_for_header: str | None = None
    """Metadata header whose last entry is the login's source address, e.g. 'x-forwarded-for'.
    Only when every call reaches the public listener through a gateway that sets it: a client
    reaching the listener directly could write any address there. None: the call's peer."""
    gateway_token_file: Path | None = None
    """A file holding the secret the public gateway adds to every call it forwards here (GATEWAY_TOKEN_HEADER):
    on a call that carries it, the last entry of `x-forwarded-for` (which that gateway appends) is the
    login's source, so people behind the gateway do not share one source's login limit. Calls without it
    (straight to this listener) count by their peer, whatever they claim."""


@dataclasses.dataclass
class AuthApp:
    """A running auth service."""

    db: Database
    servers: RunningServers
    public_port: int
    internal_port: int
    tracing: Tracing
    closing: contextlib.AsyncExitStack
    """What `start` opened, closed in reverse order by `stop`."""

    async def stop(self) -> None:
        """Stop accepting calls, let running ones finish, then close the pool and flush spans."""
        await self.closing.aclose()


async def start(config: AuthConfig, clock_s: Callable[[], float] = time.monotonic) -> AuthApp:
    """Open the database, start both listeners, and report the ports. `clock_s` times
    login delays (tests move it by hand). What a step opens is closed if a later step fails."""
    tls = TlsFiles.of(config.certs_dir, config.identity)
    async with contextlib.AsyncExitStack() as stack:
        tracing = Tracing("corral-auth", config.trace_exporter)
        stack.callback(tracing.shutdown)
        db = await Database.connect(DatabaseConfig.from_url(config.database_url))
        stack.push_async_callback(db.close)
        await asyncio.to_thread(dummy_password_hash)  # made now, not by the first unknown username's login
        gateway_token = config.gateway_token_file.read_text().strip() if config.gateway_token_file else None
        servicer = AuthServicer(AuthStore(db), LoginThrottle(config.login_limits, clock_s),
                                config.forwarded_for_header, config.token_cache_ttl_s, gateway_token)
        public = BearerAuthenticator(servicer.verify_token, anonymous_methods=ANONYMOUS_METHODS, cache_s=0)
        servers = await serve(
            [Service("corral.auth.v1.AuthService", servicer, auth_service_pb2_grpc.add_AuthServiceServicer_to_server)],
            [Listener(config.public_address, tls, public, internal=False),
             Listener.mutual_tls(config.internal_address, tls)],
            tracer_provider=tracing.provider,
            # A deadline on every call, as the frontend's: no request holds the server longer.
            limits=CallLimits(field_limits=AUTH_FIELD_LIMITS, unary_deadline_s=config.rpc_deadline_s),
        )
        stack.push_async_callback(servers.stop)
        servers.watch_health(database_probe(db))
        public_port, internal_port = servers.ports
        if config.ports_file is not None:
            write_ports_file(config.ports_file, {"public": public_port, "internal": internal_port})
        app = AuthApp(db, servers, public_port, internal_port, tracing, stack.pop_all())
    log.info("auth serving: public port %d, internal port %d", app.public_port, app.internal_port)
    return app


async def run(config: AuthConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    await run_until_signalled(await start(config))
