"""Bootstrap end to end (issue 16): a real driver behind the real internal gateway (Envoy), and a worker
process started with `--cloud gcp` (or `azure`) on a "machine" whose metadata server is a loopback one
(tests/fake_metadata.py) holding only its boot data: a one-time token and the CA certificate, no key.

- the gateway's enrollment listener (TLS, no client certificate) serves Enroll and nothing else;
- the worker reads its boot data, makes its key, enrolls through that listener, and activates through the
  gateway's mutual-TLS listener with the certificate it got; its token is then spent;
- when the cloud says the machine is preempted, the worker leaves at once, saying so: its instance ends
  as preempted.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, worker_enrollment_service_pb2_grpc
from corral.driver.v1 import worker_enrollment_service_pb2 as epb
from services.common.tls import DevCertificateAuthority, certificate_request
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.driver.app import DriverApp, DriverConfig, local_worker_command, start
from services.driver.providers.interface import InstanceRequest
from services.driver.enrollment import REFUSED
from services.driver.leader import LeaseSettings
from services.driver.providers.worker_metadata import METADATA_URL_ENV, WorkerBootstrap
from tests import fake_metadata
from tests.conftest import service_url
from tests.envoy_gateway import gateway_deployment, running

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]


async def eventually(predicate, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.1)


@pytest.fixture
async def driver(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path
                 ) -> AsyncIterator[DriverApp]:
    app = await start(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                   tmp_path / "driver", lease=LeaseSettings(lease_s=600.0, renew_s=0.5),
                                   autoscaler_period_s=3600.0))
    try:
        deadline = time.monotonic() + 30
        while not app.election.is_leader:
            assert time.monotonic() < deadline, "the driver never led"
            await asyncio.sleep(0.05)
        yield app
    finally:
        await app.stop()


async def instance_row(db: Database, name: str) -> dict:  # type: ignore[type-arg]
    row = await db.fetchone("SELECT state, time_enrolled_ms, deactivation_reason FROM instances WHERE name = %s",
                            (name,))
    assert row is not None
    return row


@pytest.mark.parametrize("cloud", ["gcp", "azure"])
async def test_a_cloud_worker_enrolls_through_the_gateway_activates_and_leaves_when_preempted(
        cloud: str, driver: DriverApp, db: Database, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    epoch = driver.election.state.epoch
    assert epoch is not None
    await JobStore(db).create_instance(epoch, "standard-cafe01", "standard", 1000, "one-time-token-of-cafe01",
                                       preemptible=True)
    deployment = gateway_deployment(tmp_path / "gateway", certs, 1, [1], [driver.port], enroll=True)
    async with running(deployment, tmp_path / "gateway", "internal", healthy=("driver",)) as (envoy, port):
        enroll_port = (await asyncio.to_thread(envoy.listener_ports))["enroll"]
        anonymous = grpc.ssl_channel_credentials(certs.ca_cert_path.read_bytes())

        # The enrollment listener serves Enroll alone: anything else is UNIMPLEMENTED (Envoy's 404), and the
        # driver never sees it.
        async with grpc.aio.secure_channel(f"localhost:{enroll_port}", anonymous) as channel:
            for call in (driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest(),
                                                                                        timeout=10),
                         worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel).Renew(
                             epb.RenewRequest(csr_pem=certificate_request("x")[1].decode()), timeout=10)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await call
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED, refused.value
        # The mutual-TLS listener still wants a client certificate, Enroll or not.
        async with grpc.aio.secure_channel(f"localhost:{port}", anonymous) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel).Enroll(
                    epb.EnrollRequest(instance_name="standard-cafe01", activation_token="one-time-token-of-cafe01",
                                      csr_pem=certificate_request("x")[1].decode()), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE  # the handshake fails

        boot = WorkerBootstrap(
            instance_name="standard-cafe01", activation_token="one-time-token-of-cafe01",
            enroll_address=f"localhost:{enroll_port}", driver_addresses=(f"localhost:{port}",),
            ca_cert_pem=certs.ca_cert_path.read_text(),
            worker_args=("--cores-mcpu", "1000", "--scratch-dir", str(tmp_path / "scratch"),
                         "--log-root-url", f"file://{tmp_path / 'blobs'}", "--runtime", "process"))
        certs_dir = tmp_path / "machine" / "certs"
        with fake_metadata.serving() as metadata:
            metadata.bootstrap_json = boot.to_json()
            metadata.vm_name = "standard-cafe01"
            env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
            env[METADATA_URL_ENV] = metadata.gcp_root if cloud == "gcp" else metadata.azure_root
            log_path = tmp_path / "worker.log"
            with open(log_path, "wb") as log_file:
                worker = subprocess.Popen([sys.executable, "-m", "services.worker", "--cloud", cloud,
                                           "--certs-dir", str(certs_dir)],
                                          cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
            try:
                async def active() -> bool:
                    assert worker.poll() is None, log_path.read_text()
                    return (await instance_row(db, "standard-cafe01"))["state"] == "active"

                await eventually(active)
                row = await instance_row(db, "standard-cafe01")
                assert row["time_enrolled_ms"] is not None
                # The key was made on the machine and kept private; no key came in the boot data.
                assert stat.S_IMODE(certs_dir.stat().st_mode) == 0o700
                assert stat.S_IMODE((certs_dir / "worker-standard-cafe01.key").stat().st_mode) == 0o600
                assert "PRIVATE KEY" not in metadata.bootstrap_json

                # The token is spent: whoever else holds it is refused, through the gateway too.
                async with grpc.aio.secure_channel(f"localhost:{enroll_port}", anonymous) as channel:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel).Enroll(
                            epb.EnrollRequest(instance_name="standard-cafe01",
                                              activation_token="one-time-token-of-cafe01",
                                              csr_pem=certificate_request("x")[1].decode()), timeout=10)
                    assert (refused.value.code(), refused.value.details()) == (
                        grpc.StatusCode.PERMISSION_DENIED, REFUSED)

                # The cloud reclaims the machine: the worker says so at once and leaves.
                if cloud == "gcp":
                    metadata.preempt()
                else:
                    metadata.events.append({
                        "EventId": "evict-1", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                        "Resources": ["standard-cafe01"], "EventStatus": "Scheduled", "NotBefore": "",
                        "Description": "", "EventSource": "Platform", "DurationInSeconds": -1})
                await asyncio.to_thread(worker.wait, 30)
                if cloud == "azure":
                    assert metadata.acknowledged == ["evict-1"]
                row = await instance_row(db, "standard-cafe01")
                assert row["state"] == "inactive", log_path.read_text()
                assert row["deactivation_reason"] == "the cloud reclaimed the machine", log_path.read_text()
            finally:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()


async def test_a_local_worker_may_enroll_as_a_cloud_worker_does(db_config: DatabaseConfig, db: Database,
                                                                 certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """With local_workers_enroll, the local provider gives its worker the CA certificate alone: the worker
    makes its key and enrolls at the driver's own enrollment listener with the token in its environment."""
    app = await start(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                   tmp_path / "driver", lease=LeaseSettings(lease_s=600.0, renew_s=0.5),
                                   autoscaler_period_s=3600.0, enroll_address="127.0.0.1:0",
                                   local_workers_enroll=True))
    try:
        deadline = time.monotonic() + 30
        while not app.election.is_leader:
            assert time.monotonic() < deadline, "the driver never led"
            await asyncio.sleep(0.05)
        epoch = app.election.state.epoch
        assert epoch is not None and app.enroll_port is not None
        await JobStore(db).create_instance(epoch, "standard-local01", "standard", 1000, "token-of-local01")
        await app.provider.create(InstanceRequest("standard-local01", "standard", 1000, 0, "local",
                                                  "token-of-local01"))
        certs_dir = tmp_path / "driver" / "worker-certs" / "standard-local01"
        # What the driver gives such a worker: the CA certificate and where to enroll, no key.
        config = DriverConfig("mysql://x", certs.directory, "file:///b", tmp_path / "other", local_workers_enroll=True,
                              enroll_address="127.0.0.1:0")
        argv = local_worker_command(config, lambda: "localhost:1", lambda: "localhost:2")(
            InstanceRequest("standard-other", "standard", 1000, 0, "local", "t"))
        assert argv[argv.index("--enroll-address") + 1] == "localhost:2"
        given = tmp_path / "other" / "worker-certs" / "standard-other"
        assert sorted(p.name for p in given.iterdir()) == ["ca.pem"]
        assert stat.S_IMODE(given.stat().st_mode) == 0o700

        async def active() -> bool:
            log = tmp_path / "driver" / "worker-logs" / "standard-local01.log"
            assert app.provider.pid("standard-local01") is not None, log.read_text() if log.exists() else ""
            return (await instance_row(db, "standard-local01"))["state"] == "active"

        await eventually(active)
        assert (await instance_row(db, "standard-local01"))["time_enrolled_ms"] is not None
        assert stat.S_IMODE((certs_dir / "worker-standard-local01.key").stat().st_mode) == 0o600
    finally:
        await app.stop()
