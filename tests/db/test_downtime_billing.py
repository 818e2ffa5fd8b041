"""What the control plane's downtime may cost users (issue 10): no attempt is
billed for time no worker reported; what a live worker reports across an
outage is billed. With the dead-worker detector of test_downtime.py and the
test's clock."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.db.invariants import check_invariants
from tests.db.test_downtime import MIN_MS, TIMEOUT_S, detector, heartbeat
from tests.world import World


async def usage_ms(world: World, batch_id: int, job_id: int) -> int:
    """Milliseconds of cpu billed to the job (its attempts ask for 1000 mcpu)."""
    row = await world.db.fetchone(
        "SELECT COALESCE(SUM(a.`usage`), 0) AS u FROM aggregated_job_resources a JOIN resources r USING (resource_id) "
        "WHERE a.batch_id = %s AND a.job_id = %s AND r.name = 'cpu/local/1'", (batch_id, job_id))
    assert row is not None
    return int(row["u"]) // 1000


async def running_job(world: World, instance: str) -> dict[str, Any]:
    """A job of 1 core running on `instance` since now; its attempt key."""
    batch_id, _, job_id = await world.batch([{}])
    attempt = await world.run(batch_id, job_id, instance)
    key = {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}
    await world.store.add_attempt_resources(world.epoch, [{**key, "resource": "cpu/local/1", "quantity": 1000}])
    return key


async def test_the_time_no_worker_reported_is_not_billed(world: World, tmp_path: Path) -> None:
    """The whole system stops 5 minutes after the attempts' last heartbeat and starts again 45
    minutes later: their workers are gone. The new leader declares them dead a full deadline after
    its election; what they are billed ends at their last report, not at the deactivation."""
    await world.instance("i1")
    start = world.clock()
    key = await running_job(world, "i1")
    world.clock.advance(10 * MIN_MS)
    await heartbeat(world, "i1", [key])  # reported: 10 minutes ran
    world.clock.advance(5 * MIN_MS)  # ran on, unreported, until everything stopped
    world.clock.advance(45 * MIN_MS)  # down
    world.epoch = int((await world.store.acquire_leader_lease("driver-b", 10_000))["epoch"])
    dead = detector(world, tmp_path, {"ms": world.clock()})
    world.clock.advance(TIMEOUT_S * 1000)
    await dead.cycle()
    assert dead.deactivated == ["i1"]
    attempt = await world.db.fetchone("SELECT * FROM attempts WHERE attempt_id = %s", (key["attempt_id"],))
    assert attempt["reason"] == "worker_lost" and attempt["end_time_ms"] == world.clock()
    assert attempt["rollup_time_ms"] == start + 10 * MIN_MS
    assert await usage_ms(world, key["batch_id"], key["job_id"]) == 10 * MIN_MS
    assert await world.state(key["batch_id"], key["job_id"]) == "Ready"  # it runs again, from scratch
    assert await check_invariants(world.db) == []


async def test_what_a_live_worker_reports_across_an_outage_is_billed(world: World) -> None:
    """A worker that kept its job running while there was no leader reports it when it is back: that
    time was used (the job's machine ran it, and its work is kept), and is billed up to the end the
    worker reports."""
    await world.instance("i1")
    start = world.clock()
    key = await running_job(world, "i1")
    world.clock.advance(5 * MIN_MS)
    await heartbeat(world, "i1", [key])
    world.clock.advance(30 * MIN_MS)  # no leader; the worker runs on
    world.epoch = int((await world.store.acquire_leader_lease("driver-b", 10_000))["epoch"])
    await heartbeat(world, "i1", [key])  # the worker is back: its rollup covers the gap
    world.clock.advance(MIN_MS)
    outcome = await world.store.mark_jobs_complete(world.epoch, "i1", [
        {**key, "state": "Success", "exit_code": 0, "start_time_ms": start, "end_time_ms": world.clock()}])
    assert outcome[0]["outcome"] == "completed"
    assert await usage_ms(world, key["batch_id"], key["job_id"]) == 36 * MIN_MS
    assert await check_invariants(world.db) == []
