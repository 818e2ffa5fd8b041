"""rerun_failed_jobs and delete_batch on a real MariaDB.

A re-run is a new update of copies: of the failed jobs and of everything
below them, with edges between copies and to originals that are not re-run,
resources (cores, memory, storage), on-demand, attributes and locks copied, idempotent under its token, and a
job already re-run is never re-run again (its copy is).
"""

from __future__ import annotations

import pytest

from services.db.database import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.db.invariants import check_invariants
from tests.world import World

ANY = 15
GIB = 2**30


async def edges(world: World, batch_id: int) -> set[tuple[int, int, int]]:
    rows = await world.db.fetchall("SELECT job_id, parent_id, accepted_states FROM job_parents WHERE batch_id = %s",
                                   (batch_id,))
    return {(r["job_id"], r["parent_id"], r["accepted_states"]) for r in rows}


async def reruns(world: World, batch_id: int) -> dict[int, int]:
    rows = await world.db.fetchall("SELECT job_id, rerun_of_job_id FROM job_reruns WHERE batch_id = %s", (batch_id,))
    return {r["job_id"]: r["rerun_of_job_id"] for r in rows}


async def failed_dag(world: World) -> int:
    """1 <- 2 <- 3 (3 accepts anything), 4, and 5 <- {2, 4}; 2 fails, 5 is cancelled."""
    await world.instance()
    batch_id, _, _ = await world.batch([
        {"attributes": [{"key": "name", "value": "root"}]},
        {"parents": [{"job_id": 1}], "attributes": [{"key": "name", "value": "flaky"}],
         "locks": [{"level": "db", "mode": "exclusive", "name": "x"}], "priority": 7, "cores_mcpu": 250,
         "memory_bytes": 3 * GIB, "storage_bytes": 5 * GIB, "on_demand": True},
        {"parents": [{"job_id": 2, "accepted_states": ANY}]},
        {},
        {"parents": [{"job_id": 2}, {"job_id": 4}]},
    ])
    for job_id, state in ((1, "Success"), (4, "Success"), (2, "Failed"), (3, "Success")):
        await world.finish(batch_id, job_id, await world.run(batch_id, job_id), state)
    assert await world.drain(batch_id) == 1  # 5: its parent 2 failed
    return batch_id


async def test_rerun_copies_failed_jobs_and_their_dependents(world: World) -> None:
    batch_id = await failed_dag(world)
    before = await edges(world, batch_id)
    status = await world.store.rerun_failed_jobs(batch_id, "r1", 2)
    assert (status["update_id"], status["start_job_id"], status["n_jobs"]) == (2, 6, 3)
    # 6 = copy of 2 (its parent 1 stays), 7 of 3 (now below 6), 8 of 5 (below 6 and the original 4).
    assert await edges(world, batch_id) - before == {(6, 1, 1), (7, 6, ANY), (8, 4, 1), (8, 6, 1)}
    assert await reruns(world, batch_id) == {6: 2, 7: 3, 8: 5}
    copy = await world.job(batch_id, 6)
    assert (copy["state"], copy["n_pending_parents"], copy["priority"], copy["cores_mcpu"]) == ("Pending", 0, 7, 250)
    # It reserves what its original reserved: memory and scratch storage (migration 0017).
    assert (copy["memory_bytes"], copy["storage_bytes"]) == (3 * GIB, 5 * GIB)
    # And it stays off spot machines as its original did.
    on_demand = await world.db.fetchall("SELECT job_id FROM on_demand_jobs WHERE batch_id = %s", (batch_id,))
    assert (copy["on_demand"], sorted(r["job_id"] for r in on_demand)) == (1, [2, 6])
    attrs = await world.db.fetchall("SELECT job_id, `value` FROM job_attributes WHERE batch_id = %s AND `key` = 'name'",
                                    (batch_id,))
    assert {(r["job_id"], r["value"]) for r in attrs} == {(1, "root"), (2, "flaky"), (6, "flaky")}
    locks = await world.db.fetchall("SELECT job_id FROM job_locks WHERE batch_id = %s", (batch_id,))
    assert sorted(r["job_id"] for r in locks) == [2, 6]

    # The same token again: the same update, nothing more written.
    again = await world.store.rerun_failed_jobs(batch_id, "r1", 2)
    assert (again["message"], again["update_id"]) == ("exists", 2)
    await world.store.commit_update(batch_id, 2)
    assert [await world.state(batch_id, j) for j in (6, 7, 8)] == ["Ready", "Pending", "Pending"]
    batch = await world.batch_row(batch_id)
    assert (batch["state"], batch["n_jobs"]) == ("running", 8)
    assert await check_invariants(world.db) == []

    # Re-run originals are never re-run again: nothing left, nothing written.
    nothing = await world.store.rerun_failed_jobs(batch_id, "r2", 2 | 4 | 8)
    assert (nothing["update_id"], nothing["n_jobs"]) == (None, 0)
    assert (await world.batch_row(batch_id))["n_updates"] == 2

    # The copy fails in turn: its re-run chains from the copy.
    await world.finish(batch_id, 6, await world.run(batch_id, 6), "Failed")
    third = await world.store.rerun_failed_jobs(batch_id, "r3", 2)
    assert (third["start_job_id"], third["n_jobs"]) == (9, 3)
    await world.store.commit_update(batch_id, int(third["update_id"]))
    assert {k: v for k, v in (await reruns(world, batch_id)).items() if k >= 9} == {9: 6, 10: 7, 11: 8}
    assert {(9, 1, 1), (10, 9, ANY), (11, 4, 1), (11, 9, 1)} <= await edges(world, batch_id)
    assert await check_invariants(world.db) == []


async def test_rerun_of_cancelled_jobs_only_when_asked(world: World) -> None:
    batch_id = await failed_dag(world)
    status = await world.store.rerun_failed_jobs(batch_id, "c", 8)
    # Only 5 was cancelled; it has no dependents. Its parent 2 failed and is not
    # re-run, so the copy depends on a failed original: it is cancelled in turn.
    assert (status["start_job_id"], status["n_jobs"]) == (6, 1)
    copy = await world.job(batch_id, 6)
    assert (copy["dependency_failed"], copy["n_pending_parents"]) == (1, 0)
    await world.store.commit_update(batch_id, int(status["update_id"]))
    assert await world.drain(batch_id) == 1
    assert await check_invariants(world.db) == []


async def test_refusals_write_nothing(world: World) -> None:
    batch_id = await failed_dag(world)
    with pytest.raises(InvalidArgumentError):
        await world.store.rerun_failed_jobs(batch_id, "t", 1)  # Success is not a failure
    with pytest.raises(InvalidArgumentError):
        await world.store.rerun_failed_jobs(batch_id, "", 2)
    with pytest.raises(NotFoundError):
        await world.store.rerun_failed_jobs(batch_id + 1, "t", 2)
    # Cancelling the finished batch changes nothing (issue 12)...
    assert (await world.store.cancel_job_group(batch_id, 0, "alice", "enough"))["message"] == "complete"
    # ...but with an update open it is not finished, and a cancelled batch takes no re-run.
    await world.store.create_update(batch_id, 1)
    await world.store.cancel_job_group(batch_id, 0, "alice", "enough")
    with pytest.raises(FailedPreconditionError):
        await world.store.rerun_failed_jobs(batch_id, "t", 2)
    batch = await world.batch_row(batch_id)
    assert (batch["n_updates"], batch["n_reserved_jobs"]) == (2, 6)
    assert await reruns(world, batch_id) == {}


async def test_copies_in_a_cancelled_group_are_refused(world: World) -> None:
    await world.instance()
    batch_id, _, _ = await world.batch([{"job_group_id": 1}],
                                       groups=[{"job_group_id": 1, "parent_id": 0}])
    attempt = await world.run(batch_id, 1)
    # Cancelled while its job runs (a finished group is not cancelled: issue 12); the job then fails.
    await world.store.cancel_job_group(batch_id, 1, "alice", "stop")
    await world.finish(batch_id, 1, attempt, "Failed")
    with pytest.raises(FailedPreconditionError, match="job group 1"):
        await world.store.rerun_failed_jobs(batch_id, "t", 2)
    assert (await world.batch_row(batch_id))["n_updates"] == 1


async def test_delete_batch(world: World) -> None:
    batch_id, _, _ = await world.batch([{}])
    assert (await world.store.delete_batch(batch_id))["message"] == "deleted"
    assert (await world.store.delete_batch(batch_id))["message"] == "already deleted"
    assert (await world.batch_row(batch_id))["deleted"] == 1
    with pytest.raises(NotFoundError):
        await world.store.create_update(batch_id, 1)
    with pytest.raises(NotFoundError):
        await world.store.delete_batch(batch_id + 1)
    assert await check_invariants(world.db) == []
