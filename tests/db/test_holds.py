"""Holds (migration 0029, hold_jobs and release_jobs): every allowed and refused transition of a hold on a
batch, a job group and a job, and what a hold does to the scheduler's reads: the queue heads pass held jobs
over, schedule_jobs refuses them, the demand leaves them out, and a release undoes each."""

from __future__ import annotations

import pytest

from services.db.database import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand, read_queues
from tests.world import World

GROUPS = [{"job_group_id": 1, "parent_id": 0}, {"job_group_id": 2, "parent_id": 1}]


async def heads(world: World, depth: int = 100) -> list[tuple[int, int]]:
    queues = await read_queues(world.db, {"standard": {"alice": depth}})
    return [c.key for c in queues["standard"]["alice"]]


async def ready_cores(world: World) -> int:
    demand = await read_demand(world.db)
    return sum(d.ready_cores_mcpu for d in demand.get("standard", []) if d.user == "alice")


async def test_a_batch_is_held_and_released_once_each_way(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    batch_id, _, start = await world.batch([{}, {}, {}])
    assert await ready_cores(world) == 3000
    assert (await world.store.hold_jobs(batch_id, "alice"))["message"] == "held"
    assert (await world.store.hold_jobs(batch_id, "bob"))["message"] == "already held"
    row = await world.db.fetchone("SELECT * FROM job_groups_held WHERE batch_id = %s", (batch_id,))
    assert (row["job_group_id"], row["held_by"], row["time_held_ms"]) == (0, "alice", world.clock())  # the first's
    assert await heads(world) == [] and await ready_cores(world) == 0
    assert {await world.state(batch_id, start + i) for i in range(3)} == {"Ready"}  # still Ready
    outcome = await world.store.schedule_jobs(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start, "attempt_id": "a-held"}])
    assert outcome[0]["outcome"] == "held" and await world.state(batch_id, start) == "Ready"
    assert (await world.store.release_jobs(batch_id))["message"] == "released"
    assert (await world.store.release_jobs(batch_id))["message"] == "not held"
    assert await heads(world) == [(batch_id, start + i) for i in range(3)] and await ready_cores(world) == 3000
    await world.run(batch_id, start)
    assert await check_invariants(world.db) == []


async def test_a_group_hold_reaches_its_subtree_and_a_job_hold_only_the_job(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    batch_id, _, start = await world.batch([{"job_group_id": g} for g in (0, 1, 2)], groups=GROUPS)
    top, middle, inner = start, start + 1, start + 2
    assert (await world.store.hold_jobs(batch_id, "alice", job_group_id=1))["message"] == "held"
    assert await heads(world) == [(batch_id, top)]
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=top))["message"] == "held"
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=top))["message"] == "already held"
    assert await heads(world) == [] and await ready_cores(world) == 0
    # A job held by its own hold and its group's stays held until both go.
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=inner))["message"] == "held"
    await world.store.release_jobs(batch_id, job_group_id=1)
    assert await heads(world) == [(batch_id, middle)] and await ready_cores(world) == 1000
    assert (await world.store.release_jobs(batch_id, job_id=inner))["message"] == "released"
    assert (await world.store.release_jobs(batch_id, job_id=inner))["message"] == "not held"
    await world.store.release_jobs(batch_id, job_id=top)
    assert await heads(world) == [(batch_id, top), (batch_id, middle), (batch_id, inner)]


async def test_refused_holds_and_releases(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    batch_id, _, start = await world.batch([{}, {}, {}])
    with pytest.raises(NotFoundError, match="no job group 7 in batch"):
        await world.store.hold_jobs(batch_id, "alice", job_group_id=7)
    with pytest.raises(NotFoundError, match="no job 99 in batch"):
        await world.store.hold_jobs(batch_id, "alice", job_id=99)
    with pytest.raises(NotFoundError, match="no job group 7 in batch"):
        await world.store.release_jobs(batch_id, job_group_id=7)
    with pytest.raises(NotFoundError, match="no job 99 in batch"):
        await world.store.release_jobs(batch_id, job_id=99)
    with pytest.raises(NotFoundError):
        await world.store.hold_jobs(batch_id + 1000, "alice")
    with pytest.raises(InvalidArgumentError, match="who held"):
        await world.store.hold_jobs(batch_id, "")
    # A final job has nothing to hold; a running one is held for its later attempts.
    attempt = await world.run(batch_id, start)
    await world.finish(batch_id, start, attempt, "Success")
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=start))["message"] == "complete"
    assert await world.db.fetchone("SELECT 1 FROM jobs_held WHERE job_id = %s", (start,)) is None
    await world.run(batch_id, start + 1)
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=start + 1))["message"] == "held"
    assert await world.state(batch_id, start + 1) == "Running"
    # At most so many jobs of a batch held one by one.
    with pytest.raises(ResourceExhaustedError, match="already has 1 jobs held one by one"):
        await world.store.hold_jobs(batch_id, "alice", job_id=start + 2, max_held_jobs=1)
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=start + 1, max_held_jobs=1))["message"] == \
        "already held"  # one already held is not a new one


async def test_a_held_group_holds_the_jobs_a_later_update_adds(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    batch_id, _, _ = await world.batch([{}])
    await world.store.hold_jobs(batch_id, "alice")
    update = await world.store.create_update(batch_id, 2, 0)
    first = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [{"job_id": first + i, "cores_mcpu": 1000,
                                                                  "inst_coll": "standard", "job_group_id": 0}
                                                                 for i in range(2)])
    await world.store.commit_update(batch_id, update["update_id"])
    assert await heads(world) == [] and await ready_cores(world) == 0


async def test_a_completed_batch_drops_its_jobs_holds_and_keeps_its_own(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    batch_id, _, start = await world.batch([{}, {}])
    first = await world.run(batch_id, start)
    assert (await world.store.hold_jobs(batch_id, "alice", job_id=start))["message"] == "held"  # running: its retries
    await world.store.hold_jobs(batch_id, "alice", job_id=start + 1)
    await world.store.release_jobs(batch_id, job_id=start + 1)
    second = await world.run(batch_id, start + 1)
    await world.store.hold_jobs(batch_id, "alice")
    for job_id, attempt in ((start, first), (start + 1, second)):
        await world.finish(batch_id, job_id, attempt, "Success")
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await world.db.fetchone("SELECT 1 FROM jobs_held WHERE batch_id = %s", (batch_id,)) is None
    # The batch's own hold stays: a later update's jobs are held.
    assert await world.db.fetchone("SELECT 1 FROM job_groups_held WHERE batch_id = %s", (batch_id,)) is not None
    assert await check_invariants(world.db) == []


async def test_holds_go_with_their_batch(world: World) -> None:
    batch_id, _, start = await world.batch([{}, {}], groups=GROUPS)
    await world.store.hold_jobs(batch_id, "alice", job_group_id=2)
    await world.store.hold_jobs(batch_id, "alice", job_id=start)
    await world.db.execute("DELETE FROM batches WHERE batch_id = %s", (batch_id,))
    assert await world.db.fetchone("SELECT 1 FROM job_groups_held WHERE batch_id = %s", (batch_id,)) is None
    assert await world.db.fetchone("SELECT 1 FROM jobs_held WHERE batch_id = %s", (batch_id,)) is None
