"""Fixtures for services over real gRPC on loopback with a development CA."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.app import AuthApp, AuthConfig, start
from services.auth.client import RemoteTokenVerifier
from services.auth.store import AuthStore
from services.common.call_limits import CallLimits
from services.common.identity import BearerAuthenticator
from services.common.server import Listener, RunningServers, Service, serve
from services.common.tls import DevCertificateAuthority, TlsFiles
from services.db.database import Database, DatabaseConfig
from services.frontend.app import FrontendApp, FrontendConfig
from services.frontend.app import start as start_frontend
from services.frontend.billing import BillingServicer
from services.frontend.billing_store import BillingStore
from services.frontend.field_limits import request_field_limits
from services.frontend.limits import Limits
from tests import registry as test_registry
from tests.conftest import service_url


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.SeededRegistry]:
    """A real registry on loopback serving corral's busybox and variants of it (and the same behind a
    login), started once for the session and stopped by pid."""
    yield from test_registry.running(tmp_path_factory.mktemp("registry"))


@pytest.fixture
def certs(tmp_path: Path) -> DevCertificateAuthority:
    """A CA whose directory holds every service's certificate (and the worker issuer)."""
    return DevCertificateAuthority(tmp_path / "certs").issue_services()


@pytest.fixture
async def auth_app(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[AuthApp]:
    app = await start(AuthConfig(service_url(db_config, "auth"), certs.directory, ports_file=tmp_path / "auth.ports"))
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def admin_token(auth_app: AuthApp) -> str:
    _, secret = await AuthStore(auth_app.db).ensure_admin("root")
    return secret


def person_channel(tls: TlsFiles, port: int) -> grpc.aio.Channel:
    """What a person's client opens: TLS trusting the CA, no client certificate."""
    return grpc.aio.secure_channel(f"localhost:{port}", tls.channel_credentials(with_client_cert=False))


def service_channel(tls: TlsFiles, port: int) -> grpc.aio.Channel:
    """What a corral service opens: mutual TLS with its own certificate."""
    return grpc.aio.secure_channel(f"localhost:{port}", tls.channel_credentials())


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


QUOTAS_LIFTED = {"max_requests_per_user_per_s": 1e6, "max_request_burst_per_user": 1_000_000,
                 "max_concurrent_reads_per_user": 1_000, "max_submissions_per_user_per_minute": 1_000_000}
"""Each user's share of a replica (services/frontend/quotas.py), lifted: a test is one or two users making
hundreds of calls a second, several at once."""


def limits_for_tests(**settings: Any) -> Limits:
    """The frontend's limits for a test: the defaults, but with each user's quotas lifted unless `settings`
    names them (tests/service/test_user_quotas.py and test_tenant_abuse.py hold users to them)."""
    return Limits(**{**QUOTAS_LIFTED, **settings})


UserToken = Callable[..., Awaitable[str]]
"""`await user_token(name, roles=("user",))`: a new user and an API token for them."""


@pytest.fixture
def user_token(auth_app: AuthApp) -> UserToken:
    store = AuthStore(auth_app.db)

    async def create(name: str, roles: Iterable[str] = ("user",)) -> str:
        await store.create_user(name, roles=frozenset(roles))
        _, secret = await store.create_token(name, "api", name="test")
        return secret

    return create


@pytest.fixture
async def frontend(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                   tmp_path: Path) -> AsyncIterator[FrontendApp]:
    """The whole frontend (services.frontend.app) on port 0, verifying tokens with `auth_app`,
    keeping specs and logs under the test's tmp_path, notifying no driver."""
    app = await start_frontend(FrontendConfig(service_url(db_config, "frontend"), certs.directory,
                                              f"localhost:{auth_app.internal_port}", f"file://{tmp_path / 'blobs'}",
                                              limits=limits_for_tests()))
    try:
        yield app
    finally:
        await app.stop()


@dataclasses.dataclass
class FrontendServer:
    """A frontend's public listener serving the services under test."""

    port: int
    db: Database
    servers: RunningServers
    billing: BillingServicer


@pytest.fixture
async def frontend_billing(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                           auth_app: AuthApp) -> AsyncIterator[FrontendServer]:
    """BillingService as the frontend serves it: TLS for people, each bearer token
    verified by the auth service over mutual TLS with the 'frontend' certificate."""
    tls = certs.issue("frontend")
    db = await Database.connect(db_config)
    auth_channel = service_channel(tls, auth_app.internal_port)
    billing = BillingServicer(BillingStore(db))
    servers = await serve(
        [Service("corral.billing.v1.BillingService", billing,
                 billing_service_pb2_grpc.add_BillingServiceServicer_to_server)],
        [Listener("127.0.0.1:0", tls, BearerAuthenticator(RemoteTokenVerifier(auth_channel)), internal=False)],
        limits=CallLimits(field_limits=request_field_limits(Limits())),
    )
    try:
        yield FrontendServer(servers.ports[0], db, servers, billing)
    finally:
        await servers.stop(grace_s=1.0)
        await auth_channel.close()
        await db.close()
