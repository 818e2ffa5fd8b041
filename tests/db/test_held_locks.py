"""held_locks (migration 0016): the locks running and starting jobs hold, counted per distinct lock, kept
by the procedures (set-based) and the jobs trigger (row at a time). Every way a job starts or stops holding
its locks moves the count, and the invariant checker agrees with job_locks after each."""

from __future__ import annotations

from corral.batch.v1 import job_spec_pb2 as spec_pb
from services.db.invariants import check_invariants
from services.frontend.validate import retry_policy_json
from tests.world import World


def lock(mode: str, name: str = "", level: str = "db") -> dict[str, str]:
    return {"level": level, "mode": mode, "name": name}


async def held(world: World) -> dict[tuple[str, str, str, str], int]:
    rows = await world.db.fetchall(
        "SELECT billing_project, level, mode, lock_name, SUM(n_holders) AS n FROM held_locks "
        "GROUP BY billing_project, level, mode, lock_name HAVING n <> 0")
    return {(r["billing_project"], r["level"], r["mode"], r["lock_name"]): int(r["n"]) for r in rows}


async def consistent(world: World) -> None:
    assert await check_invariants(world.db) == []


async def test_an_attempt_holds_its_locks_from_start_until_final(world: World) -> None:
    await world.instance("i1")
    batch_id, _, first = await world.batch([
        {"locks": [lock("shared", "x"), lock("exclusive", "a", level="table")]},
        {"locks": [lock("shared", "x")]},
        {"locks": [lock("unknown_exclusive", level="disk")]},
        {},
    ])
    assert await held(world) == {}
    attempts = {job: await world.run(batch_id, job) for job in range(first, first + 4)}
    assert await held(world) == {("proj", "db", "shared", "x"): 2, ("proj", "table", "exclusive", "a"): 1,
                                 ("proj", "disk", "unknown_exclusive", ""): 1}
    await consistent(world)
    await world.finish(batch_id, first, attempts[first], "Success")
    await world.finish(batch_id, first + 2, attempts[first + 2], "Failed")
    assert await held(world) == {("proj", "db", "shared", "x"): 1}
    await consistent(world)
    await world.finish(batch_id, first + 1, attempts[first + 1], "Cancelled")
    assert await held(world) == {}
    await consistent(world)


async def test_a_lost_worker_releases_its_jobs_locks(world: World) -> None:
    await world.instance("i1")
    await world.instance("i2")
    batch_id, _, first = await world.batch([{"locks": [lock("exclusive", "x")]},
                                             {"locks": [lock("exclusive", "y")]}])
    await world.run(batch_id, first, "i1")
    await world.run(batch_id, first + 1, "i2")
    await world.store.deactivate_instance(world.epoch, "i1", "missed heartbeats")
    assert await held(world) == {("proj", "db", "exclusive", "y"): 1}
    await consistent(world)


async def test_a_retried_attempt_releases_and_the_next_one_takes_again(world: World) -> None:
    await world.instance("i1")
    batch_id, _, job = await world.batch([{
        "locks": [lock("exclusive", "x")], "max_attempts": 3,
        "retry_policy": retry_policy_json(spec_pb.RetryPolicy(max_failed_retries=2, retry_exit_codes=[3]))}])
    attempt = await world.run(batch_id, job)
    outcome = await world.store.mark_jobs_complete(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": job, "attempt_id": attempt, "state": "Failed", "exit_code": 3,
         "reason": "exited", "start_time_ms": world.clock(), "end_time_ms": world.clock.advance(1000)}])
    assert outcome[0]["outcome"] == "retried" and await world.state(batch_id, job) == "Ready"
    assert await held(world) == {}
    await consistent(world)
    await world.run(batch_id, job)
    assert await held(world) == {("proj", "db", "exclusive", "x"): 1}
    await consistent(world)


async def test_a_row_at_a_time_update_is_counted_by_the_trigger(world: World) -> None:
    """An operator's UPDATE of a job's state (not through the procedures) moves its locks too."""
    await world.instance("i1")
    batch_id, _, job = await world.batch([{"locks": [lock("shared", "x"), lock("shared", "y")]}])
    await world.run(batch_id, job)
    await world.db.execute("UPDATE jobs SET state = 'Error' WHERE batch_id = %s AND job_id = %s", (batch_id, job))
    assert await held(world) == {}
    await world.db.execute("UPDATE jobs SET state = 'Running' WHERE batch_id = %s AND job_id = %s",
                           (batch_id, job))
    assert await held(world) == {("proj", "db", "shared", "x"): 1, ("proj", "db", "shared", "y"): 1}
