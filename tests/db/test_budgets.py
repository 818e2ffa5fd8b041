"""Spending limits that are never overshot, on a real MariaDB (migration
0013): schedule_jobs reserves each attempt's worst case and refuses what
does not fit; the end of an attempt, however it ends, gives the reservation
back; billing never counts more of an attempt than it reserved; a project
that has spent its limit takes no new batch or update; the planner is handed
the worst case schedule_jobs reserves (read_ready_heads prices it)."""

from __future__ import annotations

import math

import pytest

from services.db.database import FailedPreconditionError
from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand, read_snapshot, read_workers
from services.policy import planner
from tests.world import World

HOUR_MS = 3_600_000
KILL_ALLOWANCE_MS = 15_000


async def reserved(world: World, project: str = "capped") -> int:
    row = await world.db.fetchone("SELECT COALESCE(SUM(reserved_micro_usd), 0) AS n FROM "
                                  "aggregated_billing_project_reservations WHERE billing_project = %s", (project,))
    return int(row["n"])


async def spend_usd(world: World, project: str = "capped") -> float:
    row = await world.db.fetchone(
        "SELECT COALESCE(SUM(a.`usage` * r.rate_usd), 0) AS usd FROM aggregated_billing_project_resources a "
        "JOIN resources r ON r.resource_id = a.resource_id WHERE a.billing_project = %s", (project,))
    return float(row["usd"])


async def capped_batch(world: World, jobs: list[dict], limit_usd: float = 0.1) -> tuple[int, int]:
    await world.store.create_billing_project("capped", ["alice"], limit_usd=limit_usd)
    created = await world.store.create_batch("alice", "capped")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, len(jobs))
    start = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": start + i, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0, **job}
        for i, job in enumerate(jobs)])
    await world.store.commit_update(batch_id, update["update_id"])
    return batch_id, start


def cost(cores_mcpu: int, memory_bytes: int, ms: int) -> int:
    """$0.04 per core-hour, $0.005 per GiB-hour (migration 0002) for `ms`, memory in whole MiB rounded up,
    rounded up to the micro-dollar: the test's own reckoning of job_worst_case_micro_usd, in the same
    operations in the same order, so with the same rounding."""
    mib = (memory_bytes + 1048575) // 1048576
    return math.ceil((cores_mcpu * (0.04 / (1000 * HOUR_MS)) + mib * (0.005 / (1024 * HOUR_MS))) * ms * 1000000)


async def test_schedule_jobs_reserves_the_worst_case_and_refuses_what_does_not_fit(world: World) -> None:
    await world.instance()
    # Each job: one core for 30 min (+ the kill allowance) = $0.02 + a little; a limit of $0.05 fits two.
    batch_id, start = await capped_batch(world, [{"timeout_ms": HOUR_MS // 2} for _ in range(3)], limit_usd=0.05)
    each = cost(1000, 0, HOUR_MS // 2 + KILL_ALLOWANCE_MS)
    outcomes = await world.store.schedule_jobs(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start + i, "attempt_id": f"a{i}"} for i in range(3)])
    assert [o["outcome"] for o in outcomes] == ["scheduled", "scheduled", "over_budget"]
    rows = await world.db.fetchall("SELECT reserved_micro_usd, reserved_ms FROM attempts WHERE batch_id = %s "
                                   "ORDER BY job_id", (batch_id,))
    assert [(r["reserved_micro_usd"], r["reserved_ms"]) for r in rows] == [(each, HOUR_MS // 2 + KILL_ALLOWANCE_MS)] * 2
    assert await reserved(world) == 2 * each
    assert (await world.job(batch_id, start + 2))["state"] == "Ready"
    assert await check_invariants(world.db) == []


async def test_the_planner_is_given_what_schedule_jobs_reserves(world: World) -> None:
    await world.instance(cores_mcpu=64_000)
    shapes = [{"cores_mcpu": c, "memory_bytes": m, "timeout_ms": t} for c, m, t in (
        (250, 0, 1), (1000, 1, 999), (1500, (1 << 30) + 1, HOUR_MS), (4000, 3 << 29, None), (16000, 0, 12345))]
    batch_id, start = await capped_batch(world, shapes, limit_usd=1000.0)
    workers = (await read_workers(world.db, "standard"))["standard"]
    snapshot = await read_snapshot(world.db, "standard", workers, (await read_demand(world.db))["standard"], 300, 0.0)
    priced = {c.key: c.reserve_micro_usd for c in snapshot.queues["alice"]}
    outcomes = await world.store.schedule_jobs(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start + i, "attempt_id": f"a{i}"} for i in range(len(shapes))])
    assert {o["outcome"] for o in outcomes} == {"scheduled"}
    rows = await world.db.fetchall("SELECT job_id, reserved_micro_usd FROM attempts WHERE batch_id = %s", (batch_id,))
    assert {(batch_id, r["job_id"]): r["reserved_micro_usd"] for r in rows} == priced
    assert all(v > 0 for v in priced.values())
    # A job without a timeout is priced for the project's longest job.
    assert priced[(batch_id, start + 3)] == cost(4000, 3 << 29, HOUR_MS + KILL_ALLOWANCE_MS)


async def test_the_end_gives_the_reservation_back_and_billing_stops_at_it(world: World) -> None:
    await world.instance()
    batch_id, start = await capped_batch(world, [{"timeout_ms": 60_000} for _ in range(3)], limit_usd=1.0)
    attempts = []
    for i in range(3):
        attempts.append(await world.run(batch_id, start + i))
    await world.store.add_attempt_resources(world.epoch, [
        {"batch_id": batch_id, "job_id": start + i, "attempt_id": a, "resource": "cpu/local/1", "quantity": 1000}
        for i, a in enumerate(attempts)])
    assert await reserved(world) == 3 * cost(1000, 0, 60_000 + KILL_ALLOWANCE_MS)
    # A worker reports far past the timeout: billing counts the reserved 75 s, no more.
    t0 = world.clock()
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start, "attempt_id": attempts[0], "rollup_time_ms": t0 + HOUR_MS}])
    row = await world.db.fetchone("SELECT rollup_time_ms - start_time_ms AS ms FROM attempts WHERE attempt_id = %s",
                                  (attempts[0],))
    assert row["ms"] == 60_000 + KILL_ALLOWANCE_MS
    # Completed (MJC) past its reservation too: still 75 s.
    await world.store.mark_jobs_complete(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start + 1, "attempt_id": attempts[1], "state": "Success", "exit_code": 0,
         "start_time_ms": t0, "end_time_ms": t0 + HOUR_MS}])
    row = await world.db.fetchone("SELECT rollup_time_ms - start_time_ms AS ms FROM attempts WHERE attempt_id = %s",
                                  (attempts[1],))
    assert row["ms"] == 60_000 + KILL_ALLOWANCE_MS
    assert await reserved(world) == 2 * cost(1000, 0, 60_000 + KILL_ALLOWANCE_MS)
    # The worker goes away: deactivation ends the others, and gives back what they reserved.
    await world.store.deactivate_instance(world.epoch, "i1", "missed heartbeats")
    assert await reserved(world) == 0
    assert await spend_usd(world) <= 1.0
    assert await check_invariants(world.db) == []


async def test_a_project_that_spent_its_limit_takes_no_new_work(world: World) -> None:
    await world.instance()
    batch_id, start = await capped_batch(world, [{"timeout_ms": HOUR_MS}], limit_usd=0.05)
    attempt = await world.run(batch_id, start)
    await world.store.add_attempt_resources(world.epoch, [
        {"batch_id": batch_id, "job_id": start, "attempt_id": attempt, "resource": "cpu/local/1", "quantity": 1000}])
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start, "attempt_id": attempt, "rollup_time_ms": world.clock() + HOUR_MS}])
    assert await spend_usd(world) == pytest.approx(0.04)  # within the limit: it reserved that much
    # An administrator lowers the limit below the spend (SetLimit allows it).
    await world.db.execute("UPDATE billing_projects SET limit_usd = 0.03 WHERE name = 'capped'")
    with pytest.raises(FailedPreconditionError, match=r"billing project capped has spent \$0\.040000 of its "
                                                      r"\$0\.030000 limit"):
        await world.store.create_batch("alice", "capped")
    with pytest.raises(FailedPreconditionError, match="limit"):
        await world.store.create_update(batch_id, 1)
    await world.store.create_billing_project("nothing", ["alice"], limit_usd=0.0)
    with pytest.raises(FailedPreconditionError, match=r"spent \$0\.000000 of its \$0\.000000 limit"):
        await world.store.create_batch("alice", "nothing")
    assert (await world.db.fetchone("SELECT COUNT(*) n FROM batches WHERE billing_project = 'nothing'"))["n"] == 0


async def test_a_job_that_can_never_fit_is_cancelled_saying_why(world: World) -> None:
    await world.instance()
    # A limit of $0.05: a 30-minute job fits ($0.02), a 2-hour one never can ($0.08), whatever runs first.
    batch_id, start = await capped_batch(world, [{"timeout_ms": HOUR_MS // 2}, {"timeout_ms": 2 * HOUR_MS}],
                                         limit_usd=0.05)
    workers = (await read_workers(world.db, "standard"))["standard"]
    demands = (await read_demand(world.db))["standard"]
    snapshot = await read_snapshot(world.db, "standard", workers, demands, 300, world.clock() / 1000)
    plan = planner.plan(snapshot)
    assert plan.never_fit == ((batch_id, start + 1),)
    # Asked about both, the procedure checks each again: only the one that can never fit is cancelled.
    assert await world.store.cancel_unaffordable_jobs(world.epoch, [{"batch_id": batch_id, "job_id": start},
                                                                     {"batch_id": batch_id, "job_id": start + 1}]) == 1
    job = await world.job(batch_id, start + 1)
    assert job["state"] == "Cancelled"
    assert job["end_reason"] == (
        "cancelled: it can never run under the limit of billing project capped: it may cost up to $0.080167 (its "
        "cores and memory for its timeout, or the project's longest job) and the $0.050000 limit leaves less after "
        "the project's spend")
    assert await world.state(batch_id, start) == "Ready"
    # Raised in time, the limit saves it: nothing is cancelled.
    await world.db.execute("UPDATE billing_projects SET limit_usd = 1 WHERE name = 'capped'")
    assert await world.store.cancel_unaffordable_jobs(world.epoch, [{"batch_id": batch_id, "job_id": start}]) == 0
    assert await check_invariants(world.db) == []


async def test_a_project_whose_spend_equals_its_limit_takes_no_new_work(world: World) -> None:
    """Issue 36: one core for 450 ms costs 5 micro-dollars at the local rate (migration 0002), though its DOUBLE
    product is a hair below 5e-6; with the limit set to the spend it reads (5 micro-dollars), the project is at
    its limit: no new batch, update or re-run (the same refusal as above it), and the billing loop cancels its
    running batch."""
    await world.instance()
    batch_id, start = await capped_batch(world, [{"timeout_ms": HOUR_MS}, {}], limit_usd=1.0)
    attempt = await world.run(batch_id, start)
    ref = {"batch_id": batch_id, "job_id": start, "attempt_id": attempt}
    await world.store.add_attempt_resources(world.epoch, [{**ref, "resource": "cpu/local/1", "quantity": 1000}])
    await world.store.heartbeat_rollup(world.epoch, "i1", [{**ref, "rollup_time_ms": world.clock() + 450}])
    spend = await spend_usd(world)
    assert round(spend * 1000000) == 5 and spend < 5e-6  # reads as 5 micro-dollars; a hair below as a DOUBLE
    await world.db.execute("UPDATE billing_projects SET limit_usd = %s WHERE name = 'capped'", (5 / 1e6,))
    at_limit = r"billing project capped has spent \$0\.000005 of its \$0\.000005 limit"
    with pytest.raises(FailedPreconditionError, match=at_limit):
        await world.store.create_batch("alice", "capped")
    with pytest.raises(FailedPreconditionError, match=at_limit):
        await world.store.create_update(batch_id, 1)
    await world.finish(batch_id, start, attempt, "Failed")
    with pytest.raises(FailedPreconditionError, match=at_limit):
        await world.store.rerun_failed_jobs(batch_id, "r", 2)
    assert (await world.db.fetchone("SELECT COUNT(*) n FROM batches"))["n"] == 1
    assert await world.store.cancel_batches_over_limit(world.epoch, 10) == 1
    # One micro-dollar more of limit and the project takes work again.
    await world.db.execute("UPDATE billing_projects SET limit_usd = %s WHERE name = 'capped'", (6 / 1e6,))
    assert (await world.store.create_batch("alice", "capped"))["created"] == 1
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize(("spend_usd", "limit_usd"), [
    (450000 * (0.04 / (1000 * HOUR_MS)), 5e-6), (4.9e-6, 5e-6), (4.4e-6, 5e-6), (5.1e-6, 5e-6), (0.0, 0.0),
    (0.0, 1e-6), (0.1 + 0.2, 0.3), (12.04, 500.0), (500.0, 500.0), (499.9999996, 500.0), (1.0, None)])
async def test_the_planner_and_the_procedures_agree_on_the_limit(world: World, spend_usd: float,
                                                                 limit_usd: float | None) -> None:
    row = await world.db.fetchone("SELECT billing_limit_reached(%s, %s) AS reached", (spend_usd, limit_usd))
    assert bool(row["reached"]) is planner.limit_reached(spend_usd, limit_usd)
