"""Health tells the truth: a service whose database is gone says NOT_SERVING and answers
UNAVAILABLE (not INTERNAL), and says SERVING again once the database is back."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.auth.v1 import auth_service_pb2, auth_service_pb2_grpc
from services.auth.app import AuthConfig, start
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.db.migrations import migrate
from services.db.server import PrivateMariaDB
from services.up import DatabaseWatch
from tests.conftest import service_url
from tests.service.conftest import bearer, person_channel

pytestmark = pytest.mark.timeout(120)


async def status_of(stub: health_pb2_grpc.HealthStub) -> int:
    return (await stub.Check(health_pb2.HealthCheckRequest(service="corral.auth.v1.AuthService"), timeout=5)).status


async def until(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "not reached"
        await asyncio.sleep(0.1)


async def test_a_service_without_its_database_is_not_serving(tmp_path: Path, certs: DevCertificateAuthority) -> None:
    mariadb = PrivateMariaDB(tmp_path / "mariadb", fast_unsafe=True)
    admin = dataclasses.replace(mariadb.start(), database="corral_health")
    app = None
    try:
        migrate(admin, create_database=True)
        app = await start(AuthConfig(service_url(admin, "auth"), certs.directory))
        _, token = await AuthStore(app.db).ensure_admin("root")
        async with person_channel(certs.issue("frontend"), app.public_port) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            auth = auth_service_pb2_grpc.AuthServiceStub(channel)
            assert await status_of(health) == health_pb2.HealthCheckResponse.SERVING

            assert mariadb.process is not None
            mariadb.process.kill()  # as the OOM killer would
            mariadb.process.wait()

            async def not_serving() -> bool:
                return await status_of(health) == health_pb2.HealthCheckResponse.NOT_SERVING

            await until(not_serving)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await auth.ListUsers(auth_service_pb2.ListUsersRequest(), metadata=bearer(token), timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE

            watch = DatabaseWatch(mariadb)  # what corral up runs: it restarts the server
            watch.check()
            assert watch.restarts == 1 and mariadb.alive()

            async def serving() -> bool:
                return await status_of(health) == health_pb2.HealthCheckResponse.SERVING

            await until(serving)
            # The pool drops connections that died with the old server; a call works again.
            for _ in range(20):
                try:
                    await auth.ListUsers(auth_service_pb2.ListUsersRequest(), metadata=bearer(token), timeout=10)
                    break
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.UNAVAILABLE
            else:
                raise AssertionError("calls did not recover")
    finally:
        if app is not None:
            await app.stop()
        mariadb.stop()


def test_the_watch_backs_off_while_the_server_will_not_start() -> None:
    class Broken:
        process = None
        starts = 0

        def alive(self) -> bool:
            return False

        def error_log(self) -> str:
            return "InnoDB: out of disk"

        def start(self) -> DatabaseConfig:
            self.starts += 1
            raise RuntimeError("mariadbd exited")

    now = [0.0]
    broken = Broken()
    watch = DatabaseWatch(broken, clock=lambda: now[0])  # type: ignore[arg-type]
    tries = []
    for second in range(0, 40):
        now[0] = float(second)
        before = broken.starts
        watch.check()
        if broken.starts > before:
            tries.append(second)
    assert tries == [0, 1, 3, 7, 15, 31]  # 1 s, then doubling
    assert watch.restarts == 0
