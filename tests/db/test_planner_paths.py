"""The scheduler and ExplainJob ask the planner the same question, on a real
MariaDB: for every Ready job, ExplainJob's reason is the reason the
scheduler's plan gives (or none, when the scheduler places it), and then
the scheduler places exactly what its plan said. Locks, two users, two
billing projects, a project at its limit, regions, memory, scratch storage
and a deep queue are all in play."""

from __future__ import annotations

import random

from services.db.database import Database
from services.db.plan_snapshot import read_demand, read_snapshot, read_workers
from services.driver.scheduler import Placement, Scheduler
from services.frontend.explain_store import ExplainStore
from services.policy import planner
from tests.world import World


class Recorder:
    """A dispatcher whose every active instance is live; it records the Run commands."""

    def __init__(self, db: Database):
        self.db = db
        self.live: set[str] = set()
        self.sent: list[Placement] = []

    def live_instances(self) -> set[str]:
        return self.live

    def images_held(self) -> dict[str, frozenset[str]]:
        return {}

    async def run(self, placements: list[Placement]) -> None:
        self.sent += placements


def lock(mode: str, name: str = "", level: str = "db") -> dict[str, str]:
    return {"level": level, "mode": mode, "name": name}


async def test_explain_and_the_scheduler_decide_alike(world: World) -> None:
    rng = random.Random(11)
    # The pool's machine holds the largest job here, so a job without room waits rather than never runs
    # (services.policy.runnable, which ExplainJob asks first): the instances below are smaller.
    await world.db.execute("UPDATE instance_collections SET worker_cores = 8, worker_memory_bytes = %s, "
                           "worker_storage_bytes = %s WHERE name = 'standard'", (64 << 30, 64 << 30))
    for name, cores in (("i1", 4000), ("i2", 2000), ("i3", 1000)):
        await world.instance(name, cores_mcpu=cores)
    await world.db.execute("UPDATE instances SET memory_bytes = %s WHERE name = 'i2'", (2 << 30,))
    await world.db.execute("UPDATE instances SET storage_bytes = %s WHERE name = 'i1'", (8 << 30,))
    await world.store.create_billing_project("tight", ["alice", "bob"])
    modes = [[], [lock("exclusive", "x")], [lock("shared", "x")], [lock("exclusive", "y")],
             [lock("all_exclusive", level="*")]]
    for user in ("alice", "bob"):
        jobs = [{"cores_mcpu": rng.choice([250, 500, 1000, 2000, 4000, 8000]),
                 "memory_bytes": rng.choice([0, 0, 1 << 30, 3 << 30]), "priority": rng.choice([0, 0, 1]),
                 "locks": rng.choice(modes), "storage_bytes": rng.choice([0, 3 << 30, 6 << 30])} for _ in range(40)]
        await world.batch(jobs, user=user)
    # bob also has a batch in the project at its limit
    created = await world.store.create_batch("bob", "tight")
    update = await world.store.create_update(int(created["batch_id"]), 2)
    await world.store.insert_jobs(int(created["batch_id"]), update["update_id"], [
        {"job_id": int(update["start_job_id"]) + i, "cores_mcpu": 250, "inst_coll": "standard", "job_group_id": 0}
        for i in range(2)])
    await world.store.commit_update(int(created["batch_id"]), update["update_id"])
    await world.db.execute("UPDATE billing_projects SET limit_usd = 0 WHERE name = 'tight'")  # then spent out
    # Something running holds db/x exclusively.
    held_batch, _, held_job = await world.batch([{"cores_mcpu": 250, "locks": [lock("exclusive", "x")]}])
    await world.run(held_batch, held_job, "i3")

    now_ms = world.clock()
    pool = "standard"
    workers = [w for w in (await read_workers(world.db, pool))[pool] if w.free_cores_mcpu > 0]
    snapshot = await read_snapshot(world.db, pool, workers, (await read_demand(world.db))[pool],
                                   planner.JOBS_PER_CYCLE, now_ms / 1000)
    plan = planner.plan(snapshot)
    codes = {w.code for w in plan.waits.values()}
    assert plan.placements and {planner.BLOCKED_BY_LOCK, planner.BILLING_LIMIT_REACHED} <= codes, codes

    explain = ExplainStore(world.db, clock_ms=lambda: now_ms)
    ready = await world.db.fetchall(
        "SELECT j.*, b.user, b.billing_project FROM jobs j JOIN batches b USING (batch_id) WHERE j.state = 'Ready'")
    placed = {p.key for p in plan.placements}
    for job in ready:
        locks = await world.db.fetchall("SELECT level, mode, lock_name FROM job_locks WHERE batch_id = %s AND "
                                        "job_id = %s", (job["batch_id"], job["job_id"]))
        scheduling = await explain.scheduling(job, locks)
        key = (job["batch_id"], job["job_id"])
        if key in placed:
            assert scheduling.wait is None, (key, scheduling)
        else:
            expected = plan.waits.get(key)
            code = expected.code if expected is not None else planner.QUEUED_BEHIND_OWN_JOBS
            assert scheduling.wait is not None and scheduling.wait.code == code, (key, scheduling, expected)
            if code == planner.BLOCKED_BY_LOCK:  # the counted holders, named: the job holding db/x
                named = [h if isinstance(h, tuple) else (held_batch, held_job) for h in expected.holders]
                assert scheduling.lock is not None and list(scheduling.lock.holders) == list(dict.fromkeys(named))
                assert f"job {held_batch}/{held_job}" in scheduling.wait.detail or named != [(held_batch, held_job)]

    # The scheduler, in its cycle, places exactly what the plan said.
    recorder = Recorder(world.db)
    recorder.live = {"i1", "i2", "i3"}
    scheduler = Scheduler(world.store, recorder, lambda: world.epoch, clock_ms=lambda: now_ms)
    await scheduler.cycle()
    assert {(p.batch_id, p.job_id, p.instance) for p in recorder.sent} == {
        (p.key[0], p.key[1], p.worker) for p in plan.placements}


async def test_the_snapshot_reads_free_storage_as_it_reads_free_memory(world: World) -> None:
    """An instance's storage less its open attempts' jobs' storage is free; an instance that did not say
    (0) is not checked; the scheduler places nothing where the storage is not free and says so."""
    gib = 1 << 30
    await world.store.create_instance(world.epoch, "i1", "standard", 8000, "tok-i1", memory_bytes=8 * gib,
                                      storage_bytes=16 * gib)
    await world.store.activate_instance(world.epoch, "i1", "tok-i1")
    await world.instance("i2")  # says nothing of its memory or storage
    running, _, first = await world.batch([{"memory_bytes": 2 * gib, "storage_bytes": 5 * gib},
                                           {"memory_bytes": 1 * gib, "storage_bytes": 4 * gib}, {}])
    await world.run(running, first, "i1")
    ended = await world.run(running, first + 1, "i1")
    await world.finish(running, first + 1, ended, "Success")  # ended: it holds nothing any more
    await world.run(running, first + 2, "i2")
    workers = {w.name: w for w in (await read_workers(world.db, "standard"))["standard"]}
    assert (workers["i1"].free_memory_bytes, workers["i1"].free_storage_bytes) == (6 * gib, 11 * gib)
    assert (workers["i2"].free_memory_bytes, workers["i2"].free_storage_bytes) == (None, None)

    batch_id, _, job_id = await world.batch([{"storage_bytes": 12 * gib}])
    await world.db.execute("UPDATE instances SET state = 'inactive' WHERE name = 'i2'")
    recorder = Recorder(world.db)
    recorder.live = {"i1"}
    await Scheduler(world.store, recorder, lambda: world.epoch, clock_ms=world.clock).cycle()
    assert recorder.sent == [] and await world.state(batch_id, job_id) == "Ready"
    scheduling = await ExplainStore(world.db, clock_ms=world.clock).scheduling(
        {**await world.job(batch_id, job_id), "user": "alice", "billing_project": "proj"}, [])
    assert scheduling.wait is not None and scheduling.wait.code == planner.NO_CAPACITY_IN_REGIONS
    assert "12 GiB of scratch storage" in scheduling.wait.detail
