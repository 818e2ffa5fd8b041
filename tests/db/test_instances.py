"""The autoscaler, the local provider and the dead-worker detector."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time
from pathlib import Path

import aiomysql
from hypothesis import given
from hypothesis import strategies as st

from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.db.invariants import check_invariants
from services.driver.app import DriverConfig, local_worker_command
from services.driver.autoscaler import Autoscaler, instances_to_create
from services.driver.dead_workers import DeadWorkerDetector
from services.driver.providers.interface import InstanceRequest
from services.driver.providers.local import LocalProvider
from tests.world import World


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(1, 64_000), st.integers(0, 50), st.integers(0, 50),
       st.integers(0, 10))
def test_instances_to_create_is_bounded_and_enough(ready: int, free: int, cores: int, live: int, maximum: int,
                                                   per_loop: int) -> None:
    n = instances_to_create(ready, free, cores, live, maximum, per_loop)
    assert 0 <= n <= per_loop and live + n <= max(live, maximum)
    if n < per_loop and live + n < maximum:  # not capped: the new cores cover the missing demand
        assert free + n * cores >= ready


def sleeper(request: InstanceRequest) -> list[str]:
    """Stands in for a worker process (the provider only manages processes)."""
    return [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_local_provider_starts_and_stops_processes(tmp_path: Path) -> None:
    provider = LocalProvider(sleeper, tmp_path / "logs")
    request = InstanceRequest("w1", "standard", 2000, 0, "local", "t")
    await provider.create(request)
    pid = provider.pid("w1")
    assert pid is not None and await provider.alive() == {"w1"}
    await provider.delete("w1")
    assert await provider.alive() == set()
    try:
        os.kill(pid, 0)
        raise AssertionError("the worker process is still running")
    except ProcessLookupError:
        pass


async def test_the_activation_token_goes_in_the_environment_not_on_the_command_line(tmp_path: Path) -> None:
    config = DriverConfig("mysql://unused", DevCertificateAuthority(tmp_path / "certs").issue_services().directory,
                          "file:///unused", tmp_path / "data")
    argv = local_worker_command(config, lambda: "localhost:1")(
        InstanceRequest("w1", "standard", 2000, 0, "local", "the-secret-token"))
    assert not any("the-secret-token" in arg for arg in argv) and "--activation-token" not in argv
    assert "--unisolated-dev" not in argv
    dev = dataclasses.replace(config, unisolated_dev_workers=True)
    assert "--unisolated-dev" in local_worker_command(dev, lambda: "localhost:1")(
        InstanceRequest("w1", "standard", 2000, 0, "local", "t"))
    assert "--prepull" not in argv
    # --prepull: every pool's images, then the pool's own.
    warm = dataclasses.replace(config, prepull={None: ("a.example/x:1",), "highmem": ("a.example/y:2",)})
    for pool, images in (("standard", "a.example/x:1"), ("highmem", "a.example/x:1,a.example/y:2")):
        argv = local_worker_command(warm, lambda: "localhost:1")(InstanceRequest("w1", pool, 2000, 0, "local", "t"))
        assert argv[argv.index("--prepull") + 1] == images

    def printer(request: InstanceRequest) -> list[str]:
        return [sys.executable, "-c", "import os; print(os.environ['CORRAL_ACTIVATION_TOKEN'])"]

    provider = LocalProvider(printer, tmp_path / "logs")
    await provider.create(InstanceRequest("w1", "standard", 2000, 0, "local", "the-secret-token"))
    deadline = time.monotonic() + 10
    while await provider.alive():  # until it printed and exited
        assert time.monotonic() < deadline, "the stand-in worker did not exit"
        await asyncio.sleep(0.02)
    assert (tmp_path / "logs" / "w1.log").read_text() == "the-secret-token\n"
    # The worker gets a key of its own, and nothing of the driver's.
    worker_certs = sorted(p.name for p in (tmp_path / "data" / "worker-certs" / "w1").iterdir())
    assert worker_certs == ["ca.pem", "worker-w1.key", "worker-w1.pem"]


async def test_autoscaler_starts_what_the_demand_needs(world: World, tmp_path: Path) -> None:
    await world.batch([{"cores_mcpu": 1000} for _ in range(5)])  # 5 cores in 'standard' (2-core workers)
    provider = LocalProvider(sleeper, tmp_path / "logs")
    autoscaler = Autoscaler(world.store, provider, lambda: world.epoch)
    try:
        await autoscaler.cycle()
        assert len(autoscaler.created) == 2  # max_new_instances_per_loop of 'standard'
        await autoscaler.cycle()
        assert len(autoscaler.created) == 3  # 6 cores pending cover the 5 ready
        await autoscaler.cycle()
        assert len(autoscaler.created) == 3
        assert await provider.alive() == set(autoscaler.created)
        rows = await world.db.fetchall("SELECT state, cores_mcpu FROM instances")
        assert {(r["state"], r["cores_mcpu"]) for r in rows} == {("pending", 2000)}
    finally:
        await provider.close()


async def test_dead_worker_jobs_run_again_as_a_new_attempt(world: World, tmp_path: Path) -> None:
    await world.instance("i1", cores_mcpu=4000)
    batch_id, _, job_id = await world.batch([{}])
    first = await world.run(batch_id, job_id)
    provider = LocalProvider(sleeper, tmp_path / "logs")
    live = {"i1"}
    detector = DeadWorkerDetector(world.store, provider, lambda: live, lambda: world.epoch,
                                  heartbeat_timeout_s=30, clock_ms=world.clock)
    await detector.cycle()
    assert detector.deactivated == []  # connected
    live.clear()
    world.clock.advance(10_000)
    await detector.cycle()
    assert detector.deactivated == []  # session gone, but heartbeats are recent
    world.clock.advance(30_000)
    await detector.cycle()
    assert detector.deactivated == ["i1"]
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["attempt_id"]) == ("Ready", first)
    await world.instance("i2")
    second = await world.run(batch_id, job_id, instance="i2")
    assert second != first and (await world.job(batch_id, job_id))["n_attempts"] == 2
    assert await check_invariants(world.db) == []


async def test_an_instance_keeps_what_its_running_jobs_reserve_of_memory_and_storage(world: World) -> None:
    """instances.used_memory_bytes and used_storage_bytes (migration 0018) follow every start and end, and
    a deactivated instance holds nothing; the scheduler's workers read says what is left."""
    from services.db.plan_snapshot import read_workers
    gib = 2**30
    await world.instance("i1")
    await world.db.execute("UPDATE instances SET memory_bytes = %s, storage_bytes = %s WHERE name = 'i1'",
                           (16 * gib, 32 * gib))
    batch_id, _, first = await world.batch([{"memory_bytes": 2 * gib, "storage_bytes": 5 * gib},
                                            {"memory_bytes": 3 * gib, "storage_bytes": 1 * gib}])

    async def used() -> tuple[int, int]:
        row = await world.db.fetchone("SELECT used_memory_bytes, used_storage_bytes FROM instances WHERE name = 'i1'")
        assert row is not None
        return int(row["used_memory_bytes"]), int(row["used_storage_bytes"])

    a = await world.run(batch_id, first)
    await world.run(batch_id, first + 1)
    assert await used() == (5 * gib, 6 * gib)
    worker = (await read_workers(world.db))["standard"][0]
    assert (worker.free_memory_bytes, worker.free_storage_bytes) == (11 * gib, 26 * gib)
    await world.finish(batch_id, first, a, "Success")
    assert await used() == (3 * gib, 1 * gib)
    assert await check_invariants(world.db) == []
    await world.store.deactivate_instance(world.epoch, "i1", "missed heartbeats")
    assert await used() == (0, 0)
    assert await check_invariants(world.db) == []


async def test_a_job_placed_on_an_instance_while_it_is_deactivated_runs_again(world: World,
                                                                              db_config: DatabaseConfig) -> None:
    """A scheduler that holds the instance's row (schedule_jobs locks it to place attempts) and commits a new
    attempt on it while deactivate_instance waits: that job is completed as preempted and is Ready again, not
    left Running under an ended attempt (seen end to end: a machine reclaimed while a job was placed on it)."""
    await world.instance("i1", cores_mcpu=4000)
    batch_id, _, job_id = await world.batch([{}])
    attempt = world.attempt_id()
    scheduler = await aiomysql.connect(**db_config.connect_kwargs())
    try:
        async with scheduler.cursor() as cursor:
            await cursor.execute("START TRANSACTION")
            await cursor.execute("SELECT state FROM instances WHERE name = 'i1' FOR UPDATE")
            deactivation = asyncio.create_task(
                world.store.deactivate_instance(world.epoch, "i1", "the cloud reclaimed the machine", "preempted"))
            deadline = time.monotonic() + 20
            # Until it waits for the instance's row (the same statement, locked, starts and ends the procedure).
            while not await world.db.fetchall("SELECT id FROM information_schema.PROCESSLIST WHERE info LIKE %s",
                                              ("SELECT state INTO v_state FROM instances%",)):
                if deactivation.done():
                    raise AssertionError(f"deactivate_instance did not wait: {deactivation.result()}")
                assert time.monotonic() < deadline, "deactivate_instance never waited for the instance's row"
                await asyncio.sleep(0.05)
            # What schedule_jobs does under that lock: the attempt, the job Running under it, its cores taken.
            await cursor.execute("INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name) "
                                 "VALUES (%s, %s, %s, 'i1')", (batch_id, job_id, attempt))
            await cursor.execute("UPDATE jobs SET state = 'Running', attempt_id = %s, n_attempts = n_attempts + 1 "
                                 "WHERE batch_id = %s AND job_id = %s", (attempt, batch_id, job_id))
            await cursor.execute("UPDATE instances i JOIN jobs j ON j.batch_id = %s AND j.job_id = %s "
                                 "SET i.free_cores_mcpu = i.free_cores_mcpu - j.cores_mcpu, "
                                 "i.used_memory_bytes = i.used_memory_bytes + COALESCE(j.memory_bytes, 0), "
                                 "i.used_storage_bytes = i.used_storage_bytes + j.storage_bytes WHERE i.name = 'i1'",
                                 (batch_id, job_id))
            await cursor.execute("COMMIT")
        await asyncio.wait_for(deactivation, 30)
    finally:
        scheduler.close()
    job = await world.job(batch_id, job_id)
    assert job["state"] == "Ready", job
    ended = await world.db.fetchone("SELECT reason, end_time_ms FROM attempts WHERE attempt_id = %s", (attempt,))
    assert ended is not None and ended["reason"] == "preempted"
    assert await check_invariants(world.db) == []
