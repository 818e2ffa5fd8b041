"""The scheduler's demand read (`plan_snapshot.read_demand`) says what the view user_inst_coll_fair_share
says, on data with every case the view handles: several users and pools, Ready and running jobs, nested job
groups cancelled (masking cancellable demand, not always-run demand), a cancelled batch, a completed batch,
a user with more running batches than the bound (demand from the first 50 alone), and holds (migration 0029:
groups and batches held, some cancelled too, and jobs held one by one, in held groups or not, always-run or
not, before and past the bound)."""

from __future__ import annotations

import random

from services.db.plan_snapshot import DEMAND_BATCHES, read_demand
from services.policy.fair_share import UserDemand
from tests.world import World

POOLS = ("standard", "highmem")


async def view_demand(world: World) -> dict[str, list[UserDemand]]:
    by_pool: dict[str, list[UserDemand]] = {}
    for r in await world.db.fetchall("SELECT * FROM user_inst_coll_fair_share ORDER BY user, inst_coll"):
        if int(r["ready_cores_mcpu"]) > 0 or int(r["n_ready_jobs"]) > 0:
            by_pool.setdefault(r["inst_coll"], []).append(
                UserDemand(r["user"], int(r["running_cores_mcpu"]), int(r["ready_cores_mcpu"])))
    return by_pool


async def test_the_demand_read_is_the_views(world: World) -> None:
    rng = random.Random(7)
    await world.db.execute("INSERT INTO billing_project_members (billing_project, user) VALUES ('proj', 'dora')")
    await world.instance("i1", cores_mcpu=10**9)
    await world.instance("i2", cores_mcpu=10**9, inst_coll="highmem")
    instance = {"standard": "i1", "highmem": "i2"}

    async def batch(user: str, n_jobs: int, cancel: str | None = None, hold: str | None = None) -> int:
        groups = [{"job_group_id": 1, "parent_id": 0}, {"job_group_id": 2, "parent_id": 1},
                  {"job_group_id": 3, "parent_id": 0}]
        jobs = [{"inst_coll": rng.choice(POOLS), "cores_mcpu": rng.choice((250, 500, 1000, 2000)),
                 "always_run": rng.random() < 0.2, "job_group_id": rng.choice((0, 1, 2, 3))} for _ in range(n_jobs)]
        batch_id, _, start = await world.batch(jobs, user=user, groups=groups)
        for i, job in enumerate(jobs):  # some run
            if rng.random() < 0.3:
                await world.run(batch_id, start + i, instance[job["inst_coll"]])
        if cancel == "group":
            await world.store.cancel_job_group(batch_id, 1, user, "test")  # and its subgroup 2
        elif cancel == "batch":
            await world.store.cancel_job_group(batch_id, 0, user, "test")
        if hold == "group":
            await world.store.hold_jobs(batch_id, user, job_group_id=rng.choice((1, 3)))
        elif hold == "batch":
            await world.store.hold_jobs(batch_id, user)
        if hold is not None:  # and some jobs one by one, whatever their group
            for job_id in rng.sample(range(start, start + n_jobs), k=min(n_jobs, 3)):
                await world.store.hold_jobs(batch_id, user, job_id=job_id)
        return batch_id

    for i in range(6):
        await batch("alice", 8, cancel=("group", "batch", None)[i % 3], hold=("group", None, "jobs", "batch")[i % 4])
        await batch("bob", 5, cancel=None if i % 2 else "group", hold=("jobs", None, "group")[i % 3])
    # A completed batch: its jobs ran and ended.
    done, _, first = await world.batch([{}, {}], user="bob")
    for job_id in (first, first + 1):
        attempt = await world.run(done, job_id)
        await world.finish(done, job_id, attempt, "Success")
    assert (await world.batch_row(done))["state"] == "complete"
    # A user past the bound: 60 running batches, some cancelled.
    for i in range(DEMAND_BATCHES + 10):
        await batch("dora", 2, cancel="group" if i % 7 == 0 else None, hold=("jobs", None, "group", None, "batch")[i % 5])

    expected = await view_demand(world)
    assert {d.user for ds in expected.values() for d in ds} >= {"alice", "bob", "dora"}
    assert await read_demand(world.db) == expected

    # And after the cancellers drain some of the cancelled jobs.
    await world.drain(done)
    for row in await world.db.fetchall("SELECT batch_id FROM batches WHERE state = 'running' LIMIT 5"):
        await world.drain(row["batch_id"])
    assert await read_demand(world.db) == await view_demand(world)
