"""What workers report about each attempt (migration 0006): MJS records the
runtime's isolation and refuses to start an attempt that must not run; MJC
records exit code, error message, cpu time and peak memory once."""

from __future__ import annotations

import pytest

from services.db.database import InvalidArgumentError
from services.db.invariants import check_invariants
from tests.world import World

ISOLATION = "process runtime: no container isolated this job."


async def attempt_row(world: World, batch_id: int, job_id: int, attempt: str) -> dict:
    row = await world.db.fetchone(
        "SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s AND attempt_id = %s", (batch_id, job_id, attempt))
    assert row is not None
    return row


async def schedule(world: World, batch_id: int, job_id: int, instance: str = "i1") -> str:
    attempt = world.attempt_id()
    outcome = await world.store.schedule_jobs(world.epoch, instance,
                                              [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}])
    assert outcome[0]["outcome"] == "scheduled", outcome
    return attempt


async def start(world: World, batch_id: int, job_id: int, attempt: str, instance: str = "i1") -> dict:
    status = await world.store.mark_jobs_started(world.epoch, instance, [
        {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "start_time_ms": world.clock(),
         "isolation": ISOLATION}])
    assert len(status["outcomes"]) == 1
    return status


async def test_a_start_records_isolation_once(world: World) -> None:
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    first = world.clock()
    status = await start(world, batch_id, job_id, attempt)
    assert (status["n_started"], status["outcomes"][0]["outcome"]) == (1, "started")
    world.clock.advance(500)
    status = await start(world, batch_id, job_id, attempt)
    assert (status["n_started"], status["outcomes"][0]["outcome"]) == (0, "already_started")
    row = await attempt_row(world, batch_id, job_id, attempt)
    assert (row["start_time_ms"], row["rollup_time_ms"], row["isolation"]) == (first, first, ISOLATION)
    assert await check_invariants(world.db) == []


async def test_no_start_in_a_cancelled_batch_unless_always_run(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {"always_run": True}])
    plain, always = await schedule(world, batch_id, s), await schedule(world, batch_id, s + 1)
    await world.store.cancel_job_group(batch_id, 0, "alice", "changed my mind")
    assert (await start(world, batch_id, s, plain))["outcomes"][0]["outcome"] == "cancelled"
    assert (await start(world, batch_id, s + 1, always))["outcomes"][0]["outcome"] == "started"
    row = await attempt_row(world, batch_id, s, plain)
    assert (row["start_time_ms"], row["rollup_time_ms"], row["isolation"]) == (None, None, None)
    # The worker stops it and reports Cancelled; nothing was billed.
    assert await world.finish(batch_id, s, plain, "Cancelled") == "completed"
    assert await check_invariants(world.db) == []


async def test_no_start_when_an_ancestor_group_is_cancelled(world: World) -> None:
    await world.instance()
    created = await world.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, 2, 2)
    g, s = update["start_job_group_id"], update["start_job_id"]
    await world.store.insert_job_groups(batch_id, update["update_id"], [
        {"job_group_id": g, "parent_id": 0}, {"job_group_id": g + 1, "parent_id": g}])
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": s, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": g + 1},
        {"job_id": s + 1, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0}])
    await world.store.commit_update(batch_id, update["update_id"])
    inner, outer = await schedule(world, batch_id, s), await schedule(world, batch_id, s + 1)
    await world.store.cancel_job_group(batch_id, g, "alice", "not this part")
    assert (await start(world, batch_id, s, inner))["outcomes"][0]["outcome"] == "cancelled"
    assert (await start(world, batch_id, s + 1, outer))["outcomes"][0]["outcome"] == "started"
    assert await check_invariants(world.db) == []


async def test_no_start_on_a_final_job(world: World) -> None:
    """The job was closed without its running attempt (e.g. by a canceller
    that did not name it): the attempt is open but must not start."""
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    outcome = await world.store.mark_jobs_complete(world.epoch, None, [
        {"batch_id": batch_id, "job_id": job_id, "attempt_id": None, "state": "Cancelled"}])
    assert outcome[0]["outcome"] == "completed"
    assert (await start(world, batch_id, job_id, attempt))["outcomes"][0]["outcome"] == "already_complete"
    assert (await attempt_row(world, batch_id, job_id, attempt))["start_time_ms"] is None
    assert await check_invariants(world.db) == []


async def test_closed_and_unknown_attempts_change_nothing(world: World) -> None:
    await world.instance()
    await world.instance("i2")
    batch_id, _, s = await world.batch([{}, {}])
    done = await schedule(world, batch_id, s)
    assert await world.finish(batch_id, s, done, "Success") == "completed"
    gone = await schedule(world, batch_id, s + 1)
    await world.store.deactivate_instance(world.epoch, "i1", "dead")
    assert (await start(world, batch_id, s, done))["outcomes"][0]["outcome"] == "ended"
    assert (await start(world, batch_id, s + 1, gone))["outcomes"][0]["outcome"] == "ended"
    assert (await start(world, batch_id, s + 1, "nope"))["outcomes"][0]["outcome"] == "not_found"
    again = await schedule(world, batch_id, s + 1, "i2")
    # Reported by the wrong instance.
    assert (await start(world, batch_id, s + 1, again, "i1"))["outcomes"][0]["outcome"] == "not_found"
    assert (await start(world, batch_id, s + 1, again, "i2"))["outcomes"][0]["outcome"] == "started"
    assert await check_invariants(world.db) == []


async def test_a_start_without_its_time_is_refused_and_writes_nothing(world: World) -> None:
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    with pytest.raises(InvalidArgumentError):
        await world.store.mark_jobs_started(world.epoch, "i1", [
            {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "isolation": ISOLATION}])
    assert (await attempt_row(world, batch_id, job_id, attempt))["isolation"] is None


async def test_completion_records_the_outcome_once(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    attempt = await schedule(world, batch_id, s)
    await start(world, batch_id, s, attempt)
    report = {"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "state": "Failed", "exit_code": 3,
              "error_message": "exited with code 3", "cpu_time_ms": 1234, "peak_memory_bytes": 5 * 2**20,
              "start_time_ms": world.clock(), "end_time_ms": world.clock.advance(2000), "reason": "exited"}
    assert (await world.store.mark_jobs_complete(world.epoch, "i1", [report]))[0]["outcome"] == "completed"
    repeat = {**report, "state": "Success", "exit_code": 0, "error_message": None, "cpu_time_ms": 1,
              "peak_memory_bytes": 1, "end_time_ms": world.clock.advance(1000)}
    assert (await world.store.mark_jobs_complete(world.epoch, "i1", [repeat]))[0]["outcome"] == "already_complete"
    row = await attempt_row(world, batch_id, s, attempt)
    assert (row["exit_code"], row["error_message"], row["cpu_time_ms"], row["peak_memory_bytes"], row["reason"]) == (
        3, "exited with code 3", 1234, 5 * 2**20, "exited")
    assert (await world.job(batch_id, s))["exit_code"] == 3

    # An attempt closed by deactivation keeps no late outcome either.
    other = await schedule(world, batch_id, s + 1)
    await world.store.deactivate_instance(world.epoch, "i1", "dead")
    late = {**report, "job_id": s + 1, "attempt_id": other, "state": "Success", "exit_code": 0,
            "error_message": None}
    await world.store.mark_jobs_complete(world.epoch, "i1", [late])
    row = await attempt_row(world, batch_id, s + 1, other)
    assert (row["exit_code"], row["error_message"], row["cpu_time_ms"], row["reason"]) == (
        None, "its worker was lost (i1: dead)", None, "worker_lost")
    assert await check_invariants(world.db) == []


async def attempt_resources(world: World, batch_id: int, attempt: str) -> dict[str, int]:
    rows = await world.db.fetchall(
        "SELECT r.name, ar.quantity FROM attempt_resources ar JOIN resources r ON r.resource_id = ar.resource_id "
        "WHERE ar.batch_id = %s AND ar.attempt_id = %s", (batch_id, attempt))
    return {row["name"]: int(row["quantity"]) for row in rows}


def with_resources(batch_id: int, job_id: int, attempt: str, start_ms: int) -> dict:
    return {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "start_time_ms": start_ms,
            "isolation": ISOLATION, "cpu_resource": "cpu/local/1", "memory_resource": "memory/local/1"}


async def test_a_start_with_resource_names_records_the_reservation_once(world: World) -> None:
    """MJS records what a started attempt uses (its job's cores and memory in MiB), as add_attempt_resources did
    in a call of its own; a repeat keeps the first write."""
    await world.instance()
    created = await world.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, 1, 0)
    s = update["start_job_id"]
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": s, "cores_mcpu": 250, "memory_bytes": 3 * 2**30, "inst_coll": "standard", "job_group_id": 0}])
    await world.store.commit_update(batch_id, update["update_id"])
    attempt = await schedule(world, batch_id, s)
    status = await world.store.mark_jobs_started(world.epoch, "i1", [with_resources(batch_id, s, attempt, world.clock())])
    assert status["outcomes"][0]["outcome"] == "started"
    assert await attempt_resources(world, batch_id, attempt) == {"cpu/local/1": 250, "memory/local/1": 3072}
    await world.db.execute("UPDATE jobs SET cores_mcpu = 500 WHERE batch_id = %s", (batch_id,))
    status = await world.store.mark_jobs_started(world.epoch, "i1", [with_resources(batch_id, s, attempt, world.clock())])
    assert status["outcomes"][0]["outcome"] == "already_started"
    assert await attempt_resources(world, batch_id, attempt) == {"cpu/local/1": 250, "memory/local/1": 3072}
    await world.db.execute("UPDATE jobs SET cores_mcpu = 250 WHERE batch_id = %s", (batch_id,))
    assert await check_invariants(world.db) == []


async def test_resources_only_for_attempts_that_start(world: World) -> None:
    """A refused start (cancelled, ended, unknown) gets no resources; without names, none either."""
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}, {}])
    cancelled_batch, _, c = await world.batch([{}])
    cancelled = await schedule(world, cancelled_batch, c)
    await world.store.cancel_job_group(cancelled_batch, 0, "alice", "changed my mind")
    ended = await schedule(world, batch_id, s)
    assert await world.finish(batch_id, s, ended, "Success") == "completed"
    plain, named = await schedule(world, batch_id, s + 1), await schedule(world, batch_id, s + 2)
    now = world.clock()
    status = await world.store.mark_jobs_started(world.epoch, "i1", [
        with_resources(cancelled_batch, c, cancelled, now), with_resources(batch_id, s, ended, now),
        with_resources(batch_id, s + 2, "nope", now), with_resources(batch_id, s + 2, named, now),
        {"batch_id": batch_id, "job_id": s + 1, "attempt_id": plain, "start_time_ms": now}])
    outcomes = {(o["batch_id"], o["attempt_id"]): o["outcome"] for o in status["outcomes"]}
    assert outcomes == {(cancelled_batch, cancelled): "cancelled", (batch_id, ended): "ended",
                        (batch_id, "nope"): "not_found", (batch_id, named): "started", (batch_id, plain): "started"}
    assert await attempt_resources(world, cancelled_batch, cancelled) == {}
    assert await attempt_resources(world, batch_id, ended) == {}
    assert await attempt_resources(world, batch_id, plain) == {}
    assert await attempt_resources(world, batch_id, named) == {"cpu/local/1": 1000, "memory/local/1": 0}
    assert await world.finish(cancelled_batch, c, cancelled, "Cancelled") == "completed"
    assert await check_invariants(world.db) == []


async def test_an_unknown_resource_name_refuses_the_whole_start(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    good, bad = await schedule(world, batch_id, s), await schedule(world, batch_id, s + 1)
    with pytest.raises(InvalidArgumentError, match="unknown cpu_resource or memory_resource"):
        await world.store.mark_jobs_started(world.epoch, "i1", [
            with_resources(batch_id, s, good, world.clock()),
            {**with_resources(batch_id, s + 1, bad, world.clock()), "memory_resource": "memory/nowhere/9"}])
    for job_id, attempt in ((s, good), (s + 1, bad)):
        assert (await attempt_row(world, batch_id, job_id, attempt))["start_time_ms"] is None
        assert await attempt_resources(world, batch_id, attempt) == {}


async def test_resources_first_given_on_a_repeated_start_bill_what_was_rolled_up(world: World) -> None:
    """A start recorded without resource names, rolled up for 60 s, then repeated with them: the repeat records
    the resources and bills the 60 s at once (the insert trigger, which a fresh start skips)."""
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    late, fresh = await schedule(world, batch_id, s), await schedule(world, batch_id, s + 1)
    started = world.clock()
    await start(world, batch_id, s, late)
    world.clock.advance(60_000)
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": s, "attempt_id": late, "rollup_time_ms": started + 60_000}])
    status = await world.store.mark_jobs_started(world.epoch, "i1", [
        with_resources(batch_id, s, late, started), with_resources(batch_id, s + 1, fresh, world.clock())])
    assert [o["outcome"] for o in status["outcomes"]] == ["already_started", "started"]
    usage = {(int(row["job_id"]), row["name"]): int(row["usage"]) for row in await world.db.fetchall(
        "SELECT a.job_id, r.name, a.`usage` FROM aggregated_job_resources a "
        "JOIN resources r ON r.resource_id = a.resource_id WHERE a.batch_id = %s", (batch_id,))}
    assert usage == {(s, "cpu/local/1"): 1000 * 60_000, (s, "memory/local/1"): 0}
    assert await check_invariants(world.db) == []
