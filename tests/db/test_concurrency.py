"""32 connections drive the full lifecycle of one batch's jobs at once.

Each of 32 tasks takes a few jobs at a time and runs SJ, MJS, attempt
resources, a heartbeat rollup and MJC for them, in bulk, on one of 8
instances. Afterwards the batch must have completed exactly once and every
counter must equal what the base tables say. Deadlocks and lock-wait
timeouts are retried by the data layer; the test prints how many there
were (the goal is zero).
"""

from __future__ import annotations

import asyncio
import random

from services.db.invariants import check_invariants
from tests.world import World, job_spec

N_JOBS = 2000
N_CONNECTIONS = 32
N_INSTANCES = 8


async def test_full_lifecycle_on_32_connections(world: World) -> None:
    for i in range(N_INSTANCES):
        await world.instance(f"i{i}", cores_mcpu=1_000_000)
    created = await world.store.create_batch("alice", "proj")
    batch_id = created["batch_id"]
    update = await world.store.create_update(batch_id, N_JOBS)
    u, s = update["update_id"], update["start_job_id"]
    for first in range(0, N_JOBS, 500):
        await world.store.insert_jobs(batch_id, u, [job_spec(s + i) for i in range(first, first + 500)])
    await world.store.commit_update(batch_id, u)

    todo = list(range(s, s + N_JOBS))
    random.Random(7).shuffle(todo)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for job_id in todo:
        queue.put_nowait(job_id)
    epoch, store, now = world.epoch, world.store, world.clock()

    async def worker(index: int) -> None:
        rng = random.Random(index)
        instance = f"i{index % N_INSTANCES}"
        while not queue.empty():
            chunk = [queue.get_nowait() for _ in range(min(rng.randint(1, 5), queue.qsize()))]
            attempts = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"w{index}-{j}"} for j in chunk]
            scheduled = await store.schedule_jobs(epoch, instance, attempts)
            assert {r["outcome"] for r in scheduled} == {"scheduled"}
            await store.mark_jobs_started(epoch, instance, [{**a, "start_time_ms": now} for a in attempts])
            await store.add_attempt_resources(epoch, [
                {**a, "resource": resource, "quantity": quantity}
                for a in attempts for resource, quantity in (("cpu/local/1", 1000), ("memory/local/1", 512))])
            await store.heartbeat_rollup(epoch, instance, [{**a, "rollup_time_ms": now + 500} for a in attempts])
            outcomes = await store.mark_jobs_complete(epoch, instance, [
                {**a, "state": "Success" if a["job_id"] % 10 else "Failed", "exit_code": 0 if a["job_id"] % 10 else 1,
                 "start_time_ms": now, "end_time_ms": now + 1000} for a in attempts])
            # 'already_complete' only if the data layer retried a call whose
            # first try had committed (and failed in its completion check).
            assert {r["outcome"] for r in outcomes} <= {"completed", "already_complete"}

    await asyncio.gather(*(worker(i) for i in range(N_CONNECTIONS)))

    print(f"\ndeadlock/lock-wait retries over {N_JOBS} jobs on {N_CONNECTIONS} connections: "
          f"{world.db.retry_stats.retries} {world.db.retry_stats.by_errno}")
    completions = await world.db.fetchall("SELECT * FROM batch_completions WHERE batch_id = %s", (batch_id,))
    assert len(completions) == 1
    batch = await world.batch_row(batch_id)
    assert (batch["state"], batch["n_jobs"]) == ("complete", N_JOBS)
    counts = await world.db.fetchone(
        """SELECT SUM(n_completed) c, SUM(n_succeeded) s, SUM(n_failed) f
           FROM job_groups_n_jobs_in_complete_states WHERE batch_id = %s AND job_group_id = 0""", (batch_id,))
    assert (int(counts["c"]), int(counts["s"]), int(counts["f"])) == (N_JOBS, N_JOBS - N_JOBS // 10, N_JOBS // 10)
    free = await world.db.fetchall("SELECT free_cores_mcpu FROM instances")
    assert {row["free_cores_mcpu"] for row in free} == {1_000_000}
    assert await check_invariants(world.db) == []
