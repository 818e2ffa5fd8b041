"""Two driver processes' worth of wiring: one leads and says SERVING, the
standby says NOT_SERVING, names it, and takes over when the leader stops; a
new leader ends at once the instances whose local workers ended."""

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
from tests.world import World


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


async def test_a_new_leader_ends_at_once_what_ran_on_workers_that_ended_and_its_stop_starts_no_machine(
        world: World, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """Issue 36: a restarted `corral up` found its predecessor's instance as live and waited minutes (heartbeats,
    "never activated") before the job on it ran again. The local worker process of that instance ended with the
    earlier run (its log is all that is left): the driver ends the instance as soon as it leads."""
    await world.db.execute("UPDATE instance_collections SET max_instances = 0")  # no worker process starts here
    await world.instance("standard-0ld", cores_mcpu=4000)
    batch_id, _, job_id = await world.batch([{}])
    attempt = await world.run(batch_id, job_id, instance="standard-0ld")
    data_dir = tmp_path / "driver"
    (data_dir / "worker-logs").mkdir(parents=True)
    (data_dir / "worker-logs" / "standard-0ld.log").write_text("an earlier run's worker\n")
    driver = await start(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                      data_dir, stopping_file=tmp_path / "stopping"))
    try:
        await eventually(lambda: driver.election.is_leader)
        for _ in range(100):  # well under the reconciler's 60 s period and 300 s grace
            if await world.store.instance_state("standard-0ld") == "inactive":
                break
            await asyncio.sleep(0.05)
        assert await world.store.instance_state("standard-0ld") == "inactive"
        job = await world.job(batch_id, job_id)
        assert (job["state"], job["attempt_id"]) == ("Ready", attempt)
    finally:
        await driver.stop()
    assert driver.stopping.why() == "this driver is stopping"
