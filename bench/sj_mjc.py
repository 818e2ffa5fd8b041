"""sj-mjc: how many jobs per second the database moves through their lifecycle.

N no-op jobs of one committed batch go through the stored procedures
exactly as the driver calls them for its workers (`JobStore`), for every
combination of jobs per call and connections, in two modes:

  sj+mjc  schedule_jobs, then mark_jobs_complete;
  full    schedule_jobs, mark_jobs_started (recording each attempt's
          resources, its instance's products at their current prices, as
          the driver does),
          mark_jobs_complete: the billing triggers fire on completion.

Each run gets a fresh schema, N Ready jobs (inserted in bunches of 5,000
and committed), 8 active instances large enough that capacity never
limits, and warm connections; only the lifecycle calls are timed. Each of
C connections takes the next K consecutive jobs and runs the calls for
them; every job reports having run for one second. Figures: jobs/s,
deadlock/lock-wait retries, and per job the statements the server ran
(its `Queries`: each call and every statement inside the procedures and
triggers) and the server's own CPU (from /proc; 0 when its pid cannot be
read), per run; the best rate of each mode, and the most retries of a
full-mode run on 32 connections. Unlike jobs/s, the statements do not
move with the machine's load. With `--limit-usd` the billing project has a
spending limit, so schedule_jobs reserves each job's worst case (its
budgeted path).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import itertools
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext, database_statements, fresh_database, positive_int, progress
from bench.cpu import own_cpu_s
from services.db.database import Database, RetryStats
from services.db.server import server_pid
from services.db.store import JobStore

NAME = "sj-mjc"
HELP = "schedule and complete no-op jobs through the stored procedures (database level)"

MODES = ("sj+mjc", "full")
JOBS_PER_CALL = (1, 10, 50)
CONNECTIONS = (1, 8, 32)
DEFAULT_JOBS = 20_000
SMOKE_JOBS_PER_CALL = (1, 50)
SMOKE_CONNECTIONS = (1, 32)
SMOKE_JOBS = 200

N_INSTANCES = 8
INSTANCE_CORES_MCPU = 10_000_000
JOB_CORES_MCPU = 1000
INSERT_BUNCH = 5000
JOB_DURATION_MS = 1000
JOB_MEMORY_BYTES = 512 * 2**20

TARGETS_JOBS_PER_S = {"sj+mjc": 5000, "full": 3000}
"""Issue 4's targets at the best concurrency, drawn on the plot."""
SEED_JOBS_PER_S = {"sj+mjc": 414, "full": 154}
"""The seed system on the reference machine (2 cores), for scale."""


@dataclasses.dataclass(frozen=True)
class Combination:
    """One run of the matrix."""

    mode: str
    """'sj+mjc' or 'full'."""
    jobs_per_call: int
    """Jobs in each procedure call."""
    connections: int
    """Concurrent connections, each driving its own chunks."""

    @property
    def label(self) -> str:
        return f"{self.mode}.{self.jobs_per_call}per.{self.connections}conn"


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What one combination measured."""

    combination: Combination
    n_jobs: int
    """Jobs taken through the lifecycle."""
    elapsed_s: float
    """Wall time of the lifecycle calls only."""
    retries: int
    """Whole-transaction retries after MySQL errors 1213/1205."""
    retries_by_errno: dict[int, int]
    statements: int
    """Statements the server ran during the calls (its `Queries`)."""
    database_cpu_s: float
    """The server's own CPU during the calls."""

    @property
    def jobs_per_s(self) -> float:
        return self.n_jobs / self.elapsed_s


@dataclasses.dataclass(frozen=True)
class World:
    """A schema holding one committed batch of Ready jobs and the instances to run them."""

    store: JobStore
    epoch: int
    batch_id: int
    job_ids: list[int]
    instances: list[str]



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, default=None, metavar="N",
                        help=f"jobs per run (default {DEFAULT_JOBS:,}; {SMOKE_JOBS} with --smoke)")
    parser.add_argument("--limit-usd", type=float, metavar="USD",
                        help="the billing project's spending limit (default none): schedule_jobs then reserves each "
                             "job's worst case against it; make it large enough that nothing waits")


def matrix(smoke: bool) -> list[Combination]:
    """Every combination measured, in the order they run."""
    per_call, connections = (SMOKE_JOBS_PER_CALL, SMOKE_CONNECTIONS) if smoke else (JOBS_PER_CALL, CONNECTIONS)
    return [Combination(m, k, c) for m, k, c in itertools.product(MODES, per_call, connections)]


def figure_names(smoke: bool) -> list[str]:
    """The names of every figure a run prints, in order."""
    names = []
    for combination in matrix(smoke):
        run = f"{NAME}.{combination.label}"
        names += [run, f"{run}.retries", f"{run}.statements_per_job", f"{run}.database_cpu_ms_per_job"]
    return names + [f"{NAME}.sj+mjc.best", f"{NAME}.full.best", f"{NAME}.full.32conn.retries"]


async def prepare(db: Database, n_jobs: int, limit_usd: float | None = None) -> World:
    """Billing project (with `limit_usd`, if given), leader epoch, active instances and N committed Ready jobs."""
    store = JobStore(db)
    await store.create_billing_project("bench", ["bench"], limit_usd=limit_usd)
    epoch = await store.elect_leader("bench-driver")
    instances = [f"bench-{i}" for i in range(N_INSTANCES)]
    for name in instances:
        await store.create_instance(epoch, name, "standard", INSTANCE_CORES_MCPU, f"token-{name}")
        await store.activate_instance(epoch, name, f"token-{name}")
    batch_id = int((await store.create_batch("bench", "bench"))["batch_id"])
    update = await store.create_update(batch_id, n_jobs)
    update_id, start = int(update["update_id"]), int(update["start_job_id"])
    job_ids = list(range(start, start + n_jobs))
    for first in range(0, n_jobs, INSERT_BUNCH):
        bunch = [{"job_id": j, "cores_mcpu": JOB_CORES_MCPU, "memory_bytes": JOB_MEMORY_BYTES, "inst_coll": "standard",
                  "job_group_id": 0}
                 for j in job_ids[first:first + INSERT_BUNCH]]
        await store.insert_jobs(batch_id, update_id, bunch)
    await store.commit_update(batch_id, update_id)
    return World(store, epoch, batch_id, job_ids, instances)


async def warm_up(world: World, connections: int) -> None:
    """Open every pooled connection and let each load the lifecycle
    procedures into its routine cache, as a long-running driver's have."""
    store, epoch = world.store, world.epoch
    barrier = asyncio.Barrier(connections)

    async def hold(cursor: Any) -> None:
        # Every connection is held until all are open, so the pool opens `connections` of them.
        await cursor.execute("SELECT 1")
        await barrier.wait()

    await asyncio.gather(*(store.db.retrying("bench_warm_up", hold) for _ in range(connections)))

    async def empty_calls(instance: str) -> None:
        await store.schedule_jobs(epoch, instance, [])
        await store.mark_jobs_started(epoch, instance, [])
        await store.mark_jobs_complete(epoch, instance, [])

    await asyncio.gather(*(empty_calls(world.instances[i % N_INSTANCES]) for i in range(connections)))


async def drive(world: World, combination: Combination) -> float:
    """Run every job through the lifecycle; returns the elapsed seconds."""
    store, epoch, batch_id = world.store, world.epoch, world.batch_id
    ids = world.job_ids
    k = combination.jobs_per_call
    chunks = collections.deque(ids[i:i + k] for i in range(0, len(ids), k))
    full = combination.mode == "full"

    async def connection(index: int) -> None:
        instance = world.instances[index % N_INSTANCES]
        while chunks:
            chunk = chunks.popleft()
            attempts = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"{j}-1"} for j in chunk]
            scheduled = await store.schedule_jobs(epoch, instance, attempts)
            if any(r["outcome"] != "scheduled" for r in scheduled):
                raise RuntimeError(f"schedule_jobs refused: {scheduled}")
            start_ms = store.clock_ms()
            if full:
                await store.mark_jobs_started(epoch, instance, [{**a, "start_time_ms": start_ms} for a in attempts],
                                              instance_products=True)
            completed = await store.mark_jobs_complete(epoch, instance, [
                {**a, "state": "Success", "exit_code": 0, "start_time_ms": start_ms,
                 "end_time_ms": start_ms + JOB_DURATION_MS} for a in attempts])
            # 'already_complete' only when the data layer retried a call
            # whose first try had committed.
            if any(r["outcome"] not in ("completed", "already_complete") for r in completed):
                raise RuntimeError(f"mark_jobs_complete refused: {completed}")

    started = time.perf_counter()
    await asyncio.gather(*(connection(i) for i in range(combination.connections)))
    return time.perf_counter() - started


async def verify(world: World, n_jobs: int) -> None:
    """The batch completed once and every core came back (not timed)."""
    db = world.store.db
    batch = await db.fetchone("SELECT state, n_jobs FROM batches WHERE batch_id = %s", (world.batch_id,))
    completions = await db.fetchone(
        "SELECT COUNT(*) AS n FROM batch_completions WHERE batch_id = %s", (world.batch_id,))
    free = await db.fetchall("SELECT free_cores_mcpu FROM instances")
    if batch is None or (batch["state"], batch["n_jobs"]) != ("complete", n_jobs) or completions["n"] != 1:
        raise RuntimeError(f"batch did not complete exactly once: {batch}, {completions} completion rows")
    if {row["free_cores_mcpu"] for row in free} != {INSTANCE_CORES_MCPU}:
        raise RuntimeError(f"cores were not all returned: {free}")


async def measure(ctx: BenchContext, combination: Combination, n_jobs: int,
                  limit_usd: float | None = None) -> RunResult:
    """One combination on a fresh schema."""
    async with fresh_database(ctx.server, pool_size=combination.connections) as db:
        world = await prepare(db, n_jobs, limit_usd)
        await warm_up(world, combination.connections)
        db.retry_stats = RetryStats()
        pid = await asyncio.to_thread(server_pid, ctx.server)
        (_, statements_before), cpu_before = await asyncio.to_thread(database_statements, ctx.server), own_cpu_s(pid)
        elapsed_s = await drive(world, combination)
        cpu_s = own_cpu_s(pid) - cpu_before
        statements = (await asyncio.to_thread(database_statements, ctx.server))[1] - statements_before
        stats, db.retry_stats = db.retry_stats, RetryStats()
        await verify(world, n_jobs)
    return RunResult(combination, n_jobs, elapsed_s, stats.retries, stats.by_errno, statements, cpu_s)


def plot(results: list[RunResult], path: Path) -> None:
    """jobs/s against connections, one line per jobs-per-call, one panel per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MODES), figsize=(11, 4.5), sharey=True, squeeze=False)
    for ax, mode in zip(axes[0], MODES):
        runs = [r for r in results if r.combination.mode == mode]
        for k in sorted({r.combination.jobs_per_call for r in runs}):
            line = sorted((r.combination.connections, r.jobs_per_s) for r in runs if r.combination.jobs_per_call == k)
            ax.plot([c for c, _ in line], [v for _, v in line], marker="o", label=f"{k} jobs/call")
        ax.axhline(TARGETS_JOBS_PER_S[mode], color="green", linestyle="--", linewidth=1,
                   label=f"target {TARGETS_JOBS_PER_S[mode]:,}")
        ax.axhline(SEED_JOBS_PER_S[mode], color="grey", linestyle=":", linewidth=1,
                   label=f"seed {SEED_JOBS_PER_S[mode]:,}")
        connections = sorted({r.combination.connections for r in runs})
        ax.set_xscale("log", base=2)
        ax.set_xticks(connections, [str(c) for c in connections])
        ax.set_title(mode)
        ax.set_xlabel("connections")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    axes[0][0].set_ylabel("jobs/s")
    n_jobs = results[0].n_jobs if results else 0
    fig.suptitle(f"sj-mjc: {n_jobs:,} jobs per run")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    results = []
    for combination in matrix(ctx.smoke):
        progress(f"{NAME}: {combination.mode}, {combination.jobs_per_call} jobs/call, "
                 f"{combination.connections} connections, {n_jobs:,} jobs")
        result = await measure(ctx, combination, n_jobs, args.limit_usd)
        results.append(result)
        ctx.figures.add(f"{NAME}.{combination.label}", round(result.jobs_per_s, 1), "jobs/s")
        ctx.figures.add(f"{NAME}.{combination.label}.retries", result.retries, "retries")
        ctx.figures.add(f"{NAME}.{combination.label}.statements_per_job", round(result.statements / n_jobs, 1),
                        "statements")
        ctx.figures.add(f"{NAME}.{combination.label}.database_cpu_ms_per_job",
                        round(result.database_cpu_s * 1000 / n_jobs, 3), "ms")

    for mode in MODES:
        best = max(r.jobs_per_s for r in results if r.combination.mode == mode)
        ctx.figures.add(f"{NAME}.{mode}.best", round(best, 1), "jobs/s")
    ctx.figures.add(f"{NAME}.full.32conn.retries", max(
        r.retries for r in results if r.combination.mode == "full" and r.combination.connections == 32), "retries")

    plot(results, ctx.out_dir / f"{NAME}.png")
    return {
        "n_jobs_per_run": n_jobs,
        "modes": list(MODES),
        "jobs_per_call": sorted({r.combination.jobs_per_call for r in results}),
        "connections": sorted({r.combination.connections for r in results}),
        "n_instances": N_INSTANCES,
        "instance_cores_mcpu": INSTANCE_CORES_MCPU,
        "job_cores_mcpu": JOB_CORES_MCPU,
        "insert_bunch": INSERT_BUNCH,
        "limit_usd": args.limit_usd,
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
        "runs": [
            {**dataclasses.asdict(r.combination), "n_jobs": r.n_jobs, "elapsed_s": round(r.elapsed_s, 3),
             "jobs_per_s": round(r.jobs_per_s, 1), "retries": r.retries, "statements": r.statements,
             "database_cpu_s": round(r.database_cpu_s, 3),
             "retries_by_errno": {str(e): n for e, n in r.retries_by_errno.items()}}
            for r in results
        ],
    }
