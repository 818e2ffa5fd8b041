"""Workers follow the leader (issue 10), over real gRPC and mutual TLS:

- a worker given only a standby's address is sent to the leader;
- when a leader steps down, its sessions end and the worker finds whoever
  leads next, its running attempt untouched;
- a worker attached to a leader paused with SIGSTOP (a real
  `python -m services.driver` process) moves to the standby that takes
  over once the lease runs out, and the paused driver, resumed, steps down;
- health: only the leader says SERVING (test_driver_app.py checks the
  in-process wiring; here the processes).

Nothing here asserts how fast: bench/failover.py prints the failover times.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from services.common.tls import DevCertificateAuthority, WorkerIssuer
from services.db.database import DatabaseConfig
from services.db.invariants import check_invariants
from services.common.specs import SpecStore
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from services.worker.runtime import can_isolate
from tests.conftest import service_url
from tests.service.conftest import service_channel
from tests.service.test_worker import (  # noqa: F401 - fixtures shared with test_worker.py
    WAIT_FOR_GO,
    Cluster,
    cluster,
    eventually,
    leading_driver,
    make_cluster,
    script,
)
from tests.world import World

pytestmark = pytest.mark.timeout(120)

REPO_DIR = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- in-process drivers


async def test_a_worker_sent_away_by_a_standby_finds_the_leader(cluster: Cluster, db_config: DatabaseConfig,
                                                               tmp_path: Path) -> None:
    standby = await leading_driver(db_config, cluster.certs, tmp_path, "driver-b")
    cluster.drivers.append(standby)
    leader_address = f"localhost:{cluster.driver.port}"
    await eventually(lambda: standby.election.state.leader == leader_address, what="the standby names the leader")
    # The worker knows only the standby: its GetLeader names the leader, which the worker asks next.
    worker = await cluster.worker("w1", driver_addresses=(f"localhost:{standby.port}",))
    assert worker.worker.driver_address == leader_address
    assert cluster.driver.sessions is not None and "w1" in cluster.driver.sessions.connected_instances()
    assert standby.sessions is not None and not standby.sessions.connected_instances()


async def test_when_the_leader_steps_down_its_workers_follow_whoever_leads_next(
        cluster: Cluster, db_config: DatabaseConfig, tmp_path: Path) -> None:
    standby = await leading_driver(db_config, cluster.certs, tmp_path, "driver-b")
    cluster.drivers.append(standby)
    await eventually(lambda: standby.election.state.leader == f"localhost:{cluster.driver.port}", what="standby")
    worker = await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(f"{WAIT_FOR_GO}; echo still here"))
    running = await cluster.started(batch_id, job_id)
    old_epoch, opened = cluster.epoch, worker.worker.sessions_opened

    # An operator forces a new epoch: the leader's next renewal is refused and it steps down at once.
    await cluster.world.store.elect_leader("operator")
    await eventually(lambda: cluster.driver.election.step_downs, what="the leader steps down")
    assert cluster.driver.election.step_downs[0].startswith("the renewal was refused")

    # Whichever driver leads next (the forced epoch holds no lease: both campaign), the worker is with it.
    def new_leader() -> str:
        return next((f"localhost:{d.port}" for d in (cluster.driver, standby) if d.election.is_leader), "")

    await eventually(lambda: new_leader() and worker.worker.driver_address == new_leader()
                     and worker.worker.connected and worker.worker.sessions_opened > opened,
                     what="the worker attached to the new leader")
    assert worker.worker.epoch_seen == old_epoch + 2
    await cluster.go(running)
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Success"
    assert [a["attempt_id"] for a in await cluster.attempts(batch_id, job_id)] == [running["attempt_id"]]
    assert (await cluster.instance_row("w1"))["state"] == "active"
    assert await check_invariants(cluster.driver.db) == []


# ---------------------------------------------------------------- driver processes


@dataclasses.dataclass
class DriverProcess:
    """`python -m services.driver` on port 0."""

    name: str
    process: asyncio.subprocess.Process
    port: int
    log_path: Path

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    async def stop(self) -> None:
        """By its pid: resume it if paused, SIGTERM, SIGKILL if it does not go."""
        if self.process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


@contextlib.asynccontextmanager
async def driver_processes(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path,
                           *extra: str) -> AsyncIterator[list[DriverProcess]]:
    """Start driver processes with `start(name)`; all are stopped on the way out."""
    started: list[DriverProcess] = []
    env = {**os.environ, "CORRAL_DATABASE_URL": service_url(db_config, "driver")}

    async def start(name: str) -> DriverProcess:
        ports = tmp_path / f"{name}.ports"
        log_path = tmp_path / f"{name}.log"
        with open(log_path, "wb") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "services.driver", "--certs-dir", str(certs.directory),
                "--spec-root-url", f"file://{tmp_path / 'blobs'}", "--data-dir", str(tmp_path / name),
                "--ports-file", str(ports), *extra, env=env, cwd=REPO_DIR, stdout=log, stderr=asyncio.subprocess.STDOUT)
        driver = DriverProcess(name, process, 0, log_path)
        started.append(driver)
        await eventually(lambda: ports.exists() or process.returncode is not None, 60, f"{name}'s ports")
        assert process.returncode is None, log_path.read_text()
        driver.port = int(json.loads(ports.read_text())["internal"])
        return driver

    try:
        yield start  # type: ignore[misc]
    finally:
        for driver in started:
            await driver.stop()


async def get_leader(certs: DevCertificateAuthority, driver: DriverProcess) -> pb.GetLeaderResponse | None:
    """GetLeader of one driver as the frontend asks it; None if it does not answer in a second."""
    async with service_channel(certs.issue("frontend"), driver.port) as channel:
        try:
            return await driver_service_pb2_grpc.DriverServiceStub(channel).GetLeader(pb.GetLeaderRequest(),
                                                                                     timeout=1)
        except grpc.aio.AioRpcError:
            return None


async def health(certs: DevCertificateAuthority, driver: DriverProcess) -> int:
    async with service_channel(certs.issue("frontend"), driver.port) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="corral.driver.v1.DriverService"), timeout=5)
        return answer.status


async def test_a_worker_attached_to_a_paused_leader_moves_to_the_new_one(
        world: World, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    await world.db.execute("UPDATE instance_collections SET max_instances = 0")  # no workers of their own
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    async with driver_processes(db_config, certs, tmp_path, "--leader-lease", "3", "--leader-renew-interval", "0.3",
                                "--heartbeat-interval", "0.3", "--heartbeat-timeout", "60") as start:
        first = await start("driver-a")  # type: ignore[operator]

        async def leads(driver: DriverProcess) -> pb.GetLeaderResponse | None:
            answer = await get_leader(certs, driver)
            return answer if answer is not None and answer.is_leader else None

        old = await eventually(lambda: leads(first), 60, "driver-a leading")
        second = await start("driver-b")  # type: ignore[operator]

        async def names_first() -> bool:
            answer = await get_leader(certs, second)
            return answer is not None and answer.leader_address == first.address and not answer.is_leader

        await eventually(names_first, 60, "driver-b standing by")
        assert (await health(certs, first), await health(certs, second)) == (serving, not_serving)

        name = "w1"
        await world.store.create_instance(old.epoch, name, "standard", 2000, f"activate-{name}")
        worker_certs = WorkerIssuer(certs.directory).provision_worker(name, tmp_path / "worker-certs" / name).key.parent
        worker = await start_worker(WorkerConfig(
            instance_name=name, activation_token=f"activate-{name}", cores_mcpu=2000,
            driver_addresses=(first.address, second.address), certs_dir=worker_certs,
            scratch_dir=tmp_path / "scratch" / name, log_root_url=f"file://{tmp_path / 'blobs'}",
            heartbeat_interval_s=0.3, driver_silence_s=1.5, reconnect_max_backoff_s=0.5, leader_query_timeout_s=1.0,
            unisolated_dev=not can_isolate()))
        try:
            await eventually(lambda: worker.worker.connected and worker.worker.driver_address == first.address,
                             60, "the worker attached to driver-a")
            refs = await SpecStore(f"file://{tmp_path / 'blobs'}").write_bunch(
                10_001, 1, 1, [script(f"{WAIT_FOR_GO}; echo outlived the pause")])
            batch_id, _, job_id = await world.batch([{"spec_ref": refs[0]}])

            async def started() -> dict | None:
                return await world.db.fetchone("SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s "
                                               "AND start_time_ms IS NOT NULL", (batch_id, job_id))

            attempt = await eventually(started, 60, "the job started on w1")

            paused_at = time.monotonic()
            first.process.send_signal(signal.SIGSTOP)
            new = await eventually(lambda: leads(second), 60, "driver-b leading")
            took_over_s = time.monotonic() - paused_at
            assert new.epoch == old.epoch + 1 and new.leader_address == second.address
            await eventually(lambda: worker.worker.connected and worker.worker.driver_address == second.address
                             and worker.worker.epoch_seen == new.epoch, 60, "the worker attached to driver-b")
            print(f"SIGSTOP to standby leading: {took_over_s:.2f} s; "
                  f"to the worker attached to it: {time.monotonic() - paused_at:.2f} s")
            assert worker.worker.silences >= 1  # it stopped waiting for the paused driver on its own

            # Resumed, the old leader knows it lost the lease: it stops leading and says so.
            first.process.send_signal(signal.SIGCONT)

            async def stood_down() -> bool:
                answer = await get_leader(certs, first)
                return answer is not None and not answer.is_leader and answer.leader_address == second.address

            await eventually(stood_down, 60, "driver-a standing by")

            async def first_not_serving() -> bool:
                return await health(certs, first) == not_serving

            await eventually(first_not_serving, 30, "driver-a NOT_SERVING")
            assert await health(certs, second) == serving
            assert "steps down" in first.log_path.read_text()

            # The attempt ran through the pause and completes, once; the worker was never declared dead.
            work_dir = tmp_path / "scratch" / name / f"{batch_id}-{job_id}-{attempt['attempt_id']}" / "work"
            (work_dir / "go").touch()

            async def final() -> dict | None:
                row = await world.db.fetchone("SELECT state FROM jobs WHERE batch_id = %s AND job_id = %s",
                                              (batch_id, job_id))
                return row if row["state"] in ("Success", "Failed", "Error", "Cancelled") else None

            assert (await eventually(final, 60, "the job final"))["state"] == "Success"
            attempts = await world.db.fetchall("SELECT attempt_id FROM attempts WHERE batch_id = %s", (batch_id,))
            assert [a["attempt_id"] for a in attempts] == [attempt["attempt_id"]]
            assert (await world.db.fetchone("SELECT state FROM instances WHERE name = %s", (name,)))["state"] == "active"
            assert await check_invariants(world.db) == []
        finally:
            await worker.stop()


async def test_a_killed_leaders_lease_is_taken_over_long_before_it_runs_out(
        world: World, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """SIGKILL closes the leader's database connection with it: the standby (calling the procedures as
    the driver's own account) takes over at its next look, not after the ten-minute lease."""
    await world.db.execute("UPDATE instance_collections SET max_instances = 0")
    async with driver_processes(db_config, certs, tmp_path, "--leader-lease", "600",
                                "--leader-renew-interval", "0.3") as start:
        first = await start("driver-a")  # type: ignore[operator]

        async def leads(driver: DriverProcess) -> pb.GetLeaderResponse | None:
            answer = await get_leader(certs, driver)
            return answer if answer is not None and answer.is_leader else None

        old = await eventually(lambda: leads(first), 60, "driver-a leading")
        second = await start("driver-b")  # type: ignore[operator]

        async def names_first() -> bool:
            answer = await get_leader(certs, second)
            return answer is not None and answer.leader_address == first.address

        await eventually(names_first, 60, "driver-b standing by")
        killed_at = time.monotonic()
        first.process.kill()
        await first.process.wait()
        new = await eventually(lambda: leads(second), 60, "driver-b leading")
        print(f"SIGKILL to standby leading: {time.monotonic() - killed_at:.2f} s (lease 600 s)")
        assert new.epoch == old.epoch + 1
        assert "holder gone" in second.log_path.read_text()
