"""Calls that arrive twice, late or out of order leave consistent rows.

Workers retry events until the driver acknowledges them and the driver may
act on stale information, so SJ, MJS and MJC must be safe to repeat and to
reorder. After every scenario the invariant checker recomputes all
counters from the base tables.
"""

from __future__ import annotations

import pytest

from services.db.database import FailedPreconditionError, StaleEpochError
from services.db.invariants import check_invariants
from tests.world import World


async def attempt_row(world: World, batch_id: int, job_id: int, attempt: str) -> dict:
    row = await world.db.fetchone(
        "SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s AND attempt_id = %s", (batch_id, job_id, attempt))
    assert row is not None
    return row


async def completion_count(world: World, batch_id: int) -> int:
    row = await world.db.fetchone(
        "SELECT SUM(n_completed) AS n FROM job_groups_n_jobs_in_complete_states WHERE batch_id = %s AND job_group_id = 0",
        (batch_id,))
    return int(row["n"] or 0)


async def test_schedule_twice_is_one_attempt_and_one_core_reservation(world: World) -> None:
    await world.instance(cores_mcpu=4000)
    batch_id, _, s = await world.batch([{}])
    request = [{"batch_id": batch_id, "job_id": s, "attempt_id": "x1"}]
    assert (await world.store.schedule_jobs(world.epoch, "i1", request))[0]["outcome"] == "scheduled"
    assert (await world.store.schedule_jobs(world.epoch, "i1", request))[0]["outcome"] == "already_scheduled"
    job = await world.job(batch_id, s)
    assert (job["n_attempts"], job["attempt_id"]) == (1, "x1")
    instance = await world.db.fetchone("SELECT free_cores_mcpu FROM instances WHERE name = 'i1'")
    assert instance["free_cores_mcpu"] == 3000
    assert await check_invariants(world.db) == []


async def test_mark_started_twice_keeps_the_first_start(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    attempt = await world.run(batch_id, s)
    first = (await attempt_row(world, batch_id, s, attempt))["start_time_ms"]
    await world.store.mark_jobs_started(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "start_time_ms": first + 500}])
    assert (await attempt_row(world, batch_id, s, attempt))["start_time_ms"] == first
    assert await check_invariants(world.db) == []


async def test_complete_twice_counts_once(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    attempt = await world.run(batch_id, s)
    assert await world.finish(batch_id, s, attempt, "Success") == "completed"
    assert await world.finish(batch_id, s, attempt, "Success") == "already_complete"
    assert await world.finish(batch_id, s, attempt, "Failed") == "already_complete"
    assert await world.state(batch_id, s) == "Success"
    assert await completion_count(world, batch_id) == 1
    assert await check_invariants(world.db) == []


async def test_complete_before_started_records_the_start(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    result = await world.store.schedule_jobs(world.epoch, "i1", [{"batch_id": batch_id, "job_id": s, "attempt_id": "a"}])
    assert result[0]["outcome"] == "scheduled"
    start, end = world.clock(), world.clock.advance(2000)
    await world.store.mark_jobs_complete(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": s, "attempt_id": "a", "state": "Success", "exit_code": 0,
         "start_time_ms": start, "end_time_ms": end}])
    # The late MJS changes nothing.
    await world.store.mark_jobs_started(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": s, "attempt_id": "a", "start_time_ms": start + 10}])
    row = await attempt_row(world, batch_id, s, "a")
    assert (row["start_time_ms"], row["end_time_ms"], row["rollup_time_ms"]) == (start, end, end)
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_complete_after_cancel_keeps_cancelled_and_closes_the_attempt(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    attempt = await world.run(batch_id, s)
    await world.store.cancel_job_group(batch_id, 0, "alice", "no longer needed")
    # The canceller stops the running job and records it Cancelled...
    assert await world.finish(batch_id, s, attempt, "Cancelled") == "completed"
    # ...then the worker's own completion arrives late.
    world.clock.advance(1000)
    assert await world.finish(batch_id, s, attempt, "Success") == "already_complete"
    assert await world.state(batch_id, s) == "Cancelled"
    assert (await attempt_row(world, batch_id, s, attempt))["end_time_ms"] is not None
    assert await completion_count(world, batch_id) == 1
    assert await check_invariants(world.db) == []


async def test_stale_attempt_completing_after_a_new_attempt_started(world: World) -> None:
    """The first completion wins; the newer attempt's cores are returned."""
    await world.instance("i1")
    await world.instance("i2")
    batch_id, _, s = await world.batch([{}])
    old = await world.run(batch_id, s, instance="i1")
    await world.store.deactivate_instance(world.epoch, "i1", "missed heartbeats")
    new = await world.run(batch_id, s, instance="i2")
    assert await world.finish(batch_id, s, old, "Success", instance="i1") == "completed"
    assert await world.finish(batch_id, s, new, "Failed", instance="i2") == "already_complete"
    job = await world.job(batch_id, s)
    assert (job["state"], job["attempt_id"], job["n_attempts"]) == ("Success", old, 2)
    assert await check_invariants(world.db) == []


async def test_schedule_on_inactive_instance_writes_nothing(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    await world.store.deactivate_instance(world.epoch, "i1", "preempted")
    await world.store.deactivate_instance(world.epoch, "i1", "preempted again")  # idempotent
    with pytest.raises(FailedPreconditionError):
        await world.store.schedule_jobs(world.epoch, "i1", [{"batch_id": batch_id, "job_id": s, "attempt_id": "a"}])
    assert await world.state(batch_id, s) == "Ready"
    assert await world.db.fetchall("SELECT * FROM attempts") == []
    assert await check_invariants(world.db) == []


async def test_a_stale_epoch_is_refused_everywhere(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    attempt = await world.run(batch_id, s)
    old_epoch = world.epoch
    await world.store.elect_leader("driver-1")
    job = [{"batch_id": batch_id, "job_id": s, "attempt_id": attempt}]
    calls = [
        world.store.schedule_jobs(old_epoch, "i1", [{"batch_id": batch_id, "job_id": s, "attempt_id": "zz"}]),
        world.store.mark_jobs_started(old_epoch, "i1", [{**job[0], "start_time_ms": 1}]),
        world.store.mark_jobs_complete(old_epoch, "i1", [{**job[0], "state": "Success"}]),
        world.store.deactivate_instance(old_epoch, "i1", "stale"),
        world.store.cancel_ready_jobs(old_epoch, batch_id, 10),
        world.store.create_instance(old_epoch, "i9", "standard", 1000, "t"),
        world.store.activate_instance(old_epoch, "i1", "tok-i1"),
    ]
    for call in calls:
        with pytest.raises(StaleEpochError):
            await call
    assert await world.state(batch_id, s) == "Running"
    assert await check_invariants(world.db) == []


async def test_create_batch_and_update_are_idempotent_under_their_tokens(world: World) -> None:
    first = await world.store.create_batch("alice", "proj", idempotency_token="t-1")
    again = await world.store.create_batch("alice", "proj", idempotency_token="t-1")
    assert (first["batch_id"], first["created"], again["created"]) == (again["batch_id"], 1, 0)
    # The same token from another user is another batch.
    other = await world.store.create_batch("bob", "proj", idempotency_token="t-1")
    assert other["batch_id"] != first["batch_id"]

    update = await world.store.create_update(first["batch_id"], 3, idempotency_token="u-1")
    update_again = await world.store.create_update(first["batch_id"], 3, idempotency_token="u-1")
    assert update == {**update_again, "message": update["message"]}
    batch = await world.batch_row(first["batch_id"])
    assert (batch["n_updates"], batch["n_reserved_jobs"]) == (1, 3)


async def test_a_resent_bunch_is_recognised_and_commit_twice_is_a_no_op(world: World) -> None:
    created = await world.store.create_batch("alice", "proj")
    batch_id = created["batch_id"]
    update = await world.store.create_update(batch_id, 2)
    u, s = update["update_id"], update["start_job_id"]
    bunch = [{"job_id": s, "cores_mcpu": 1000, "inst_coll": "standard"},
             {"job_id": s + 1, "cores_mcpu": 1000, "inst_coll": "standard"}]
    assert (await world.store.insert_jobs(batch_id, u, bunch))["message"] == "inserted"
    assert (await world.store.insert_jobs(batch_id, u, bunch))["message"] == "duplicate"
    assert (await world.store.commit_update(batch_id, u))["message"] == "committed"
    assert (await world.store.commit_update(batch_id, u))["message"] == "already committed"
    batch = await world.batch_row(batch_id)
    assert (batch["n_jobs"], batch["state"]) == (2, "running")
    assert await check_invariants(world.db) == []


async def test_discard_takes_back_a_batch_never_committed_and_keeps_a_committed_one(world: World) -> None:
    """discard_batch (issue 12): what a refused SubmitBatch or CreateBatch made is cancelled, hidden and its
    token freed, so its reserved ids stop counting and the same token makes a new batch; a batch with a
    committed update (a concurrent call with the token succeeded) is kept."""
    created = await world.store.create_batch("alice", "proj", idempotency_token="t")
    open_batch = int(created["batch_id"])
    await world.store.create_update(open_batch, 5)
    assert (await world.store.discard_batch(open_batch, "alice"))["message"] == "discarded"
    assert (await world.store.discard_batch(open_batch, "alice"))["message"] == "already deleted"
    row = await world.batch_row(open_batch)
    assert (row["deleted"], row["idempotency_token"]) == (1, None)
    await world.store.check_job_limits("alice", "proj", 10, max_open_jobs_per_user=10)  # the 5 count no more
    again = await world.store.create_batch("alice", "proj", idempotency_token="t")
    assert again["created"] == 1 and int(again["batch_id"]) != open_batch

    committed, _, _ = await world.batch([{}], idempotency_token="c")
    with pytest.raises(FailedPreconditionError, match="committed update"):
        await world.store.discard_batch(committed, "alice")
    assert (await world.batch_row(committed))["deleted"] == 0
    assert await check_invariants(world.db) == []
