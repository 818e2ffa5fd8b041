"""The completion re-check on a real MariaDB: finished groups and batches that
a process left running when it died between its COMMIT and its check."""

from __future__ import annotations

import aiomysql
import pytest

from services.db.database import StaleEpochError
from services.db.invariants import check_invariants
from services.driver.completions import CompletionChecker
from tests.world import World


async def complete_and_die_before_the_check(world: World, batch_id: int, job_id: int, attempt: str) -> None:
    """What MJC does up to its COMMIT, on one connection, without the
    check_completions that follows it: a process that died in between."""

    async def body(cursor: aiomysql.Cursor) -> None:
        await cursor.execute("CALL create_completion_tables()")
        await cursor.execute("START TRANSACTION")
        await cursor.execute(
            """INSERT INTO tmp_job_completions (batch_id, job_id, attempt_id, instance_name, new_state,
                                                start_time_ms, end_time_ms)
               VALUES (%s, %s, %s, 'i1', 'Success', %s, %s)""",
            (batch_id, job_id, attempt, world.clock(), world.clock()))
        await cursor.execute("CALL complete_jobs_core(%s, 1000)", (world.clock(),))
        await cursor.execute("COMMIT")

    await world.db.retrying("complete_and_die", body)


async def group_states(world: World, batch_id: int) -> dict[int, str]:
    rows = await world.db.fetchall("SELECT job_group_id, state FROM job_groups WHERE batch_id = %s", (batch_id,))
    return {r["job_group_id"]: r["state"] for r in rows}


async def outbox(world: World, batch_id: int) -> list[int]:
    rows = await world.db.fetchall("SELECT n_jobs FROM batch_completions WHERE batch_id = %s", (batch_id,))
    return [r["n_jobs"] for r in rows]


async def test_a_finished_group_left_running_is_completed_with_its_batch(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {"job_group_id": 1}], groups=[{"job_group_id": 1, "parent_id": 0}])
    first = await world.run(batch_id, s)
    assert await world.finish(batch_id, s, first, "Success") == "completed"
    last = await world.run(batch_id, s + 1)
    await complete_and_die_before_the_check(world, batch_id, s + 1, last)
    assert await group_states(world, batch_id) == {0: "running", 1: "running"}
    assert await check_invariants(world.db) != []  # every job is final, the groups say otherwise

    loop = CompletionChecker(world.store, lambda: world.epoch, clock_ms=world.clock)
    await loop.cycle()
    assert await group_states(world, batch_id) == {0: "complete", 1: "complete"}
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await outbox(world, batch_id) == [2]
    assert loop.completed_groups_total == 2
    await loop.cycle()  # nothing left: nothing changes, no second outbox row
    assert (loop.completed_groups_total, await outbox(world, batch_id)) == (2, [2])
    assert await check_invariants(world.db) == []


async def test_a_batch_whose_root_group_completed_without_it(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    attempt = await world.run(batch_id, s)
    await world.finish(batch_id, s, attempt, "Failed")
    # check_completions flips the batch in a second transaction; this is a
    # process that died between the two.
    await world.db.execute("UPDATE batches SET state = 'running', time_completed_ms = NULL WHERE batch_id = %s",
                           (batch_id,))
    await world.db.execute("DELETE FROM batch_completions WHERE batch_id = %s", (batch_id,))

    status = await world.store.recheck_completions(world.epoch, 10)
    assert (status["n_checked"], status["n_complete"], status["n_batches_complete"]) == (1, 1, 1)
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await outbox(world, batch_id) == [1]
    assert await check_invariants(world.db) == []


async def test_unfinished_open_and_uncommitted_groups_are_left_alone(world: World) -> None:
    await world.instance()
    open_batch, _, _ = await world.batch([{}], commit=False)  # n_jobs 0 until its commit
    running, _, s = await world.batch([{}, {}])
    attempt = await world.run(running, s)
    await world.finish(running, s, attempt, "Success")  # one of two
    update = await world.store.create_update(running, 1, n_job_groups=1)
    group = update["start_job_group_id"]
    await world.store.insert_job_groups(running, update["update_id"], [{"job_group_id": group, "parent_id": 0}])

    status = await world.store.recheck_completions(world.epoch, 10)
    assert status["n_checked"] == 0
    assert await group_states(world, open_batch) == {0: "running"}
    assert await group_states(world, running) == {0: "running", group: "running"}
    assert (await world.batch_row(open_batch))["state"] == "open"
    with pytest.raises(StaleEpochError):
        await world.store.recheck_completions(world.epoch - 1, 10)
    assert await check_invariants(world.db) == []


async def test_the_re_check_is_bounded_per_cycle(world: World) -> None:
    await world.instance()
    batches = []
    for _ in range(3):
        batch_id, _, s = await world.batch([{}])
        attempt = await world.run(batch_id, s)
        await complete_and_die_before_the_check(world, batch_id, s, attempt)
        batches.append(batch_id)
    loop = CompletionChecker(world.store, lambda: None, per_cycle=2, clock_ms=world.clock)
    await loop.cycle()  # not leading: nothing
    assert loop.completed_groups_total == 0
    loop = CompletionChecker(world.store, lambda: world.epoch, per_cycle=2, clock_ms=world.clock)
    await loop.cycle()
    assert [(await world.batch_row(b))["state"] for b in batches] == ["complete", "complete", "running"]
    await loop.cycle()
    assert [(await world.batch_row(b))["state"] for b in batches] == ["complete"] * 3
    assert await check_invariants(world.db) == []
