"""Two driver processes' worth of wiring: one leads, the standby names it and
takes over when the leader stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.driver.app import DriverConfig, start
from tests.conftest import service_url
from tests.service.conftest import service_channel


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_standby_names_the_leader_and_takes_over(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                                                       tmp_path: Path) -> None:
    def config(name: str) -> DriverConfig:
        return DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}", tmp_path / name)

    first = await start(config("a"))
    await eventually(lambda: first.election.is_leader)
    second = await start(config("b"))
    try:
        await eventually(lambda: second.election.state.leader == f"localhost:{first.port}")
        assert not second.election.is_leader
        async with service_channel(certs.issue("frontend"), second.port) as channel:
            leader = await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest())
        assert leader.leader_address == f"localhost:{first.port}"
        epoch = first.election.state.epoch
        await first.stop()
        await eventually(lambda: second.election.is_leader, timeout_s=5)
        assert second.election.state.epoch == epoch + 1
    finally:
        await second.stop()
