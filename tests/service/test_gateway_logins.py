"""Logins through the public gateway are throttled by the client's own address (issue 14's gateway must not
make every person one source): the real Envoy adds its secret to calls it forwards to auth, and auth, given
the same secret, believes the gateway's x-forwarded-for on those calls alone.

Clients on loopback differ by their source address (127.0.0.2, 127.0.0.3: all of 127/8 is loopback)."""

from __future__ import annotations

import dataclasses
import secrets
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest

from corral.auth.v1 import auth_service_pb2_grpc
from services.auth.app import AuthApp, AuthConfig, start
from services.auth.login_limits import Backoff, LoginLimits
from services.auth.store import AuthStore
from services.common.identity import GATEWAY_TOKEN_HEADER
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.gateway.deployment import Limits
from tests.envoy_gateway import gateway_deployment, running
from tests.service.conftest import person_channel
from tests.service.test_auth_hardening import EXHAUSTED, PASSWORD, UNAUTHENTICATED, login

pytestmark = pytest.mark.timeout(120)

FREE_FAILURES = 3
"""Failed logins a source may make back to back before it is locked (per user: plenty)."""


@pytest.fixture
async def auth(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[
        tuple[AuthApp, str]]:
    token = secrets.token_urlsafe(32)
    (tmp_path / "gateway.token").write_text(token)
    app = await start(AuthConfig(db_config.to_url(), certs.directory, gateway_token_file=tmp_path / "gateway.token",
                                 login_limits=LoginLimits(per_user=Backoff(free_failures=1000),
                                                          per_source=Backoff(free_failures=FREE_FAILURES))))
    try:
        await AuthStore(app.db).create_user("alice", password=PASSWORD)
        yield app, token
    finally:
        await app.stop()


def from_address(certs: DevCertificateAuthority, port: int, source: str) -> httpx.AsyncClient:
    """A REST client whose connections come from `source` (a loopback address of its own)."""
    context = ssl.create_default_context(cafile=str(certs.ca_cert_path))
    return httpx.AsyncClient(base_url=f"https://localhost:{port}", verify=context, timeout=30,
                             transport=httpx.AsyncHTTPTransport(local_address=source, verify=context))


async def test_each_client_behind_the_gateway_has_its_own_login_limit(
        auth: tuple[AuthApp, str], certs: DevCertificateAuthority, tmp_path: Path) -> None:
    app, token = auth
    deployment = gateway_deployment(tmp_path / "gateway", certs, app.public_port, [app.public_port],
                                    [app.internal_port], Limits(health_check_interval_s=0.2))
    deployment = dataclasses.replace(deployment, auth_token=token)
    async with running(deployment, tmp_path / "gateway", "public", healthy=("auth",)) as (_, port):
        async with from_address(certs, port, "127.0.0.2") as guesser:
            codes = []
            for i in range(FREE_FAILURES + 2):
                # A header of the client's own is replaced by the gateway's: it earns no trust, and the
                # x-forwarded-for it writes is not the last entry, which the gateway appends.
                answer = await guesser.post("/api/v1/auth/login", json={"username": f"nobody{i}", "password": "x"},
                                            headers={GATEWAY_TOKEN_HEADER: token[:-1] + "?",
                                                     "x-forwarded-for": f"10.0.0.{i}"})
                codes.append(answer.status_code)
            assert codes == [401] * FREE_FAILURES + [429] * 2, codes
            locked = await guesser.post("/api/v1/auth/login", json={"username": "alice", "password": PASSWORD})
            assert locked.status_code == 429 and "per_source" in locked.text
        # Another client through the same gateway is not held by that lock.
        async with from_address(certs, port, "127.0.0.3") as other:
            answer = await other.post("/api/v1/auth/login", json={"username": "alice", "password": PASSWORD})
            assert answer.status_code == 200, answer.text
            assert answer.json()["token"]


async def test_straight_to_auth_a_claimed_address_counts_for_nothing(
        auth: tuple[AuthApp, str], certs: DevCertificateAuthority) -> None:
    """A caller that reaches auth's listener itself is counted by its connection, whatever headers it sends;
    only the gateway's own token makes x-forwarded-for count."""
    app, token = auth
    async with person_channel(certs.issue("someone"), app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        codes = []
        for i in range(FREE_FAILURES + 1):
            forged = ((GATEWAY_TOKEN_HEADER, "not-the-token-" + "x" * 32), ("x-forwarded-for", f"10.1.0.{i}"))
            codes.append((await login(stub, f"nobody{i}", "x", metadata=forged))[0])
        assert codes == [UNAUTHENTICATED] * FREE_FAILURES + [EXHAUSTED]
        # With the token, the gateway's last entry is the source: a fresh one.
        trusted = ((GATEWAY_TOKEN_HEADER, token), ("x-forwarded-for", "10.2.0.1"))
        assert (await login(stub, "alice", PASSWORD, metadata=trusted))[0] == grpc.StatusCode.OK
        assert (await login(stub, "alice", PASSWORD))[0] == EXHAUSTED  # the peer itself is still locked
