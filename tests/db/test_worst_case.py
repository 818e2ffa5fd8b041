"""A job's worst-case cost has one source, the stored functions job_worst_case_micro_usd and
job_reserve_ms: what schedule_jobs reserves, what cancel_unaffordable_jobs weighs against a limit, and
what read_ready_heads hands the planner are each that value, for jobs of every shape (cores, memory on
and off a MiB boundary, scratch storage, a timeout, none, one past the project's longest job) and at
several prices (the local defaults, a catalogue's, two machine types of which the dearer prices it)."""

from __future__ import annotations

import math
from decimal import Decimal
from typing import Any

import pytest

from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand, read_snapshot, read_workers
from services.policy import planner
from tests.world import World

HOUR_MS = 3_600_000
KILL_ALLOWANCE_MS = 15_000
MAX_JOB_DURATION_MS = 5_400_000
"""The project's longest job (not the default hour, so that the test sees it is read)."""
CORE_HOUR = 1000 * HOUR_MS  # mcpu-ms per core-hour
GIB_HOUR = 1024 * HOUR_MS  # MiB-ms per GiB-hour
MIB = 1 << 20
GIB = 1 << 30

SHAPES: list[dict[str, Any]] = [
    {"cores_mcpu": 250, "timeout_ms": 1},
    {"cores_mcpu": 1000, "memory_bytes": 1, "timeout_ms": 999},
    {"cores_mcpu": 1000, "memory_bytes": MIB, "timeout_ms": 60_000},  # exactly one MiB
    {"cores_mcpu": 1500, "memory_bytes": MIB + 1, "timeout_ms": HOUR_MS},  # a byte more: two
    {"cores_mcpu": 4000, "memory_bytes": 3 << 29},  # no timeout: the project's longest job
    {"cores_mcpu": 4000, "memory_bytes": 3 << 29, "storage_bytes": 10 * GIB},  # storage is not priced
    {"cores_mcpu": 16000, "timeout_ms": 12_345},
    {"cores_mcpu": 0, "memory_bytes": 7 * GIB},  # memory alone
    {"cores_mcpu": 2000, "memory_bytes": 5 * GIB, "storage_bytes": 100 * GIB, "timeout_ms": 10 * HOUR_MS},
]
"""Job shapes (keys of insert_jobs); the last runs past the project's longest job: its own timeout counts."""

PRICES = {
    "local": None,  # migration 0002's: $0.04 per core-hour, $0.005 per GiB-hour
    "catalogue": [("cpu/gcp/n2-spot/us-central1", "mcpu_ms", 0.0337 / CORE_HOUR),
                  ("memory/gcp/n2-spot/us-central1", "mib_ms", 0.00421 / GIB_HOUR)],
    "two machine types": [("cpu/gcp/n2-spot/us-central1", "mcpu_ms", 0.0291 / CORE_HOUR),
                          ("memory/gcp/n2-spot/us-central1", "mib_ms", 0.0039 / GIB_HOUR),
                          ("cpu/gcp/c3/us-central1", "mcpu_ms", 0.0613 / CORE_HOUR),
                          ("memory/gcp/c3/us-central1", "mib_ms", 0.0071 / GIB_HOUR)],
}
"""The deployment's active products and their rates: a reservation is priced at the dearest of each kind."""


def expected_reserve_ms(timeout_ms: int | None) -> int:
    return (timeout_ms if timeout_ms is not None else MAX_JOB_DURATION_MS) + KILL_ALLOWANCE_MS


def expected_micro_usd(shape: dict[str, Any], cpu_rate_usd: float, memory_rate_usd: float) -> int:
    """The test's own reckoning: cores and whole MiB (rounded up) at the rates, for the reserved time,
    rounded up to the micro-dollar; in the same operations in the same order as the database, so with
    the same rounding."""
    mib = (shape.get("memory_bytes", 0) + MIB - 1) // MIB
    return math.ceil((shape["cores_mcpu"] * cpu_rate_usd + mib * memory_rate_usd)
                     * expected_reserve_ms(shape.get("timeout_ms")) * 1000000)


async def set_prices(world: World, prices: str) -> tuple[float, float]:
    """Make `prices` the deployment's; returns the rates a reservation is priced at."""
    products = PRICES[prices]
    if products is not None:
        await world.store.set_product_rates([{"product": p, "unit": u, "rate_usd": r} for p, u, r in products],
                                            "gcp-catalog", active_products=[p for p, _, _ in products])
        cpu = max(r for p, _, r in products if p.startswith("cpu/"))
        memory = max(r for p, _, r in products if p.startswith("memory/"))
    else:
        cpu, memory = 0.04 / CORE_HOUR, 0.005 / GIB_HOUR
    row = await world.db.fetchone("SELECT cpu_rate_usd, memory_rate_usd FROM reservation_rates")
    assert row is not None and (row["cpu_rate_usd"], row["memory_rate_usd"]) == (cpu, memory)
    return cpu, memory


async def capped_batch(world: World, project: str, shapes: list[dict[str, Any]]) -> tuple[int, list[int]]:
    """A committed batch of `shapes` in `project` (made with a generous limit if new); its job ids."""
    if await world.db.fetchone("SELECT name FROM billing_projects WHERE name = %s", (project,)) is None:
        await world.store.create_billing_project(project, ["alice"], limit_usd=1000.0)
        await world.db.execute("UPDATE billing_projects SET max_job_duration_ms = %s WHERE name = %s",
                               (MAX_JOB_DURATION_MS, project))
    batch_id = int((await world.store.create_batch("alice", project))["batch_id"])
    update = await world.store.create_update(batch_id, len(shapes))
    start = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": start + i, "inst_coll": "standard", "job_group_id": 0, **shape} for i, shape in enumerate(shapes)])
    await world.store.commit_update(batch_id, update["update_id"])
    return batch_id, list(range(start, start + len(shapes)))


async def function_values(world: World, shapes: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(job_reserve_ms, job_worst_case_micro_usd) of each shape, at the rates in force."""
    values = []
    for shape in shapes:
        row = await world.db.fetchone(
            "SELECT job_reserve_ms(%s, %s) AS ms, "
            "job_worst_case_micro_usd(%s, %s, job_reserve_ms(%s, %s), r.cpu_rate_usd, r.memory_rate_usd) AS usd "
            "FROM reservation_rates r",
            (shape.get("timeout_ms"), MAX_JOB_DURATION_MS, shape["cores_mcpu"], shape.get("memory_bytes", 0),
             shape.get("timeout_ms"), MAX_JOB_DURATION_MS))
        assert row is not None
        values.append((int(row["ms"]), int(row["usd"])))
    return values


async def heads(world: World) -> dict[tuple[int, int], int]:
    """What read_ready_heads says each of alice's Ready standard jobs may cost."""
    _, (rows,) = await world.db.call("read_ready_heads", [["standard", "alice", 1000]])
    return {(r["batch_id"], r["job_id"]): int(r["reserve_micro_usd"]) for r in rows}


async def reservations(world: World, batch_id: int) -> dict[int, tuple[int, int]]:
    """What schedule_jobs reserved for each attempt of the batch: (ms, micro-USD)."""
    rows = await world.db.fetchall("SELECT job_id, reserved_ms, reserved_micro_usd FROM attempts WHERE batch_id = %s",
                                   (batch_id,))
    return {r["job_id"]: (int(r["reserved_ms"]), int(r["reserved_micro_usd"])) for r in rows}


async def cancelled_costs(world: World, batch_id: int) -> dict[int, int]:
    """What cancel_unaffordable_jobs weighed, read back from the reason it gave each job it cancelled
    ('it may cost up to $X', X to the micro-dollar)."""
    rows = await world.db.fetchall("SELECT job_id, end_reason FROM jobs WHERE batch_id = %s AND state = 'Cancelled'",
                                   (batch_id,))
    costs = {}
    for r in rows:
        text = r["end_reason"].split("it may cost up to $", 1)[1].split(" ", 1)[0].replace(",", "")
        costs[r["job_id"]] = int(Decimal(text) * 1000000)
    return costs


@pytest.mark.parametrize("prices", sorted(PRICES))
async def test_the_function_is_what_schedule_jobs_reserves(world: World, prices: str) -> None:
    await world.instance(cores_mcpu=1_000_000)
    cpu_rate, memory_rate = await set_prices(world, prices)
    values = await function_values(world, SHAPES)
    assert values == [(expected_reserve_ms(s.get("timeout_ms")), expected_micro_usd(s, cpu_rate, memory_rate))
                      for s in SHAPES]
    assert values[4] == values[5]  # scratch storage costs nothing here
    batch_id, job_ids = await capped_batch(world, "capped", SHAPES)
    outcomes = await world.store.schedule_jobs(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": j, "attempt_id": f"a{j}"} for j in job_ids])
    assert {o["outcome"] for o in outcomes} == {"scheduled"}
    assert await reservations(world, batch_id) == dict(zip(job_ids, values))
    assert await check_invariants(world.db) == []


async def test_the_function_is_null_without_a_reserved_time(world: World) -> None:
    row = await world.db.fetchone("SELECT job_worst_case_micro_usd(1000, 0, NULL, 1, 1) AS usd, "
                                  "job_reserve_ms(NULL, NULL) AS ms, job_reserve_ms(NULL, 60000) AS by_project, "
                                  "job_reserve_ms(5, 60000) AS own")
    assert row == {"usd": None, "ms": None, "by_project": 60_000 + KILL_ALLOWANCE_MS, "own": 5 + KILL_ALLOWANCE_MS}


@pytest.mark.parametrize("prices", sorted(PRICES))
async def test_the_procedures_and_the_planner_agree_on_each_job(world: World, prices: str) -> None:
    """read_ready_heads (and so the planner's candidates), schedule_jobs and cancel_unaffordable_jobs give
    every job the same worst case; and at a limit some jobs fit under and others do not, the planner's
    never_fit is exactly what cancel_unaffordable_jobs cancels."""
    await world.instance(cores_mcpu=1_000_000)
    await set_prices(world, prices)
    values = [usd for _, usd in await function_values(world, SHAPES)]
    scheduled, scheduled_ids = await capped_batch(world, "capped", SHAPES)
    weighed, weighed_ids = await capped_batch(world, "tight", SHAPES)

    # read_ready_heads, and the planner's candidates built from it.
    read = await heads(world)
    assert [read[(scheduled, j)] for j in scheduled_ids] == values
    assert [read[(weighed, j)] for j in weighed_ids] == values
    workers = (await read_workers(world.db, "standard"))["standard"]
    snapshot = await read_snapshot(world.db, "standard", workers, (await read_demand(world.db))["standard"], 300, 0.0)
    assert {c.key: c.reserve_micro_usd for c in snapshot.queues["alice"]} == read

    # A limit between the cheapest and the dearest job of "tight": the planner's never_fit and the jobs
    # cancel_unaffordable_jobs cancels are both exactly those the function prices above it.
    below, above = sorted(set(values))[len(set(values)) // 2 - 1:len(set(values)) // 2 + 1]
    limit_micro_usd = (below + above) // 2  # well away from any job's cost, so no rounding decides
    assert below < limit_micro_usd < above
    await world.db.execute("UPDATE billing_projects SET limit_usd = %s WHERE name = 'tight'",
                           (limit_micro_usd / 1000000,))
    snapshot = await read_snapshot(world.db, "standard", workers, (await read_demand(world.db))["standard"], 300, 0.0)
    never_fit = {key for key in planner.plan(snapshot).never_fit if key[0] == weighed}
    over = {(weighed, j) for j, usd in zip(weighed_ids, values) if usd > limit_micro_usd}
    assert over and len(over) < len(values)
    assert never_fit == over
    n = await world.store.cancel_unaffordable_jobs(world.epoch, [{"batch_id": weighed, "job_id": j}
                                                                 for j in weighed_ids])
    assert n == len(over)
    costs = await cancelled_costs(world, weighed)
    assert {(weighed, j) for j in costs} == over
    assert costs == {j: usd for j, usd in zip(weighed_ids, values) if usd > limit_micro_usd}

    # schedule_jobs reserves the same.
    await world.store.schedule_jobs(world.epoch, "i1", [
        {"batch_id": scheduled, "job_id": j, "attempt_id": f"a{j}"} for j in scheduled_ids])
    assert [usd for _, usd in (await reservations(world, scheduled)).values()] == values
    assert await check_invariants(world.db) == []
