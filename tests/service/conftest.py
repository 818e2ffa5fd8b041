"""Fixtures for services over real gRPC on loopback with a development CA."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.auth.app import AuthApp, AuthConfig, start
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority, TlsFiles
from services.db.database import DatabaseConfig


@pytest.fixture
def certs(tmp_path: Path) -> DevCertificateAuthority:
    return DevCertificateAuthority(tmp_path / "certs")


@pytest.fixture
async def auth_app(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[AuthApp]:
    app = await start(AuthConfig(db_config.to_url(), certs.directory, ports_file=tmp_path / "auth.ports"))
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
