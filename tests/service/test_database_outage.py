"""A database outage longer than the heartbeat deadline, on a MariaDB of the
test's own that is killed and started again (as `corral up` restarts it),
with a real driver and a real worker in between: the worker is not
declared dead, and its running attempt goes on and completes, once.

Two outages: a short one, under the leader lease, which the leader rides
out (the same epoch; the deadline runs again from when the database
answers); and a longer one (slow), past the lease, after which the leader
has stepped down and is elected again (the deadline runs from the
election). Issue 10 measured a new leader declaring both live workers dead
7 s after a 45 s outage."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from services.common.tls import DevCertificateAuthority, WorkerIssuer
from services.db.database import Database, DatabaseConfig
from services.db.invariants import check_invariants
from services.db.migrations import migrate
from services.db.server import PrivateMariaDB
from services.db.store import JobStore
from services.driver.dead_workers import DeadWorkerDetector
from services.driver.leader import LeaseSettings
from services.driver.servicer import SessionSettings
from services.common.specs import SpecStore
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from services.worker.runtime import can_isolate
from tests.service.test_worker import WAIT_FOR_GO, eventually, leading_driver, script
from tests.world import FakeClock, World

pytestmark = pytest.mark.timeout(180)

HEARTBEAT_TIMEOUT_S = 4.0


@pytest.fixture
async def own_database(tmp_path: Path) -> AsyncIterator[tuple[PrivateMariaDB, DatabaseConfig]]:
    mariadb = PrivateMariaDB(tmp_path / "mariadb", fast_unsafe=True)
    admin = dataclasses.replace(mariadb.start(), database="corral_outage", pool_size=20)
    try:
        migrate(admin, create_database=True)
        yield mariadb, admin
    finally:
        mariadb.stop()


@pytest.mark.parametrize("outage_s, lease", [
    pytest.param(5.0, LeaseSettings(lease_s=15.0, renew_s=0.3), id="under-the-lease"),
    pytest.param(7.0, LeaseSettings(lease_s=3.0, renew_s=0.3), id="past-the-lease", marks=pytest.mark.slow),
])
async def test_no_worker_is_declared_dead_for_a_database_outage(
        own_database: tuple[PrivateMariaDB, DatabaseConfig], certs: DevCertificateAuthority, tmp_path: Path,
        outage_s: float, lease: LeaseSettings) -> None:
    mariadb, admin = own_database
    db = await Database.connect(admin)
    world = await World(db, JobStore(db), FakeClock()).setup()
    await db.execute("UPDATE instance_collections SET max_instances = 0")
    driver = await leading_driver(admin, certs, tmp_path, "driver-a", lease=lease, session=SessionSettings(
        heartbeat_interval_s=0.3, heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S, idle_timeout_s=120.0))
    dead = next(loop for loop in driver.loops if isinstance(loop, DeadWorkerDetector))
    worker = None
    try:
        await eventually(lambda: driver.election.is_leader, what="driver leading")
        epoch = driver.election.state.epoch
        await JobStore(db).create_instance(epoch, "w1", "standard", 2000, "activate-w1")  # type: ignore[arg-type]
        worker = await start_worker(WorkerConfig(
            instance_name="w1", activation_token="activate-w1", cores_mcpu=2000,
            driver_addresses=(f"localhost:{driver.port}",),
            certs_dir=WorkerIssuer(certs.directory).provision_worker("w1", tmp_path / "worker-certs" / "w1").key.parent,
            scratch_dir=tmp_path / "scratch" / "w1", log_root_url=f"file://{tmp_path / 'blobs'}",
            heartbeat_interval_s=0.3, driver_silence_s=1.5, reconnect_max_backoff_s=1.0,
            unisolated_dev=not can_isolate()))
        await eventually(lambda: worker.worker.connected, what="worker connected")
        refs = await SpecStore(f"file://{tmp_path / 'blobs'}").write_bunch(
            1, 1, 1, [script(f"{WAIT_FOR_GO}; echo outlived the outage")])
        batch_id, _, job_id = await world.batch([{"spec_ref": refs[0]}])

        async def started() -> dict[str, Any] | None:
            return await db.fetchone("SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s "
                                     "AND start_time_ms IS NOT NULL", (batch_id, job_id))

        attempt = await eventually(started, what="the job started")
        sessions = worker.worker.sessions_opened

        # The database dies (as to the OOM killer) and stays down longer than the heartbeat deadline.
        down_at_ms = int(time.time() * 1000)
        assert mariadb.process is not None
        mariadb.process.kill()
        mariadb.process.wait()
        await asyncio.sleep(outage_s)
        mariadb.start()

        # The leader sees its database again: by renewing its lease, or by winning a new one.
        await eventually(lambda: driver.election.is_leader and driver.election.state.watching_since_ms > down_at_ms,
                         60, "the leader watching its workers again")
        since_ms = driver.election.state.watching_since_ms
        if lease.lease_s > outage_s + 5:
            assert driver.election.state.epoch == epoch and not driver.election.step_downs
        else:
            assert driver.election.state.epoch > epoch and driver.election.step_downs  # type: ignore[operator]
        await eventually(lambda: worker.worker.connected and worker.worker.sessions_opened > sessions, 60,
                         "the worker back in session")
        # Let a full deadline from then pass, with the detector looking after it.
        await eventually(lambda: time.time() * 1000 > since_ms + HEARTBEAT_TIMEOUT_S * 1000 + 500, 60,
                         "a full deadline after the outage")
        for _ in range(2):
            dead.notify()
            await dead.wait_cycles(1, timeout_s=60)
        assert dead.deactivated == []

        work_dir = tmp_path / "scratch" / "w1" / f"{batch_id}-{job_id}-{attempt['attempt_id']}" / "work"
        (work_dir / "go").touch()

        async def final() -> dict[str, Any] | None:
            row = await db.fetchone("SELECT state FROM jobs WHERE batch_id = %s AND job_id = %s", (batch_id, job_id))
            return row if row is not None and row["state"] in ("Success", "Failed", "Error", "Cancelled") else None

        assert (await eventually(final, 60, "the job final"))["state"] == "Success"

        async def batch_complete() -> bool:  # the batch completes after the job, in its own transaction
            row = await db.fetchone("SELECT state FROM batches WHERE batch_id = %s", (batch_id,))
            return row is not None and row["state"] == "complete"

        await eventually(batch_complete, 60, "the batch complete")
        attempts = await db.fetchall("SELECT attempt_id FROM attempts WHERE batch_id = %s", (batch_id,))
        assert [a["attempt_id"] for a in attempts] == [attempt["attempt_id"]]
        assert (await db.fetchone("SELECT state FROM instances WHERE name = 'w1'"))["state"] == "active"
        assert await check_invariants(db) == []
    finally:
        if worker is not None:
            await worker.stop()
        await driver.stop()
        await db.close()
