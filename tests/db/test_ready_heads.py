"""The heads of the users' queues (read_ready_heads, through plan_snapshot.read_queues) against a model: on
random batches with nested groups, some cancelled, priorities, jobs that always run, jobs a parent failed and
jobs already running, and (in one run) holds of groups, batches and single jobs, each user's head in each pool is exactly the first `depth` Ready jobs that may run, in
queue order, as a plain Python reading of every job decides it, each with the locks it declares."""

from __future__ import annotations

import random

import pytest

from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_queues
from services.policy.lock_contention import locks_from_rows
from tests.world import World

POOLS = ("standard", "highmem")
LOCKS = ([], [], [{"level": "db", "mode": "exclusive", "name": "x"}],
         [{"level": "db", "mode": "shared", "name": "x"}, {"level": "db", "mode": "shared", "name": "it's \"y\""},
          {"level": "table", "mode": "all_shared", "name": ""}])
USERS = ("alice", "bob")


async def _build(world: World, rng: random.Random, holds: bool = False) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    for _ in range(6):
        user = rng.choice(USERS)
        groups = []
        for g in range(1, 5):
            groups.append({"job_group_id": g, "parent_id": rng.randrange(g)})
        jobs = [{"job_group_id": rng.randrange(5), "priority": rng.choice([0, 0, 1, 2]),
                 "always_run": rng.random() < 0.2, "inst_coll": rng.choice(POOLS), "cores_mcpu": 250,
                 "locks": rng.choice(LOCKS)}
                for _ in range(rng.randrange(5, 30))]
        batch_id, _, start = await world.batch(jobs, user=user, groups=groups)
        # Some jobs leave Ready, some groups (or the whole batch) are cancelled and not drained.
        for i, job in enumerate(jobs):
            if job["inst_coll"] == "standard" and rng.random() < 0.15:
                await world.run(batch_id, start + i)
        for g in rng.sample(range(5), rng.choice([0, 0, 1, 2])):
            await world.store.cancel_job_group(batch_id, g, user, "test")
        if holds:  # some groups (0: the batch) and some jobs held, some of those released again
            for g in rng.sample(range(5), rng.choice([0, 1, 2])):
                await world.store.hold_jobs(batch_id, user, job_group_id=g)
                if rng.random() < 0.25:
                    await world.store.release_jobs(batch_id, job_group_id=g)
            for job_id in rng.sample(range(start, start + len(jobs)), rng.choice([0, 1, 3])):
                await world.store.hold_jobs(batch_id, user, job_id=job_id)
                if rng.random() < 0.25:
                    await world.store.release_jobs(batch_id, job_id=job_id)


async def _model(world: World, looks: dict[str, dict[str, int]]) -> dict[str, dict[str, list[tuple[int, int]]]]:
    jobs = await world.db.fetchall(
        "SELECT j.batch_id, j.job_id, j.job_group_id, j.state, j.inst_coll, j.priority, j.always_run, "
        "j.dependency_failed, b.user FROM jobs j JOIN batches b ON b.batch_id = j.batch_id")
    cancelled = {(r["batch_id"], r["job_group_id"]) for r in await world.db.fetchall(
        "SELECT a.batch_id, a.job_group_id FROM job_groups_cancelled c "
        "JOIN job_group_self_and_ancestors a ON a.batch_id = c.batch_id AND a.ancestor_id = c.job_group_id")}
    held_groups = {(r["batch_id"], r["job_group_id"]) for r in await world.db.fetchall(
        "SELECT a.batch_id, a.job_group_id FROM job_groups_held h "
        "JOIN job_group_self_and_ancestors a ON a.batch_id = h.batch_id AND a.ancestor_id = h.job_group_id")}
    held_jobs = {(r["batch_id"], r["job_id"]) for r in await world.db.fetchall("SELECT * FROM jobs_held")}

    def may_run(j: dict) -> bool:
        if (j["batch_id"], j["job_group_id"]) in held_groups or (j["batch_id"], j["job_id"]) in held_jobs:
            return False
        return bool(j["always_run"]) or (not j["dependency_failed"]
                                         and (j["batch_id"], j["job_group_id"]) not in cancelled)

    ordered = sorted((j for j in jobs if j["state"] == "Ready" and may_run(j)),
                     key=lambda j: (-j["priority"], j["batch_id"], j["job_id"]))
    return {pool: {user: [(j["batch_id"], j["job_id"]) for j in ordered
                          if j["inst_coll"] == pool and j["user"] == user][:depth]
                   for user, depth in users.items()}
            for pool, users in looks.items()}


@pytest.mark.parametrize("holds", [False, True], ids=["nothing-held", "holds"])
async def test_each_head_is_the_first_jobs_that_may_run_in_queue_order(world: World, holds: bool) -> None:
    rng = random.Random(19)
    await _build(world, rng, holds)
    # A parent that failed its child, as the releaser leaves it until the canceller drains it.
    ready = await world.db.fetchall("SELECT batch_id, job_id FROM jobs WHERE state = 'Ready' AND NOT always_run")
    for r in rng.sample(ready, 4):
        await world.db.execute("UPDATE jobs SET dependency_failed = TRUE WHERE batch_id = %s AND job_id = %s",
                               (r["batch_id"], r["job_id"]))
    for _ in range(25):
        looks = {pool: {user: rng.randrange(0, 14) for user in (*USERS, "carol")} for pool in POOLS}
        queues = await read_queues(world.db, looks)
        got = {pool: {user: [c.key for c in queue] for user, queue in users.items()}
               for pool, users in queues.items()}
        assert got == await _model(world, looks), looks
    # Each candidate carries its own locks, as its job_locks rows say.
    declared: dict[tuple[int, int], list[tuple[str, str, str]]] = {}
    for r in await world.db.fetchall("SELECT batch_id, job_id, level, mode, lock_name FROM job_locks"):
        declared.setdefault((r["batch_id"], r["job_id"]), []).append((r["level"], r["mode"], r["lock_name"]))
    candidates = [c for users in queues.values() for queue in users.values() for c in queue]
    assert any(c.locks for c in candidates) and any(not c.locks for c in candidates)
    for c in candidates:
        assert c.locks == locks_from_rows(declared.get(c.key, [])), c.key


async def test_a_users_head_skips_an_undrained_cancelled_batch_ahead_of_it(world: World) -> None:
    await world.instance("i1", cores_mcpu=100_000)
    first, _, _ = await world.batch([{} for _ in range(50)])
    second, _, s = await world.batch([{} for _ in range(3)])
    await world.store.cancel_job_group(first, 0, "alice", "not wanted")
    queues = await read_queues(world.db, {"standard": {"alice": 2}})
    assert [c.key for c in queues["standard"]["alice"]] == [(second, s), (second, s + 1)]
    assert await check_invariants(world.db) == []
