"""Cancel after N failures: the driver's re-check on a real MariaDB."""

from __future__ import annotations

import pytest

from services.db.database import InvalidArgumentError, StaleEpochError
from services.db.invariants import check_invariants
from services.driver.failure_canceller import FailureCanceller
from tests.world import World


async def cancellations(world: World, batch_id: int) -> dict[int, tuple[str, str]]:
    rows = await world.db.fetchall(
        "SELECT job_group_id, cancelled_by, reason FROM job_groups_cancelled WHERE batch_id = %s", (batch_id,))
    return {r["job_group_id"]: (r["cancelled_by"], r["reason"]) for r in rows}


async def fail(world: World, batch_id: int, job_id: int, state: str = "Failed") -> None:
    attempt = await world.run(batch_id, job_id)
    assert await world.finish(batch_id, job_id, attempt, state) == "completed"


async def test_a_batch_whose_failures_reached_the_threshold_is_cancelled_once(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}] * 5, cancel_after_n_failures=2)
    await fail(world, batch_id, s)
    await fail(world, batch_id, s + 1, "Error")  # errors count as failures, as in MJC
    assert await cancellations(world, batch_id) == {0: ("corral", "cancel_after_n_failures: 2 jobs failed")}
    # Two failures committed concurrently can each read one failure and
    # leave no row; this is the state they leave.
    await world.db.execute("DELETE FROM job_groups_cancelled WHERE batch_id = %s", (batch_id,))

    notified = []
    loop = FailureCanceller(world.store, lambda: world.epoch, clock_ms=world.clock,
                            on_cancelled=lambda: notified.append(True))
    await loop.cycle()
    cancelled = await cancellations(world, batch_id)
    assert list(cancelled) == [0]
    assert cancelled[0][0] == "corral" and cancelled[0][1].startswith("cancel_after_n_failures")
    assert (loop.cancelled_total, notified) == (1, [True])
    # Again: nothing new, the first row kept.
    await loop.cycle()
    assert (loop.cancelled_total, await cancellations(world, batch_id)) == (1, cancelled)

    assert await world.drain(batch_id) == 3
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_group_thresholds_count_their_subtree_and_keep_the_first_canceller(world: World) -> None:
    await world.instance()
    # Group 1 (threshold 1) holds group 2; group 3 has a threshold of 2;
    # group 4 (threshold 1) is cancelled by its owner before its failure.
    groups = [{"job_group_id": 1, "parent_id": 0, "cancel_after_n_failures": 1},
              {"job_group_id": 2, "parent_id": 1},
              {"job_group_id": 3, "parent_id": 0, "cancel_after_n_failures": 2},
              {"job_group_id": 4, "parent_id": 0, "cancel_after_n_failures": 1}]
    batch_id, _, s = await world.batch(
        [{"job_group_id": 2}, {"job_group_id": 2}, {"job_group_id": 3}, {"job_group_id": 3},
         {"job_group_id": 4}, {"job_group_id": 4}, {}, {"job_group_id": 3}], groups=groups)
    attempt = await world.run(batch_id, s + 4)
    await world.store.cancel_job_group(batch_id, 4, "bob", "not needed")
    await fail(world, batch_id, s)  # in group 2, under group 1
    await fail(world, batch_id, s + 2)  # group 3: 1 of 2
    await world.finish(batch_id, s + 4, attempt, "Failed")
    await world.db.execute("DELETE FROM job_groups_cancelled WHERE batch_id = %s AND job_group_id = 1", (batch_id,))

    loop = FailureCanceller(world.store, lambda: world.epoch, clock_ms=world.clock)
    await loop.cycle()
    assert await cancellations(world, batch_id) == {
        1: ("corral", "cancel_after_n_failures: 1 jobs failed"), 4: ("bob", "not needed")}
    assert loop.cancelled_total == 1

    await fail(world, batch_id, s + 3)  # group 3 reaches 2 with s + 7 still to run
    await world.db.execute("DELETE FROM job_groups_cancelled WHERE batch_id = %s AND job_group_id = 3", (batch_id,))
    await loop.cycle()
    assert set(await cancellations(world, batch_id)) == {1, 3, 4}
    assert await world.drain(batch_id) == 3  # s + 1 (group 2), s + 5 (group 4), s + 7 (group 3)
    await fail(world, batch_id, s + 6, "Success")
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_the_bound_and_the_fence(world: World) -> None:
    await world.instance()
    batches = []
    for _ in range(3):
        batch_id, _, s = await world.batch([{}, {}], cancel_after_n_failures=1)
        await fail(world, batch_id, s)
        batches.append(batch_id)
    await world.db.execute("DELETE FROM job_groups_cancelled")
    with pytest.raises(StaleEpochError):
        await world.store.cancel_failed_job_groups(world.epoch - 1, 10)
    with pytest.raises(InvalidArgumentError):
        await world.store.cancel_failed_job_groups(world.epoch, 0)
    assert await world.db.fetchall("SELECT * FROM job_groups_cancelled") == []

    loop = FailureCanceller(world.store, lambda: None, per_cycle=2, clock_ms=world.clock)
    await loop.cycle()  # not leading: nothing
    assert loop.cancelled_total == 0
    loop = FailureCanceller(world.store, lambda: world.epoch, per_cycle=2, clock_ms=world.clock)
    await loop.cycle()
    assert loop.cancelled_total == 2
    await loop.cycle()
    assert loop.cancelled_total == 3
    for batch_id in batches:
        await world.drain(batch_id)
        assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []
