"""The fault programs' audit (faults/audit.py) finds what it must: jobs lost,
completions recorded twice, attempts left open. (It runs after each fault in
tests/faults/; these tests show it is not blind.)"""

from __future__ import annotations

from faults.audit import audit_database
from tests.world import World


async def _finish(world: World, batch_id: int, job_id: int, attempt: str) -> str:
    result = await world.store.mark_jobs_complete(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "state": "Success",
                             "exit_code": 0, "start_time_ms": world.clock(), "end_time_ms": world.clock(),
                             "reason": "exited"}])
    return result[0]["outcome"]


async def test_a_clean_run_is_clean(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{}, {}])
    for job_id in (start, start + 1):
        assert await _finish(world, batch_id, job_id, await world.run(batch_id, job_id)) == "completed"
    found = await audit_database(world.db, [batch_id])
    assert (found.jobs, found.lost, found.duplicated, found.open_attempts, found.problems) == (2, 0, 0, 0, [])
    assert found.ok


async def test_a_job_not_finished_is_lost(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{}, {}])
    await _finish(world, batch_id, start, await world.run(batch_id, start))
    await world.run(batch_id, start + 1)  # still Running
    found = await audit_database(world.db, [batch_id])
    assert found.lost == 1 and not found.ok
    # A fault that may end jobs in any final state still counts a Running job as lost.
    assert (await audit_database(world.db, [batch_id], expect_success=False)).lost == 1


async def test_a_failed_job_is_lost_only_where_success_was_promised(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{}])
    await world.finish(batch_id, start, await world.run(batch_id, start), "Failed")
    assert (await audit_database(world.db, [batch_id])).lost == 1
    assert (await audit_database(world.db, [batch_id], expect_success=False)).ok


async def test_a_second_committed_run_is_a_duplicate(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{}])
    first = await world.run(batch_id, start)
    await _finish(world, batch_id, start, first)
    # What a double commit would leave: another attempt of the job recorded as run to its end.
    await world.db.execute(
        "INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, start_time_ms, end_time_ms, "
        "rollup_time_ms, reason) SELECT batch_id, job_id, 'again', instance_name, start_time_ms, end_time_ms, "
        "rollup_time_ms, 'exited' FROM attempts WHERE batch_id = %s AND job_id = %s", (batch_id, start))
    found = await audit_database(world.db, [batch_id])
    assert found.duplicated == 1 and found.attempts == 2 and found.rerun_jobs == 1 and not found.ok


async def test_an_attempt_left_open_is_counted(world: World) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{}])
    await _finish(world, batch_id, start, await world.run(batch_id, start))
    await world.db.execute(
        "INSERT INTO attempts (batch_id, job_id, attempt_id, instance_name, start_time_ms) "
        "VALUES (%s, %s, 'open', 'i1', %s)", (batch_id, start, world.clock()))
    found = await audit_database(world.db, [batch_id])
    assert found.open_attempts == 1 and not found.ok
