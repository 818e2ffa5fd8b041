"""Billing limits on a real MariaDB: the running batches of a project whose cost
reached its limit are cancelled, and nobody else's."""

from __future__ import annotations

import pytest

from services.db.database import StaleEpochError
from services.db.invariants import check_invariants
from services.driver.billing_limit_canceller import BillingLimitCanceller
from tests.world import World

CORE_HOUR_MS = 3_600_000
"""One core for an hour costs $0.04 at the local rate of migration 0002."""


async def batch_in(world: World, project: str, n_jobs: int = 1) -> tuple[int, int]:
    created = await world.store.create_batch("alice", project)
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, n_jobs)
    start = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": start + i, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0}
        for i in range(n_jobs)])
    await world.store.commit_update(batch_id, update["update_id"])
    return batch_id, start


async def run_for(world: World, batch_id: int, job_id: int, ms: int) -> str:
    """Run a job on one core and bill it for `ms` through a heartbeat."""
    attempt = await world.run(batch_id, job_id)
    ref = {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}
    await world.store.add_attempt_resources(world.epoch, [{**ref, "resource": "cpu/local/1", "quantity": 1000}])
    await world.store.heartbeat_rollup(world.epoch, "i1", [{**ref, "rollup_time_ms": world.clock() + ms}])
    return attempt


async def cancelled(world: World) -> dict[int, tuple[str, str]]:
    rows = await world.db.fetchall("SELECT batch_id, cancelled_by, reason FROM job_groups_cancelled "
                                   "WHERE job_group_id = 0")
    return {r["batch_id"]: (r["cancelled_by"], r["reason"]) for r in rows}


async def test_batches_of_a_project_over_its_limit_are_cancelled(world: World) -> None:
    await world.instance()
    # Work admitted under a limit of $1 (each attempt reserves its worst case, a core for an hour and
    # more); then an administrator lowers the limit below what was spent.
    await world.store.create_billing_project("capped", ["alice"], limit_usd=1.0)
    running, r0 = await batch_in(world, "capped")
    waiting, _ = await batch_in(world, "capped", 2)
    done, d0 = await batch_in(world, "capped")
    elsewhere, e0 = await batch_in(world, "proj")  # no limit
    attempt = await world.run(batch_id=done, job_id=d0)
    await world.finish(done, d0, attempt, "Success")
    other = await run_for(world, elsewhere, e0, CORE_HOUR_MS)  # $0.04, not capped
    first = await run_for(world, running, r0, CORE_HOUR_MS // 8)  # $0.005 of $0.01

    notified = []
    loop = BillingLimitCanceller(world.store, lambda: world.epoch, per_cycle=1, clock_ms=world.clock,
                         on_cancelled=lambda: notified.append(True))
    await loop.cycle()
    assert await cancelled(world) == {}

    await world.store.heartbeat_rollup(world.epoch, "i1", [  # now $0.02
        {"batch_id": running, "job_id": r0, "attempt_id": first, "rollup_time_ms": world.clock() + CORE_HOUR_MS // 2}])
    await loop.cycle()
    assert await cancelled(world) == {}
    await world.db.execute("UPDATE billing_projects SET limit_usd = 0.01 WHERE name = 'capped'")
    await loop.cycle()  # one per cycle, the oldest first
    assert await cancelled(world) == {running: ("corral", "billing limit reached")}
    await loop.cycle()
    assert await cancelled(world) == {running: ("corral", "billing limit reached"),
                                      waiting: ("corral", "billing limit reached")}
    await loop.cycle()  # nothing more: the complete batch and the other project's are not touched
    assert (loop.cancelled_total, len(notified)) == (2, 2)

    await world.finish(running, r0, first, "Cancelled")
    assert await world.drain(waiting) == 2
    await world.finish(elsewhere, e0, other, "Success")
    assert {(await world.batch_row(b))["state"] for b in (running, waiting, done, elsewhere)} == {"complete"}
    assert await check_invariants(world.db) == []


async def test_a_zero_limit_allows_no_spending_and_the_call_is_fenced(world: World) -> None:
    await world.store.create_billing_project("none", ["alice"])
    batch_id, _ = await batch_in(world, "none")
    # A project with a limit of 0 takes no batch at all (test_budgets.py); one set to 0 later loses its running ones.
    await world.db.execute("UPDATE billing_projects SET limit_usd = 0 WHERE name = 'none'")
    with pytest.raises(StaleEpochError):
        await world.store.cancel_batches_over_limit(world.epoch - 1, 10)
    assert await cancelled(world) == {}
    assert await BillingLimitCanceller(world.store, lambda: None).cycle() is None  # a standby does nothing
    assert await cancelled(world) == {}
    assert await world.store.cancel_batches_over_limit(world.epoch, 10) == 1
    assert await cancelled(world) == {batch_id: ("corral", "billing limit reached")}
    assert await world.drain(batch_id) == 1
    assert await check_invariants(world.db) == []
