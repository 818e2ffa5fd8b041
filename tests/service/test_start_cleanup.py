"""A service whose start fails halfway (its port is taken: a restarted driver finds its old port held)
closes what it had opened before the error propagates: no database connection is left behind, and the
listener it had already started is stopped."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql
import pytest

from services.auth.app import AuthConfig
from services.auth.app import start as start_auth
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.driver.app import DriverConfig
from services.driver.app import start as start_driver
from services.frontend.app import FrontendConfig
from services.frontend.app import start as start_frontend
from tests.conftest import service_url


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connections(admin: DatabaseConfig) -> int:
    """Connections to the test's database, from any account."""
    conn = pymysql.connect(**admin.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = %s", (admin.database,))
            (n,) = cursor.fetchone()
        return int(n)
    finally:
        conn.close()


async def no_connections_left(admin: DatabaseConfig) -> bool:
    """Whether the test's database has no connection left, once the event loop has run the closing
    of the sockets the pool closed (asyncio closes a transport on the loop's next turn)."""
    deadline = time.monotonic() + 10
    while connections(admin) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return connections(admin) == 0


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


async def test_a_driver_that_cannot_listen_closes_its_pool(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                                                           tmp_path: Path, taken_port: int) -> None:
    assert await no_connections_left(db_config)
    with pytest.raises(RuntimeError, match="Failed to bind"):
        await start_driver(DriverConfig(service_url(db_config, "driver"), certs.directory,
                                        f"file://{tmp_path / 'blobs'}", tmp_path,
                                        internal_address=f"127.0.0.1:{taken_port}"))
    assert await no_connections_left(db_config)


async def test_auth_stops_its_first_listener_when_the_second_cannot_start(
        db_config: DatabaseConfig, certs: DevCertificateAuthority, taken_port: int) -> None:
    public = free_port()
    with pytest.raises(RuntimeError, match="Failed to bind"):
        await start_auth(AuthConfig(service_url(db_config, "auth"), certs.directory,
                                    public_address=f"127.0.0.1:{public}", internal_address=f"127.0.0.1:{taken_port}"))
    assert port_is_free(public)  # the public listener had started: it was stopped
    assert await no_connections_left(db_config)


async def test_a_frontend_that_cannot_listen_closes_what_it_opened(
        db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path, taken_port: int) -> None:
    public = free_port()
    with pytest.raises(RuntimeError, match="Failed to bind"):
        await start_frontend(FrontendConfig(service_url(db_config, "frontend"), certs.directory, "localhost:1",
                                            f"file://{tmp_path / 'blobs'}", public_address=f"127.0.0.1:{public}",
                                            internal_address=f"127.0.0.1:{taken_port}"))
    assert port_is_free(public)
    assert await no_connections_left(db_config)
