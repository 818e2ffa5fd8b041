"""fair-share: how long the scheduler takes to compute fair shares from live counters.

The database holds 100 users × 50 running batches × 3 pools (highcpu,
standard, highmem): every batch has, in each pool, one Running job and
one Ready job, built through the real procedures (`insert_jobs`,
`commit_update`, then `schedule_jobs` onto one active instance per pool),
so the trigger-maintained, tokenized counters are what the driver would
read. Users differ in job size (250 to 2,000 mcpu), and each pool's free
cores are half its ready demand, so the water-filling has work to do.

One computation is what the scheduler does per cycle: one read of the
`user_inst_coll_fair_share` view for every pool (`DriverStore.read_demand`,
the scheduler's own), then, for each of the three pools, `allocate_cores` and
`scheduling_shares` (services/policy/fair_share.py) over its users. It
is repeated; figures are p50/p99 of the whole (3 pools, query +
computation) and of each part.

`cycle` is the scheduler's whole decision for the three pools, everything
but SJ and the Run commands: the demand, the workers, each pool's snapshot
(`services/db/plan_snapshot.py`: the users' queues of every pool as deep
as the planner looks, in one call of `read_ready_heads`; then per pool the locks running
jobs hold that its candidates may meet and the billing project's budget)
and `planner.plan`. `cycle_reused` is the same cycle reusing a fair-share
read, as the driver's scheduler does for the cycles in the second after a
read (`DEMAND_REUSE_S`, design §3): everything but the demand query. The
two series are interleaved. Half the users' jobs,
Ready and Running, declare an exclusive lock on one of 20 names, so the
lock reads and checks are part of it.

`--deep-queue N` gives the first user one more running batch of N Ready
jobs, as a scientist's million-job batch would: the scheduler reads only
the head of each queue, so a cycle should cost what it costs without it.

`--held-deep-queue N` gives the first user one more running batch of N
Ready jobs at a higher priority, so at the head of their queue, and holds
it (HoldJobs of the batch): the walk of read_ready_heads steps over every
held job each cycle (docs/known-limits.md), which this measures.

`--limit-usd USD` gives the users' billing project a spending limit, so
every candidate is priced at its worst case (read_ready_heads) and its
project's budget is read and checked; make it large enough that nothing
waits for it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from typing import Any

from bench.common import BenchContext, fresh_database, percentile, positive_int, progress
from bench.populate import JobShape, ready_batch
from services.db.database import Database
from services.db.store import JobStore
from services.driver.store import DriverStore  # the scheduler's own reads
from services.policy.fair_share import UserDemand, allocate_cores, scheduling_shares
from services.policy import planner

NAME = "fair-share"
HELP = "fair-share query and computation with 100 users x 50 running batches x 3 pools"

POOLS = ("highcpu", "standard", "highmem")
USERS, BATCHES_PER_USER, REPETITIONS = 100, 50, 200
SMOKE_USERS, SMOKE_BATCHES_PER_USER, SMOKE_REPETITIONS = 4, 3, 5
WARM_UP = 3
JOBS_PER_CYCLE = 300
"""The scheduler's default jobs per cycle (Scheduler.jobs_per_cycle)."""
PARALLEL_BATCHES = 8
"""Batches built at once (each on its own connection, so the counters get several tokens)."""
SJ_CHUNK = 500
TARGET_MS = 50.0


@dataclasses.dataclass(frozen=True)
class Sample:
    """One computation over the three pools."""

    query_ms: float
    compute_ms: float

    @property
    def total_ms(self) -> float:
        return self.query_ms + self.compute_ms



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--users", type=positive_int, metavar="N", help=f"users (default {USERS})")
    parser.add_argument("--batches-per-user", type=positive_int, metavar="N",
                        help=f"running batches per user (default {BATCHES_PER_USER})")
    parser.add_argument("--repetitions", type=positive_int, metavar="N",
                        help=f"computations timed (default {REPETITIONS})")
    parser.add_argument("--deep-queue", type=positive_int, metavar="N",
                        help="also give the first user one more running batch of N Ready jobs (over the three pools): "
                             "a cycle should not cost more for it")
    parser.add_argument("--held-deep-queue", type=positive_int, metavar="N",
                        help="also give the first user one more running batch of N Ready jobs at the head of their "
                             "queue (a higher priority), held: the queue's walk passes over them every cycle")
    parser.add_argument("--limit-usd", type=float, metavar="USD",
                        help="the billing project's spending limit (default none): candidates are then priced and "
                             "budgets checked")


def figure_names() -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.{part}.{q}" for part in ("total", "query", "compute", "cycle", "cycle_reused")
            for q in ("p50", "p99")]


def job_cores_mcpu(user_index: int) -> int:
    """Users differ in job size, so their running levels differ."""
    return 250 * (1 + user_index % 8)


async def build(db: Database, n_users: int, n_batches: int, limit_usd: float | None = None) -> dict[str, int]:
    """The live counters; returns each pool's free cores (mcpu)."""
    store = JobStore(db)
    users = [f"user{i:03d}" for i in range(n_users)]
    await store.create_billing_project("bench", users, limit_usd=limit_usd)
    epoch = await store.elect_leader("bench-driver")
    # Each pool's instance fits every Running job plus half the Ready ones.
    per_pool_mcpu = sum(job_cores_mcpu(i) for i in range(n_users)) * n_batches
    for pool in POOLS:
        await store.create_instance(epoch, f"bench-{pool}", pool, per_pool_mcpu + per_pool_mcpu // 2, f"t-{pool}")
        await store.activate_instance(epoch, f"bench-{pool}", f"t-{pool}")

    limit = asyncio.Semaphore(PARALLEL_BATCHES)
    to_run: dict[str, list[dict[str, Any]]] = {pool: [] for pool in POOLS}
    done = 0

    async def one(user_index: int) -> None:
        nonlocal done
        shapes = tuple(JobShape(pool, job_cores_mcpu(user_index)) for pool in POOLS)
        async with limit:
            batch = await ready_batch(store, users[user_index], "bench", 2 * len(POOLS), shapes, quiet=True)
        # The first job of each pool runs; the second stays Ready.
        for pool, job_id in zip(POOLS, batch.job_ids):
            to_run[pool].append({"batch_id": batch.batch_id, "job_id": job_id, "attempt_id": f"{job_id}-1"})
        done += 1
        if done % 500 == 0:
            progress(f"  {done:,} of {n_users * n_batches:,} batches")

    await asyncio.gather(*(one(u) for _ in range(n_batches) for u in range(n_users)))
    # Half the users' jobs hold or want an exclusive lock on one of 20 names (declared before the first
    # ones start, so that schedule_jobs counts what they hold in held_locks, as for any job).
    await db.execute(
        "INSERT INTO job_locks (batch_id, job_id, level, mode, lock_name) "
        "SELECT j.batch_id, j.job_id, 'dataset', 'exclusive', CONCAT('d', j.job_id %% 20) FROM jobs j "
        "JOIN batches b ON b.batch_id = j.batch_id WHERE CAST(SUBSTRING(b.user, 5) AS UNSIGNED) %% 2 = 0")
    for pool, jobs in to_run.items():
        for first in range(0, len(jobs), SJ_CHUNK):
            outcomes = await store.schedule_jobs(epoch, f"bench-{pool}", jobs[first:first + SJ_CHUNK])
            if any(o["outcome"] != "scheduled" for o in outcomes):
                raise RuntimeError(f"schedule_jobs refused: {outcomes}")
    rows = await db.fetchall("SELECT inst_coll, free_cores_mcpu FROM instances WHERE state = 'active'")
    return {row["inst_coll"]: int(row["free_cores_mcpu"]) for row in rows}


async def verify(db: Database, n_users: int, n_batches: int) -> None:
    """Every user has n_batches Running and n_batches Ready jobs in every pool."""
    for pool in POOLS:
        rows = await db.fetchall("SELECT * FROM user_inst_coll_fair_share WHERE inst_coll = %s", (pool,))
        counts = {(int(r["n_running_jobs"]), int(r["n_ready_jobs"])) for r in rows}
        if len(rows) != n_users or counts != {(n_batches, n_batches)}:
            raise RuntimeError(f"{pool}: unexpected live counters: {len(rows)} users, {counts}")


async def compute(store: DriverStore, free_mcpu: dict[str, int]) -> tuple[Sample, dict[str, dict[str, int]]]:
    """One computation, as the scheduler does it each cycle: one read of the
    demand of every pool, then each pool's allocation; returns its timing and
    the shares."""
    started = time.perf_counter()
    demand = await store.read_demand()
    queried = time.perf_counter()
    shares = {}
    for pool in POOLS:
        demands = demand.get(pool, [])
        allocation = allocate_cores(free_mcpu.get(pool, 0), demands)
        shares[pool] = scheduling_shares(allocation, demands, total_jobs=JOBS_PER_CYCLE)
    computed = time.perf_counter()
    return Sample((queried - started) * 1000, (computed - queried) * 1000), shares


async def cycle(store: DriverStore, demand: dict[str, list[UserDemand]] | None = None) -> tuple[float, int]:
    """The scheduler's decision for every pool, as `Scheduler.cycle` makes it (all workers live); returns
    its milliseconds and the placements. With `demand`, the cycle reuses that fair-share read, as the
    driver's scheduler does for DEMAND_REUSE_S after a read."""
    started = time.perf_counter()
    workers = {pool: [w for w in ws if w.free_cores_mcpu > 0] for pool, ws in (await store.read_workers()).items()}
    if demand is None:
        demand = await store.read_demand()
    looks = {pool: planner.depths(ws, demand[pool], JOBS_PER_CYCLE) for pool, ws in workers.items()
             if demand.get(pool)}
    queues = await store.read_queues(looks)
    placed = 0
    for pool in sorted(queues):
        snapshot = await store.snapshot_of(pool, workers[pool], demand[pool], queues[pool], JOBS_PER_CYCLE,
                                           time.time())
        placed += len(planner.plan(snapshot).placements)
    return (time.perf_counter() - started) * 1000, placed


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_users = args.users or (SMOKE_USERS if ctx.smoke else USERS)
    n_batches = args.batches_per_user or (SMOKE_BATCHES_PER_USER if ctx.smoke else BATCHES_PER_USER)
    repetitions = args.repetitions or (SMOKE_REPETITIONS if ctx.smoke else REPETITIONS)
    async with fresh_database(ctx.server, pool_size=PARALLEL_BATCHES) as db:
        progress(f"{NAME}: building {n_users} users x {n_batches} running batches x {len(POOLS)} pools")
        started = time.perf_counter()
        free_mcpu = await build(db, n_users, n_batches, args.limit_usd)
        await verify(db, n_users, n_batches)
        if args.deep_queue:
            shapes = tuple(JobShape(pool, job_cores_mcpu(0)) for pool in POOLS)
            await ready_batch(JobStore(db), "user000", "bench", args.deep_queue, shapes)
        if args.held_deep_queue:
            shapes = tuple(JobShape(pool, job_cores_mcpu(0), priority=1) for pool in POOLS)
            held = await ready_batch(JobStore(db), "user000", "bench", args.held_deep_queue, shapes)
            await JobStore(db).hold_jobs(held.batch_id, "user000")
        progress(f"{NAME}: built in {time.perf_counter() - started:.0f} s; {repetitions} computations")
        store = DriverStore(db)
        for _ in range(WARM_UP):
            await compute(store, free_mcpu)
        samples = []
        for _ in range(repetitions):
            sample, shares = await compute(store, free_mcpu)
            samples.append(sample)
        for pool, by_user in shares.items():
            if sum(by_user.values()) != JOBS_PER_CYCLE or len(by_user) != n_users:
                raise RuntimeError(f"{pool}: shares do not add up: {by_user}")
        cycles, reused = [], []
        demand = await store.read_demand()
        for _ in range(WARM_UP + repetitions):
            for series, given in ((cycles, None), (reused, demand)):
                ms, placed = await cycle(store, given)
                series.append(ms)
                if placed == 0:
                    raise RuntimeError("the planner placed nothing: the benchmark's pools are not what it means")
        cycles, reused = cycles[WARM_UP:], reused[WARM_UP:]

    for part in ("total", "query", "compute"):
        values = [getattr(s, f"{part}_ms") for s in samples]
        ctx.figures.add(f"{NAME}.{part}.p50", round(percentile(values, 50), 2), "ms")
        ctx.figures.add(f"{NAME}.{part}.p99", round(percentile(values, 99), 2), "ms")
    ctx.figures.add(f"{NAME}.cycle.p50", round(percentile(cycles, 50), 2), "ms")
    ctx.figures.add(f"{NAME}.cycle.p99", round(percentile(cycles, 99), 2), "ms")
    ctx.figures.add(f"{NAME}.cycle_reused.p50", round(percentile(reused, 50), 2), "ms")
    ctx.figures.add(f"{NAME}.cycle_reused.p99", round(percentile(reused, 99), 2), "ms")
    return {
        "users": n_users,
        "running_batches_per_user": n_batches,
        "pools": list(POOLS),
        "jobs_per_batch_per_pool": {"Running": 1, "Ready": 1},
        "free_cores_mcpu": free_mcpu,
        "repetitions": repetitions,
        "deep_queue_jobs": args.deep_queue or 0,
        "held_deep_queue_jobs": args.held_deep_queue or 0,
        "limit_usd": args.limit_usd,
        "jobs_per_cycle": JOBS_PER_CYCLE,
        "target_ms": TARGET_MS,
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
    }
