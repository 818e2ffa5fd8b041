"""The frontend's driver notifier against real drivers.

The drivers' Ready cancellers are given an hour-long period, so within a
test only a notification can wake them: a cancelled batch whose Ready jobs
drain at once proves the NotifyChange reached the leader. No instance may
be created (max_instances = 0), so no worker process is started.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.batch.v1 import batch_service_pb2 as bpb
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.driver.app import DriverApp, DriverConfig
from services.driver.app import start as start_driver
from services.driver.canceller import ReadyCanceller
from services.frontend.notify import DriverNotifier
from tests.conftest import service_url
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import Env, make_env, spec, start_frontend
from tests.world import FakeClock


def ready_canceller(driver: DriverApp) -> ReadyCanceller:
    return next(loop for loop in driver.loops if isinstance(loop, ReadyCanceller))


async def start_quiet_driver(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path,
                             name: str) -> DriverApp:
    driver = await start_driver(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                             tmp_path / name, name=f"driver-{name}", autoscaler_period_s=3600))
    # Before the loops' first wait: from now on they wake only when notified.
    ready_canceller(driver).period_s = 3600
    return driver


@pytest.fixture
async def drivers(db_config: DatabaseConfig, db: Database, certs: DevCertificateAuthority,
                  tmp_path: Path) -> AsyncIterator[list[DriverApp]]:
    """A leader, then a standby that knows it."""
    await db.execute("UPDATE instance_collections SET max_instances = 0, max_live_instances = 0")
    started = [await start_quiet_driver(db_config, certs, tmp_path, "a")]
    try:
        await eventually(lambda: started[0].election.is_leader)
        started.append(await start_quiet_driver(db_config, certs, tmp_path, "b"))
        await eventually(lambda: started[1].election.state.leader == f"localhost:{started[0].port}")
        yield started
    finally:
        for driver in started:
            if driver.tasks and not driver.tasks[0].done():
                await driver.stop()


async def frontend_env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
                       certs: DevCertificateAuthority, tmp_path: Path, addresses: tuple[str, ...],
                       deadline_s: float = 1.0) -> AsyncIterator[Env]:
    frontend = await start_frontend(auth_app, db_config, certs, tmp_path / "blobs", driver_addresses=addresses,
                                    notify_deadline_s=deadline_s)
    try:
        async for env in make_env(frontend, auth_app, db, clock, certs, tmp_path / "blobs", elect=False):
            yield env
    finally:
        await frontend.stop()


async def drained(env: Env, batch_id: int) -> None:
    async def states() -> set[str]:
        rows = await env.world.db.fetchall("SELECT state FROM jobs WHERE batch_id = %s", (batch_id,))
        return {r["state"] for r in rows}

    deadline = asyncio.get_running_loop().time() + 10
    while await states() != {"Cancelled"}:
        assert asyncio.get_running_loop().time() < deadline, f"batch {batch_id} was not drained"
        await asyncio.sleep(0.05)


async def test_cancellations_reach_the_leader_through_a_standby_and_after_failover(
        drivers: list[DriverApp], auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
        certs: DevCertificateAuthority, tmp_path: Path) -> None:
    leader, standby = drivers
    # The standby first: it names the leader.
    addresses = (f"localhost:{standby.port}", f"localhost:{leader.port}")
    async for env in frontend_env(auth_app, db_config, db, clock, certs, tmp_path, addresses):
        first = await env.submit(spec(), spec(), spec())
        assert [await env.world.state(first, j) for j in (1, 2, 3)] == ["Ready"] * 3
        await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=first), metadata=env.as_("alice"))
        await drained(env, first)
        assert env.frontend.notifier.sent >= 1

        cycles = ready_canceller(standby).cycles
        await leader.stop()
        await eventually(lambda: standby.election.is_leader and ready_canceller(standby).cycles > cycles)
        second = await env.submit(spec(), spec())
        await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=second), metadata=env.as_("alice"))
        await drained(env, second)


async def test_a_burst_is_one_notification(drivers: list[DriverApp], certs: DevCertificateAuthority) -> None:
    notifier = DriverNotifier(certs.issue("frontend"), [f"localhost:{drivers[1].port}"])
    try:
        for _ in range(100):
            await notifier("jobs_ready", 7, 0, "proj")
        await notifier("batch_cancelled", 7, 0, "proj")
        await notifier("no_such_change", 7)
        await eventually(lambda: notifier.sent == 2)
        assert notifier.dropped == 0
    finally:
        await notifier.close()


async def test_an_unreachable_driver_never_slows_or_fails_a_call(
        auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
        certs: DevCertificateAuthority, tmp_path: Path) -> None:
    # A listener that never answers: each notification waits out its deadline.
    with socket.socket() as black_hole:
        black_hole.bind(("127.0.0.1", 0))
        black_hole.listen(16)
        address = f"127.0.0.1:{black_hole.getsockname()[1]}"
        async for env in frontend_env(auth_app, db_config, db, clock, certs, tmp_path, (address,), deadline_s=30):
            batch_id = await asyncio.wait_for(env.submit(spec()), timeout=10)
            cancelled = await asyncio.wait_for(env.batches.CancelBatch(
                bpb.CancelBatchRequest(batch_id=batch_id), metadata=env.as_("alice")), timeout=10)
            assert cancelled.batch.cancellation.cancelled_by == "alice"
            assert env.frontend.notifier.sent == 0
