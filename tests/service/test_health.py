"""Health tells the truth: a service whose database is gone says NOT_SERVING and answers
UNAVAILABLE (not INTERNAL), and says SERVING again once `corral up`'s supervisor has started the
database again (its back-off: tests/unit/test_supervisor.py)."""

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
from services.db.migrations import migrate
from services.db.server import PrivateMariaDB
from services.common.processes import PidFiles
from services.up.database import DatabaseServer
from services.up.supervisor import Supervisor
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
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path / "pids"), say=said.append)  # what corral up runs
    database = DatabaseServer(mariadb)
    supervisor.start(database)
    assert database.admin is not None
    admin = dataclasses.replace(database.admin, database="corral_health")
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
            killed = mariadb.process.pid
            mariadb.process.kill()  # as the OOM killer would
            mariadb.process.wait()

            async def not_serving() -> bool:
                return await status_of(health) == health_pb2.HealthCheckResponse.NOT_SERVING

            await until(not_serving)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await auth.ListUsers(auth_service_pb2.ListUsersRequest(), metadata=bearer(token), timeout=10)
            assert error.value.code() == grpc.StatusCode.UNAVAILABLE

            supervisor.check()  # it restarts the server at once, saying why it died
            assert supervisor.restarts == 1 and mariadb.alive()
            assert said[0].startswith(f"mariadb (pid {killed}) exited with -9 (killed by SIGKILL) after ")
            assert "error.log" in said[0] and said[1] == f"mariadb restarted (pid {database.pid})"

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
        supervisor.end(["mariadb"], grace_s=30)
        mariadb.stop()
