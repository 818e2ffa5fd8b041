"""Two driver processes' worth of wiring: one leads and says SERVING, the
standby says NOT_SERVING, names it, and takes over when the leader stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.driver.app import DriverApp, DriverConfig, start
from services.driver.leader import LeaseSettings
from tests.conftest import service_url
from tests.service.conftest import service_channel


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def health(certs: DevCertificateAuthority, driver: DriverApp, service: str) -> int:
    async with service_channel(certs.issue("frontend"), driver.port) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service))
    return answer.status


async def test_standby_names_the_leader_and_takes_over(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                                                       tmp_path: Path) -> None:
    def config(name: str) -> DriverConfig:
        # A lease far longer than the test: the standby can only take over because the leader gives it up.
        return DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                            tmp_path / name, lease=LeaseSettings(lease_s=600.0, renew_s=0.2))

    first = await start(config("a"))
    await eventually(lambda: first.election.is_leader)
    second = await start(config("b"))
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def statuses(driver: DriverApp) -> tuple[int, int]:
        return (await health(certs, driver, "corral.driver.v1.DriverService"), await health(certs, driver, ""))

    try:
        await eventually(lambda: second.election.state.leader == f"localhost:{first.port}")
        assert not second.election.is_leader
        async with service_channel(certs.issue("frontend"), second.port) as channel:
            leader = await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest())
        assert leader.leader_address == f"localhost:{first.port}"
        # Only the leader is ready: the gateway and Kubernetes send workers there by health.
        assert await statuses(first) == (serving, serving)
        assert await statuses(second) == (not_serving, not_serving)
        epoch = first.election.state.epoch
        await first.stop()
        await eventually(lambda: second.election.is_leader, timeout_s=20)
        assert second.election.state.epoch == epoch + 1
        for _ in range(100):
            if await statuses(second) == (serving, serving):
                break
            await asyncio.sleep(0.05)
        assert await statuses(second) == (serving, serving)
    finally:
        await second.stop()
