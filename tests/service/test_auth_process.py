"""`python -m services.auth` runs as its own process, from its own certificate directory and with
its database URL in the environment, takes its login limits from the command line, and stops
cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.auth.v1 import auth_service_pb2 as pb
from corral.auth.v1 import auth_service_pb2_grpc
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from tests.conftest import service_url
from tests.service.conftest import person_channel


async def test_auth_process_serves_and_stops_on_sigterm(db_config: DatabaseConfig, tmp_path: Path) -> None:
    certs = DevCertificateAuthority(tmp_path / "ca")
    own = certs.provision("auth", tmp_path / "auth-certs")
    assert sorted(p.name for p in own.key.parent.iterdir()) == ["auth.key", "auth.pem", "ca.pem"]
    ports_file = tmp_path / "auth.ports"
    db = await Database.connect(db_config)
    try:
        await AuthStore(db).create_user("alice", password="correct horse")
    finally:
        await db.close()
    process = subprocess.Popen(
        [sys.executable, "-m", "services.auth", "--certs-dir", str(own.key.parent), "--ports-file", str(ports_file),
         "--login-free-failures-per-user", "2", "--login-max-delay-per-user-s", "1"],
        env={**os.environ, "CORRAL_DATABASE_URL": service_url(db_config, "auth")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for _ in range(200):
            if ports_file.exists() or process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        assert process.poll() is None, process.stdout.read().decode() if process.stdout else ""
        ports = json.loads(ports_file.read_text())
        assert ports_file.stat().st_mode & 0o077 == 0  # the service's files are its own
        async with person_channel(certs.issue("probe"), ports["public"]) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            stub = auth_service_pb2_grpc.AuthServiceStub(channel)
            codes = []
            for _ in range(3):
                try:
                    await stub.Login(pb.LoginRequest(username="alice", password="guess"), timeout=10)
                except grpc.aio.AioRpcError as e:
                    codes.append(e.code())
            assert codes == [grpc.StatusCode.UNAUTHENTICATED] * 2 + [grpc.StatusCode.RESOURCE_EXHAUSTED]
            for _ in range(100):  # the lock is 1 s: poll until the right password is let through
                try:
                    await stub.Login(pb.LoginRequest(username="alice", password="correct horse"), timeout=10)
                    break
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("the right password was still refused after the lock")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if process.stdout:
            process.stdout.close()
