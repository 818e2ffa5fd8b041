"""Cancelling is O(1), and fair share sees it at once.

The cost of cancel_job_group is measured with the server's own handler
counters (rows read, written, updated and deleted by the storage engine in
this session), not with a clock: it must be the same for a batch of 1,000
ready jobs and one of 100,000.
"""

from __future__ import annotations

from typing import Any

import aiomysql
import pytest

from services.db.database import FailedPreconditionError
from services.db.invariants import check_invariants
from tests.world import World, job_spec

HANDLERS = ("Handler_write", "Handler_update", "Handler_delete", "Handler_read_key", "Handler_read_next",
            "Handler_read_rnd_next")
N_ALWAYS_RUN = 10
BUNCH = 5000


async def ready_batch(world: World, n_jobs: int) -> int:
    """A committed batch of n_jobs Ready jobs; the last N_ALWAYS_RUN are always_run."""
    created = await world.store.create_batch("alice", "proj")
    batch_id = created["batch_id"]
    update = await world.store.create_update(batch_id, n_jobs)
    u, s = update["update_id"], update["start_job_id"]
    for first in range(0, n_jobs, BUNCH):
        bunch = [job_spec(s + i, always_run=i >= n_jobs - N_ALWAYS_RUN) for i in range(first, min(n_jobs, first + BUNCH))]
        await world.store.insert_jobs(batch_id, u, bunch)
    await world.store.commit_update(batch_id, u)
    return batch_id


async def handler_counts(cursor: aiomysql.Cursor) -> dict[str, int]:
    await cursor.execute("SHOW SESSION STATUS LIKE 'Handler%%'")
    return {row["Variable_name"]: int(row["Value"]) for row in await cursor.fetchall()}


async def measure_cancel(world: World, batch_id: int) -> dict[str, int]:
    """Handler counter deltas of one cancel_job_group call, on one connection."""

    async def body(cursor: aiomysql.Cursor) -> dict[str, int]:
        await handler_counts(cursor)  # warm up: the first SHOW creates its own temporary tables
        before = await handler_counts(cursor)
        await cursor.execute("CALL cancel_job_group(%s, 0, 'alice', 'too expensive', %s)", (batch_id, world.clock()))
        while await cursor.nextset():
            pass
        after = await handler_counts(cursor)
        return {name: after[name] - before[name] for name in HANDLERS}

    return await world.db.retrying("measure_cancel", body)


async def fair_share(world: World) -> dict[str, Any]:
    row = await world.db.fetchone(
        "SELECT * FROM user_inst_coll_fair_share WHERE user = 'alice' AND inst_coll = 'standard'")
    assert row is not None
    return row


async def test_cancel_cost_does_not_grow_with_the_batch(world: World) -> None:
    small = await ready_batch(world, 1_000)
    large = await ready_batch(world, 100_000)

    share = await fair_share(world)
    assert int(share["n_ready_jobs"]) == 101_000
    assert int(share["ready_cores_mcpu"]) == 101_000 * 1000

    small_cost = await measure_cancel(world, small)
    large_cost = await measure_cancel(world, large)
    print(f"\nhandler counters of one cancel: 1,000 jobs {small_cost}; 100,000 jobs {large_cost}")
    # Rows written: one cancellation row and its event in the outbox, whatever
    # the size. Rows read: a few index lookups (the first cancel of the
    # session may take one more), never a scan of the batch's jobs.
    writes = ("Handler_write", "Handler_update", "Handler_delete")
    assert {h: small_cost[h] for h in writes} == {h: large_cost[h] for h in writes} == {
        "Handler_write": 2, "Handler_update": 0, "Handler_delete": 0}
    for cost in (small_cost, large_cost):
        assert sum(cost[h] for h in HANDLERS if h not in writes) <= 5

    # Fair share now ignores both batches' cancellable ready demand but
    # still sees their always-run jobs; no job row was touched.
    share = await fair_share(world)
    assert int(share["n_ready_jobs"]) == 2 * N_ALWAYS_RUN
    assert int(share["ready_cores_mcpu"]) == 2 * N_ALWAYS_RUN * 1000
    states = await world.db.fetchall("SELECT state, COUNT(*) n FROM jobs GROUP BY state")
    assert [(r["state"], r["n"]) for r in states] == [("Ready", 101_000)]
    cancelled = await world.db.fetchall(
        "SELECT batch_id, job_group_id, cancelled_by, reason FROM job_groups_cancelled ORDER BY batch_id")
    assert [(r["batch_id"], r["cancelled_by"], r["reason"]) for r in cancelled] == [
        (small, "alice", "too expensive"), (large, "alice", "too expensive")]


async def test_cancelling_a_job_group_masks_only_its_subtree(world: World) -> None:
    created = await world.store.create_batch("alice", "proj")
    batch_id = created["batch_id"]
    update = await world.store.create_update(batch_id, 6, n_job_groups=2)
    u, s, g = update["update_id"], update["start_job_id"], update["start_job_group_id"]
    await world.store.insert_job_groups(batch_id, u, [
        {"job_group_id": g, "parent_id": 0}, {"job_group_id": g + 1, "parent_id": g}])
    await world.store.insert_jobs(batch_id, u, [
        job_spec(s, job_group_id=0), job_spec(s + 1, job_group_id=0),
        job_spec(s + 2, job_group_id=g), job_spec(s + 3, job_group_id=g + 1),
        job_spec(s + 4, job_group_id=g + 1, always_run=True), job_spec(s + 5, job_group_id=g + 1)])
    await world.store.commit_update(batch_id, u)

    await world.store.cancel_job_group(batch_id, g, "bob", "stage failed")
    share = await fair_share(world)
    # Root jobs and the always_run job still count; g and g+1's others do not.
    assert int(share["n_ready_jobs"]) == 3

    await world.drain(batch_id)
    states = {r["job_id"]: r["state"] for r in await world.db.fetchall(
        "SELECT job_id, state FROM jobs WHERE batch_id = %s", (batch_id,))}
    assert states == {s: "Ready", s + 1: "Ready", s + 2: "Cancelled", s + 3: "Cancelled", s + 4: "Ready",
                      s + 5: "Cancelled"}
    groups = {r["job_group_id"]: r["state"] for r in await world.db.fetchall(
        "SELECT job_group_id, state FROM job_groups WHERE batch_id = %s", (batch_id,))}
    assert groups == {0: "running", g: "running", g + 1: "running"}  # s+4 still has to run
    assert await check_invariants(world.db) == []


async def test_drain_is_set_based_and_completes_the_batch(world: World) -> None:
    await world.instance()
    batch_id = await ready_batch(world, 2_000)
    running = await world.run(batch_id, 1)
    await world.store.cancel_job_group(batch_id, 0, "alice", "oops")
    # The scheduler no longer takes cancellable jobs of the batch.
    refused = await world.store.schedule_jobs(world.epoch, "i1", [{"batch_id": batch_id, "job_id": 2, "attempt_id": "z"}])
    assert refused[0]["outcome"] == "cancelled"

    first = await world.store.cancel_ready_jobs(world.epoch, batch_id, 300)
    assert first == 300
    await world.drain(batch_id)
    await world.finish(batch_id, 1, running, "Cancelled")  # the canceller stopped the running job
    for job_id in range(2_000 - N_ALWAYS_RUN + 1, 2_001):  # always_run jobs still run
        attempt = await world.run(batch_id, job_id)
        await world.finish(batch_id, job_id, attempt, "Success")
    batch = await world.batch_row(batch_id)
    assert batch["state"] == "complete"
    counts = await world.db.fetchone(
        """SELECT SUM(n_cancelled) c, SUM(n_succeeded) s FROM job_groups_n_jobs_in_complete_states
           WHERE batch_id = %s AND job_group_id = 0""", (batch_id,))
    assert (int(counts["c"]), int(counts["s"])) == (2_000 - N_ALWAYS_RUN, N_ALWAYS_RUN)
    assert await check_invariants(world.db) == []


async def cancelled_groups(world: World, batch_id: int) -> set[int]:
    """Every group the cancellation of itself or an ancestor reaches (the one statement the procedures ask)."""
    return {r["job_group_id"] for r in await world.db.fetchall(
        "SELECT DISTINCT job_group_id FROM job_groups_cancelled_self_or_ancestor WHERE batch_id = %s", (batch_id,))}


async def test_cancelling_empty_nested_groups_records_it_at_once_and_refuses_their_later_jobs(world: World) -> None:
    """Issue 36: groups 1 > 2 > 3 with no jobs (complete at their commit) and a job in the root. Cancelling
    group 1 is recorded and reaches 2 and 3; later jobs and groups for them are refused (rc 2), as they are
    for a group with jobs; the root still takes jobs."""
    batch_id, _, _ = await world.batch([{}], groups=[{"job_group_id": 1, "parent_id": 0},
                                                     {"job_group_id": 2, "parent_id": 1},
                                                     {"job_group_id": 3, "parent_id": 2}])
    states = {r["job_group_id"]: (r["state"], r["n_jobs"]) for r in await world.db.fetchall(
        "SELECT job_group_id, state, n_jobs FROM job_groups WHERE batch_id = %s", (batch_id,))}
    assert states == {0: ("running", 1), 1: ("complete", 0), 2: ("complete", 0), 3: ("complete", 0)}

    assert (await world.store.cancel_job_group(batch_id, 1, "alice", "wrong input"))["message"] == "cancelled"
    assert await cancelled_groups(world, batch_id) == {1, 2, 3}
    assert (await world.store.cancel_job_group(batch_id, 1, "bob", "again"))["message"] == "already cancelled"
    row = await world.db.fetchone("SELECT cancelled_by, reason FROM job_groups_cancelled WHERE batch_id = %s "
                                  "AND job_group_id = 1", (batch_id,))
    assert (row["cancelled_by"], row["reason"]) == ("alice", "wrong input")
    # A group below a cancelled one is cancelled already; cancelling it too records its own row, as before.
    assert (await world.store.cancel_job_group(batch_id, 3, "alice", "leaf"))["message"] == "cancelled"

    update = await world.store.create_update(batch_id, 2, n_job_groups=1)
    u, s, g = update["update_id"], update["start_job_id"], update["start_job_group_id"]
    for group in (1, 2, 3):
        with pytest.raises(FailedPreconditionError, match="a job names a cancelled job group"):
            await world.store.insert_jobs(batch_id, u, [job_spec(s, job_group_id=group)])
    with pytest.raises(FailedPreconditionError, match="job group 2 is cancelled"):
        await world.store.insert_job_groups(batch_id, u, [{"job_group_id": g, "parent_id": 2}])
    # The root is not cancelled: its jobs and new groups are taken, and the update commits.
    await world.store.insert_job_groups(batch_id, u, [{"job_group_id": g, "parent_id": 0}])
    await world.store.insert_jobs(batch_id, u, [job_spec(s, job_group_id=0), job_spec(s + 1, job_group_id=g)])
    await world.store.commit_update(batch_id, u)
    assert await cancelled_groups(world, batch_id) == {1, 2, 3}
    assert await check_invariants(world.db) == []


async def test_an_empty_batch_is_cancelled_and_takes_no_later_update(world: World) -> None:
    """An empty group 0 is not a finished batch: its cancellation is recorded and refuses later updates."""
    batch_id, _, _ = await world.batch([], groups=[{"job_group_id": 1, "parent_id": 0}])
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert (await world.store.cancel_job_group(batch_id, 0, "alice", "never mind"))["message"] == "cancelled"
    assert await cancelled_groups(world, batch_id) == {0, 1}
    with pytest.raises(FailedPreconditionError, match=f"batch {batch_id} is cancelled"):
        await world.store.create_update(batch_id, 1)
    assert await check_invariants(world.db) == []


async def test_a_finished_group_is_left_as_it_is_and_an_empty_one_beside_it_is_cancelled(world: World) -> None:
    """Issue 12's rule stands for a group whose jobs have all finished ('complete', nothing recorded); a group
    with no jobs yet, complete at its commit too, has not finished: its cancellation is recorded. An open
    update makes the finished one unfinished again, and then its cancellation counts."""
    await world.instance()
    batch_id, _, s = await world.batch([{"job_group_id": 1}, {}], groups=[{"job_group_id": 1, "parent_id": 0},
                                                                          {"job_group_id": 2, "parent_id": 0}])
    await world.finish(batch_id, s, await world.run(batch_id, s), "Success")
    states = {r["job_group_id"]: (r["state"], r["n_jobs"]) for r in await world.db.fetchall(
        "SELECT job_group_id, state, n_jobs FROM job_groups WHERE batch_id = %s AND job_group_id > 0", (batch_id,))}
    assert states == {1: ("complete", 1), 2: ("complete", 0)}
    assert (await world.store.cancel_job_group(batch_id, 1, "alice", "late"))["message"] == "complete"
    assert (await world.store.cancel_job_group(batch_id, 2, "alice", "late"))["message"] == "cancelled"
    assert await cancelled_groups(world, batch_id) == {2}
    await world.store.create_update(batch_id, 1)
    assert (await world.store.cancel_job_group(batch_id, 1, "alice", "now"))["message"] == "cancelled"
    assert await cancelled_groups(world, batch_id) == {1, 2}
    assert await check_invariants(world.db) == []
