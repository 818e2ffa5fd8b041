"""`python -m services.health`, the readiness probe of helm/corral: over the driver's own mutual TLS it passes
for the leader alone, and a leader advertising another host (--advertise-host, as in Kubernetes) is named by
it to the standbys and to GetLeader."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.driver.app import DriverConfig, start
from services.driver.leader import LeaseSettings
from services.up.ports import free_port
from tests.conftest import service_url
from tests.service.conftest import service_channel
from tests.service.test_driver_app import eventually

DRIVER_SERVICE = "corral.driver.v1.DriverService"


async def probe(certs_dir: Path, port: int, service: str = DRIVER_SERVICE, identity: str = "driver") -> tuple[int, str]:
    """The probe's exit status and what it said, as the kubelet runs it (a process of its own)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.health", "--address", f"localhost:{port}", "--certs-dir", str(certs_dir),
        "--identity", identity, "--service", service, "--timeout-s", "5",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, err.decode()


async def test_only_the_leader_passes_the_probe(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                                                tmp_path: Path) -> None:
    certs.issue("driver")

    def config(name: str) -> DriverConfig:
        return DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                            tmp_path / name, advertise_host="corral-driver-leader",
                            lease=LeaseSettings(lease_s=600.0, renew_s=0.2))

    leader = await start(config("a"))
    try:
        await eventually(lambda: leader.election.is_leader)
        standby = await start(config("b"))
        try:
            await eventually(lambda: standby.election.state.leader == f"corral-driver-leader:{leader.port}")
            async with service_channel(certs.issue("frontend"), standby.port) as channel:
                answer = await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest())
            assert answer.leader_address == f"corral-driver-leader:{leader.port}"

            for _ in range(100):  # health follows the election within its period
                if (await probe(certs.directory, leader.port))[0] == 0:
                    break
                await asyncio.sleep(0.1)
            assert await probe(certs.directory, leader.port) == (0, "")
            status, said = await probe(certs.directory, standby.port)
            assert status == 1 and "NOT_SERVING" in said, said
            # A standby says NOT_SERVING for its whole server too: liveness cannot ask health (the chart's is a
            # TCP check), or standbys would be restarted forever.
            assert (await probe(certs.directory, standby.port, service=""))[0] == 1
        finally:
            await standby.stop()
    finally:
        await leader.stop()


async def test_the_probe_fails_without_an_answer_or_a_certificate(certs: DevCertificateAuthority,
                                                                  tmp_path: Path) -> None:
    certs.issue("driver")
    status, said = await probe(certs.directory, free_port())
    assert status == 1 and "did not answer" in said, said
    status, said = await probe(tmp_path, free_port())
    assert status == 1 and "no certificate" in said, said
