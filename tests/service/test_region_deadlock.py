"""The design's known deadlock with regions (issue 41, item 7), shown not to happen.

The seed system's known issue: "If a large batch has multiple distinct regions specified that are not
interweaved, the autoscaler and scheduler can deadlock." Here one batch has N jobs that must run in one region,
then N that must run in the other (same priority), and the pool may have one machine at a time, so it can never
serve both regions at once: its machine must be made in the first region, drain that region's jobs, leave idle,
and be made again in the second. Both orders are run: before issue 41, region-b's jobs first (with N within the
autoscaler's 10,000-job sample) had region-a machines made, left idle and made again, and no job ran. A real
driver (its autoscaler, scheduler and local provider) and a real frontend run on
the test's MariaDB; the local provider's machines are the benchmark fleet's simulated workers
(bench/fleet_worker.py: the real worker whose attempts succeed at once), so thousands of jobs take seconds.

Every job must succeed exactly once, on a machine of its region; the first machine is made in the first
region, and none in the second while the pool is full; and progress is watched: if no job completes for
`STALL_S`, the test fails saying what is stuck (each region's jobs by state, the pool's machines, and
ExplainJob's reason for the first waiting job of each region) instead of waiting for its time-out.
docs/architecture.md says why it does not deadlock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import corral
from corral import aio
from corral.batch.v1 import job_service_pb2 as jpb
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.driver import app as driver_app
from services.driver.app import DriverApp, DriverConfig
from services.driver.servicer import SessionSettings
from services.frontend.app import FrontendApp
from tests.conftest import service_url
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import Env, make_env, start_frontend
from tests.world import FakeClock

REGIONS = ("region-a", "region-b")
POOL = "standard"
WORKER_CORES = 16
JOB_CORES = 0.25
MAX_INSTANCES = 1
GIB = 1024 ** 3
"""Machines the pool may have at once: one, so it serves one region at a time."""
IDLE_TIMEOUT_S = 2.0
"""How long a worker with nothing to run waits before it leaves (the default is a minute)."""
STALL_S = 60.0
"""No job completing for this long is a deadlock: an idle machine leaves after IDLE_TIMEOUT_S and the
autoscaler looks every half second, so a healthy switch of region takes a few seconds even on a loaded
machine."""


def fleet_worker_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's local provider starts bench/fleet_worker.py (the real worker, instant attempts) with the
    command line it gives `python -m services.worker`."""
    real = driver_app.local_worker_command

    def command(*args, **kwargs) -> Callable:
        argv_of = real(*args, **kwargs)

        def argv(request) -> list[str]:
            argv = list(argv_of(request))
            argv[argv.index("services.worker")] = "bench.fleet_worker"
            return argv

        return argv

    monkeypatch.setattr(driver_app, "local_worker_command", command)


async def two_regions_one_machine(db: Database) -> None:
    """region-a and region-b beside `local`; pool `standard` of 16-core machines, at most one at a time; no
    other pool makes machines."""
    await db.execute("INSERT INTO regions (region_id, name) VALUES (1, %s), (2, %s)", REGIONS)
    await db.execute("UPDATE instance_collections SET max_instances = 0, max_live_instances = 0 WHERE name <> %s",
                     (POOL,))
    # Memory and storage per core as the default pool has them (4 GiB, 8 GiB), so a job's default shares fit.
    await db.execute("UPDATE instance_collections SET worker_cores = %s, worker_memory_bytes = %s, "
                     "worker_storage_bytes = %s, max_instances = %s, max_live_instances = %s, "
                     "max_new_instances_per_loop = %s WHERE name = %s",
                     (WORKER_CORES, 4 * GIB * WORKER_CORES, 8 * GIB * WORKER_CORES, MAX_INSTANCES, MAX_INSTANCES,
                      MAX_INSTANCES, POOL))


@pytest.fixture
async def deployment(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
                     certs: DevCertificateAuthority, tmp_path: Path,
                     monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Env, DriverApp]]:
    """A driver whose machines are simulated workers, a frontend notifying it, and alice of project proj."""
    fleet_worker_command(monkeypatch)
    await two_regions_one_machine(db)
    blobs = tmp_path / "blobs"
    driver = await driver_app.start(DriverConfig(
        service_url(db_config, "driver"), certs.directory, f"file://{blobs}", tmp_path / "driver",
        autoscaler_period_s=0.5,
        session=SessionSettings(heartbeat_interval_s=1.0, heartbeat_timeout_s=30.0, idle_timeout_s=IDLE_TIMEOUT_S)))
    frontend: FrontendApp | None = None
    try:
        await eventually(lambda: driver.election.is_leader)
        frontend = await start_frontend(auth_app, db_config, certs, blobs,
                                        driver_addresses=(f"localhost:{driver.port}",))
        async for env in make_env(frontend, auth_app, db, clock, certs, blobs, elect=False):
            yield env, driver
    finally:
        if frontend is not None:
            await frontend.stop()
        await driver.stop()


async def submit(env: Env, certs: DevCertificateAuthority, n_per_region: int, order: tuple[str, ...]) -> int:
    """One batch: `n_per_region` jobs of the first region of `order`, then as many of the other, all of
    priority 0."""
    builder = corral.BatchBuilder("proj")
    for region in order:
        for i in range(n_per_region):
            builder.job("busybox", ["true"], cores=JOB_CORES, regions=[region], attributes={"name": f"{region}-{i}"})
    async with aio.Client(f"localhost:{env.frontend.public_port}", env.tokens["alice"], certs.ca_cert_path) as client:
        return (await client.submit(builder)).batch_id


async def states_by_region(db: Database, batch_id: int) -> dict[tuple[str, str], int]:
    rows = await db.fetchall("SELECT r.name AS region, j.state, COUNT(*) AS n FROM jobs j "
                             "JOIN regions r ON j.regions_bits = 1 << r.region_id WHERE j.batch_id = %s "
                             "GROUP BY r.name, j.state", (batch_id,))
    return {(r["region"], r["state"]): int(r["n"]) for r in rows}


async def machines(db: Database) -> list[dict]:
    return await db.fetchall("SELECT name, region, state, cores_mcpu, free_cores_mcpu, time_created_ms, "
                             "time_activated_ms, time_deactivated_ms, deactivation_reason FROM instances "
                             "WHERE inst_coll = %s ORDER BY time_created_ms, name", (POOL,))


async def why_stuck(env: Env, batch_id: int, stalled_s: float) -> str:
    """What a deadlock looks like: each region's jobs by state, the pool's machines, and why the first waiting
    job of each region waits (ExplainJob, the planner's own reason)."""
    db = env.world.db
    lines = [f"deadlock: no job of batch {batch_id} completed for {stalled_s:.0f} s",
             f"jobs by (region, state): {dict(sorted((await states_by_region(db, batch_id)).items()))}"]
    lines += [f"machine {m['name']}: {m['region']} {m['state']}, {m['free_cores_mcpu']} of {m['cores_mcpu']} mcpu "
              f"free{', ' + m['deactivation_reason'] if m['deactivation_reason'] else ''}" for m in await machines(db)]
    for bit, region in enumerate(REGIONS, start=1):
        row = await db.fetchone("SELECT MIN(job_id) AS job_id FROM jobs WHERE batch_id = %s AND state = 'Ready' "
                                "AND regions_bits = %s", (batch_id, 1 << bit))
        if row is None or row["job_id"] is None:
            continue
        explained = await env.jobs.ExplainJob(jpb.ExplainJobRequest(batch_id=batch_id, job_id=row["job_id"]),
                                              metadata=env.as_("alice"))
        reasons = "; ".join(r.detail for r in explained.explanation.reasons)
        lines.append(f"first Ready job of {region} (job {row['job_id']}) waits: {reasons or 'no reason given'}")
    return "\n".join(lines)


async def run_to_completion(env: Env, batch_id: int, n_jobs: int) -> float:
    """Wait until every job of the batch completed; fail at once, saying what is stuck, when none has for
    STALL_S. Returns the seconds it took."""
    db = env.world.db
    started = last_progress = time.monotonic()
    completed = -1
    while completed < n_jobs:
        row = await db.fetchone("SELECT COUNT(*) AS n FROM jobs WHERE batch_id = %s AND state IN "
                                "('Success', 'Failed', 'Error', 'Cancelled')", (batch_id,))
        assert row is not None
        if int(row["n"]) > completed:
            completed, last_progress = int(row["n"]), time.monotonic()
        elif time.monotonic() - last_progress > STALL_S:
            pytest.fail(await why_stuck(env, batch_id, time.monotonic() - last_progress), pytrace=False)
        await asyncio.sleep(0.5)
    return time.monotonic() - started


def live_at(created_ms: int, all_machines: list[dict]) -> list[dict]:
    """The machines live (created, not yet deactivated) when one was created at `created_ms`."""
    return [m for m in all_machines if m["time_created_ms"] <= created_ms
            and (m["time_deactivated_ms"] is None or m["time_deactivated_ms"] > created_ms)]


async def check_run(env: Env, batch_id: int, n_per_region: int, order: tuple[str, ...]) -> dict[str, int]:
    """Every job succeeded exactly once, on a machine of its region, and no machine was made beyond the pool's
    max_instances; the machines made per region."""
    db = env.world.db
    n_jobs = 2 * n_per_region
    assert await states_by_region(db, batch_id) == {(r, "Success"): n_per_region for r in REGIONS}
    attempts = await db.fetchall(
        "SELECT j.job_id, COUNT(a.attempt_id) AS n, MIN(i.region = r.name) AS in_region FROM jobs j "
        "JOIN regions r ON j.regions_bits = 1 << r.region_id "
        "LEFT JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id "
        "LEFT JOIN instances i ON i.name = a.instance_name WHERE j.batch_id = %s GROUP BY j.job_id", (batch_id,))
    assert len(attempts) == n_jobs
    assert [a["job_id"] for a in attempts if a["n"] != 1] == [], "jobs run other than exactly once"
    assert [a["job_id"] for a in attempts if not a["in_region"]] == [], "jobs run outside their region"
    made = await machines(db)
    for machine in made:
        live = live_at(machine["time_created_ms"], made)
        assert len(live) <= MAX_INSTANCES, f"{machine['name']} made while {len(live) - 1} machines lived: {made}"
    # The first machine is for the jobs at the head of the queue; the bound was real: the second region's first
    # machine was made only once the first region's had left.
    first, second = order
    assert made[0]["region"] == first, made
    first_second = min(m["time_created_ms"] for m in made if m["region"] == second)
    assert all(m["time_deactivated_ms"] is not None and m["time_deactivated_ms"] <= first_second
               for m in made if m["region"] == first and m["time_created_ms"] < first_second)
    return {region: sum(m["region"] == region for m in made) for region in (*REGIONS, "local")}


async def the_batch_runs(env: Env, certs: DevCertificateAuthority, n_per_region: int,
                         order: tuple[str, ...] = REGIONS) -> None:
    started = time.monotonic()
    batch_id = await submit(env, certs, n_per_region, order)
    submitted_s = time.monotonic() - started
    ran_s = await run_to_completion(env, batch_id, 2 * n_per_region)
    made = await check_run(env, batch_id, n_per_region, order)
    assert made["local"] == 0 and made["region-a"] >= 1 and made["region-b"] >= 1, made
    print(f"\nregion deadlock, {n_per_region:,} + {n_per_region:,} jobs: submitted in {submitted_s:.1f} s, "
          f"ran in {ran_s:.1f} s; machines made: region-a {made['region-a']}, region-b {made['region-b']}")


@pytest.mark.parametrize("order", [REGIONS, REGIONS[::-1]], ids=["a-then-b", "b-then-a"])
async def test_a_batch_of_one_region_then_another_completes_with_room_for_one_region(
        deployment: tuple[Env, DriverApp], certs: DevCertificateAuthority, order: tuple[str, ...]) -> None:
    env, _ = deployment
    await the_batch_runs(env, certs, 500, order)


@pytest.mark.slow
@pytest.mark.timeout(1800)
async def test_the_designs_ten_thousand_then_ten_thousand(
        deployment: tuple[Env, DriverApp], certs: DevCertificateAuthority) -> None:
    env, _ = deployment
    await the_batch_runs(env, certs, 10_000)
