"""e2e: jobs through the whole system, from submission to completion.

The benchmark starts `corral up` itself (auth, frontend, two drivers, local
workers started by the leading driver's autoscaler; each its own process)
on a fresh schema of the runner's MariaDB, and submits as its administrator
with the Python client:

  no-op    N jobs of `true` (a quarter core each, no parents): jobs/s from
           the first submission call to the batch's completion, and per job
           the latency ready -> running (from the update's commit to the
           scheduler's SJ) and running -> complete (from SJ to the job's
           final state recorded by MJC), from the batch's event stream, whose
           times are the database's clock;
  chain    a chain of L jobs, each the child of the one before: seconds per
           link from submission to completion.

Workers declare `--worker-cores` cores (default 16, so 64 no-op jobs run at
once per worker), at most `--max-workers` per pool (default 2). A warm-up
batch first brings the workers up, so autoscaling is not timed.

`--runtime` chooses how the workers run jobs: `process` (the default; a
process each, isolated when root) or `oci` (a runc container each, the
image `busybox` from corral up's loopback registry: the same figures, named
`e2e.oci.*`, are then containers/s and the containers' latencies).

`--fleet N` measures the control plane alone: instead of the autoscaler's
workers, N simulated workers (bench/fleet.py: the real worker process and
its session stream over mutual TLS, with a runtime that completes each
attempt the moment it starts) of `--worker-cores` cores each in the
standard pool; the figures are named `e2e.fleet.*`. Nothing is forked per
job, so jobs/s is what the control plane sustains, and its CPU per job is
issue 15's figure.

Over the no-op phase, each process group's CPU is read from /proc before
and after (bench/cpu.py) and printed per job: `noop.cpu_ms_per_job.GROUP`
for the database, the leading and the standby driver, the frontend, auth,
the workers and the workers' children (the jobs and what a worker starts
per attempt), and `control_plane` (database, drivers, frontend, auth):
where a job's cost goes, whatever the machine's load. Beside them, the
database's statements per job over the same phase, from its global status:
`round_trips` (statements the services sent, a CALL one) and `statements`
(those and every statement the stored procedures ran).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import corral
from bench.common import (
    SCHEMA_PREFIX,
    BenchContext,
    check_consistent,
    database_statements,
    percentile,
    positive_int,
    progress,
)
from bench.cpu import GROUPS, CpuSnapshot, CpuUse, cpu_ms_per_job
from bench.fleet import fleet
from corral.batch.v1 import job_state_pb2
from services.db.database import Database, DatabaseConfig
from services.db.migrations import drop_database
from services.db.server import server_pid
from services.up import process as up_process

NAME = "e2e"
HELP = "no-op jobs and a dependency chain through corral up with local workers"

DEFAULT_JOBS, SMOKE_JOBS = 10_000, 200
DEFAULT_CHAIN, SMOKE_CHAIN = 1_000, 10
JOB_CORES = 0.25
TARGET_JOBS_PER_S = 1000
TARGET_S_PER_LINK = 0.050
TARGET_CONTROL_PLANE_MS = 1.0
"""Issue 15: the control plane's CPU per job (database, drivers, frontend, auth)."""
RUNTIMES = ("process", "oci")
FLEET_POOL = "standard"
"""Where the simulated workers are enrolled: the pool the no-op jobs (a quarter core, default memory) go to."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help=f"no-op jobs (default {DEFAULT_JOBS:,}; {SMOKE_JOBS} with --smoke)")
    parser.add_argument("--chain", type=positive_int, metavar="L",
                        help=f"links of the dependency chain (default {DEFAULT_CHAIN:,}; {SMOKE_CHAIN} with --smoke)")
    parser.add_argument("--worker-cores", type=positive_int, default=16, metavar="N",
                        help="cores each local worker declares (default: %(default)s)")
    parser.add_argument("--max-workers", type=positive_int, default=2, metavar="N",
                        help="most local workers per pool (default: %(default)s)")
    parser.add_argument("--runtime", choices=RUNTIMES, default="process",
                        help="how workers run jobs: a process each, or an OCI container each (default: "
                             "%(default)s)")
    parser.add_argument("--fleet", type=positive_int, metavar="N",
                        help="N simulated workers that complete each attempt at once, instead of the autoscaler's: "
                             "the control plane measured alone (figures e2e.fleet.*)")


def mode(args: argparse.Namespace) -> str:
    """What the figures are named after: 'fleet' (simulated workers), else the runtime."""
    return "fleet" if args.fleet else args.runtime


def figure_names(runtime: str = "process") -> list[str]:
    """Every figure a run prints, in order (the OCI runtime's are `e2e.oci.*`)."""
    prefix = NAME if runtime == "process" else f"{NAME}.{runtime}"
    return [f"{prefix}.noop.jobs_per_s", f"{prefix}.noop.ready_to_running.p50", f"{prefix}.noop.ready_to_running.p99",
            f"{prefix}.noop.running_to_complete.p50", f"{prefix}.noop.running_to_complete.p99",
            f"{prefix}.chain.s_per_link", *cpu_figure_names(runtime)]


def cpu_figure_names(runtime: str = "process") -> list[str]:
    """The CPU figures of the no-op phase, by process group, then the control plane's sum, then the
    database's statements per job."""
    prefix = NAME if runtime == "process" else f"{NAME}.{runtime}"
    return [*(f"{prefix}.noop.cpu_ms_per_job.{group}" for group in (*GROUPS, "control_plane")),
            f"{prefix}.noop.db_round_trips_per_job", f"{prefix}.noop.db_statements_per_job"]


@contextlib.contextmanager
def fresh_schema(server: DatabaseConfig) -> Iterator[str]:
    """A --database-url naming a new schema on the runner's server (corral up creates and
    migrates it); the schema is dropped afterwards."""
    config = dataclasses.replace(server, database=f"{SCHEMA_PREFIX}{int(time.time() * 1000)}")
    try:
        yield config.to_url()
        asyncio.run(_check_consistent(config))  # the run is over and corral up stopped
    finally:
        drop_database(config)


async def _check_consistent(config: DatabaseConfig) -> None:
    db = await Database.connect(dataclasses.replace(config, pool_size=1))
    try:
        await check_consistent(db)
    finally:
        await db.close()


@dataclasses.dataclass(frozen=True)
class Corral:
    """A running `corral up` and its administrator's client."""

    up: up_process.UpProcess
    client: corral.Client
    database_url: str
    """Its schema on the runner's server."""


@contextlib.contextmanager
def corral_up(server: DatabaseConfig, work_dir: Path, runtime: str, worker_cores: int, max_workers: int,
              idle_timeout_s: int) -> Iterator[Corral]:
    """`corral up` on a fresh schema of SERVER, at most MAX_WORKERS local workers per pool of WORKER_CORES
    cores running jobs with RUNTIME (one of RUNTIMES), and its administrator's client. On the way out it
    is stopped, then the schema checked and dropped."""
    with fresh_schema(server) as database_url:
        up = up_process.start(work_dir, "--database-url", database_url, "--worker-cores", str(worker_cores),
                              "--max-workers", str(max_workers), "--idle-timeout", str(idle_timeout_s),
                              "--worker-runtime", runtime)
        try:
            with corral.Client(up.endpoints["frontend"], up.admin_token, ca_cert=up.endpoints["ca_cert"]) as client:
                yield Corral(up, client, database_url)
        finally:
            up.stop()


def warm_up(client: corral.Client, max_workers: int, worker_cores: int, bench: str = NAME) -> None:
    """Bring the autoscaler's workers up before anything is timed: enough one-second jobs to keep every
    worker busy while it starts."""
    n_warm = int(2 * max_workers * worker_cores / JOB_CORES)
    progress(f"{bench}: warm-up ({n_warm} jobs)")
    client.wait(client.submit(noop_batch(n_warm, "warm-up", ("sleep", "1"))).batch_id)


def noop_batch(n_jobs: int, name: str, command: tuple[str, ...] = ("true",)) -> corral.BatchBuilder:
    batch = corral.BatchBuilder("default", attributes={"name": name})
    for _ in range(n_jobs):
        batch.job("busybox", list(command), cores=JOB_CORES)
    return batch


def completed(client: corral.Client, builder: corral.BatchBuilder, n_jobs: int, what: str) -> tuple[float, Any]:
    """Submit the batch and wait for it: seconds from the submission call to its completion, and the batch.
    Raises if not all its `n_jobs` succeeded, saying what the first failed attempts said."""
    started = time.perf_counter()
    done = client.wait(client.submit(builder).batch_id)
    elapsed = time.perf_counter() - started
    if done.counts.n_succeeded != n_jobs:
        raise RuntimeError(f"not every {what} succeeded: {done.counts}; " + failures(client, done.batch_id))
    return elapsed, done


def failures(client: corral.Client, batch_id: int, most: int = 3) -> str:
    """What the last attempts of the first jobs that did not succeed said."""
    said = []
    for job in client.jobs(batch_id, "state!=success", page_size=most):
        attempt = client.get_job(batch_id, job.job_id).attempts[-1]
        said.append(f"job {job.job_id}: {attempt.end_reason}: {attempt.error_message}")
        if len(said) == most:
            break
    return "; ".join(said)


def chain_batch(n_links: int, name: str) -> corral.BatchBuilder:
    """N_LINKS jobs of `true`, each the child of the one before."""
    chain = corral.BatchBuilder("default", attributes={"name": name})
    previous = None
    for _ in range(n_links):
        previous = chain.job("busybox", ["true"], cores=JOB_CORES, parents=[previous] if previous is not None else [])
    return chain


def latencies_ms(client: corral.Client, batch_id: int) -> tuple[list[float], list[float]]:
    """Per job, ready -> running and running -> final, from the batch's events."""
    committed_ms: float | None = None
    running_ms: dict[int, float] = {}
    to_running, to_final = [], []
    for event in client.watch(batch_id, from_event_id=1):
        at_ms = event.at.ToMilliseconds()
        if event.HasField("update_committed"):
            committed_ms = at_ms
        elif event.HasField("job_state_changed"):
            change = event.job_state_changed
            if change.new_state == job_state_pb2.JOB_STATE_RUNNING:
                running_ms[change.job_id] = at_ms
                if committed_ms is not None:
                    to_running.append(at_ms - committed_ms)
            elif change.old_state == job_state_pb2.JOB_STATE_RUNNING and change.job_id in running_ms:
                to_final.append(at_ms - running_ms[change.job_id])
        elif event.HasField("batch_completed"):
            break
    return to_running, to_final


def plot(to_running: list[float], to_final: list[float], path: Path, title: str) -> None:
    """The distribution (CDF) of both latencies."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for values, label in ((to_running, "ready → running"), (to_final, "running → complete")):
        ordered = sorted(values)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)
    ax.set_xscale("log")
    ax.set_xlabel("ms")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclasses.dataclass(frozen=True)
class Measured:
    noop_s: float
    to_running_ms: list[float]
    to_final_ms: list[float]
    chain_s: float
    cpu: CpuUse
    statements: tuple[float, float]
    """Round trips and statements per job."""


def measure(ctx: BenchContext, args: argparse.Namespace, n_jobs: int, n_links: int) -> Measured:
    """Start corral up, run both workloads, stop it (blocking: run in a thread)."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-e2e-") as tmp, contextlib.ExitStack() as stack:
        workers = (f"{args.fleet} simulated workers of {args.worker_cores} cores" if args.fleet else
                   f"{args.max_workers} workers of {args.worker_cores} cores per pool, the {args.runtime} runtime")
        progress(f"{NAME}: starting corral up ({workers})")
        # With a fleet, the autoscaler starts nothing: the pools may hold no machine of their own.
        running = stack.enter_context(corral_up(ctx.server, Path(tmp), args.runtime, args.worker_cores,
                                                0 if args.fleet else args.max_workers, idle_timeout_s=120))
        up, client = running.up, running.client
        if args.fleet:
            stack.enter_context(fleet(up, running.database_url, args.fleet, FLEET_POOL, args.worker_cores * 1000))
            n_warm = args.fleet * args.worker_cores * 4
            progress(f"{NAME}: warm-up ({n_warm} jobs)")
            client.wait(client.submit(noop_batch(n_warm, "warm-up")).batch_id)
        else:
            warm_up(client, args.max_workers, args.worker_cores)

        progress(f"{NAME}: {n_jobs:,} no-op jobs")
        batch = noop_batch(n_jobs, "bench-e2e-noop")
        database_pid = server_pid(ctx.server)
        cpu_before = CpuSnapshot.of(up.data_dir, database_pid)
        statements_before = database_statements(ctx.server)
        noop_s, noop = completed(client, batch, n_jobs, "no-op job")
        cpu = cpu_ms_per_job(cpu_before, CpuSnapshot.of(up.data_dir, database_pid), n_jobs)
        trips, runs = ((after - before) / n_jobs for before, after in
                       zip(statements_before, database_statements(ctx.server)))
        to_running, to_final = latencies_ms(client, noop.batch_id)

        progress(f"{NAME}: a chain of {n_links:,} jobs")
        chain_s, _ = completed(client, chain_batch(n_links, "bench-e2e-chain"), n_links, "link of the chain")
    return Measured(noop_s, to_running, to_final, chain_s, cpu, (trips, runs))


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    n_links = args.chain or (SMOKE_CHAIN if ctx.smoke else DEFAULT_CHAIN)
    measured = await asyncio.to_thread(measure, ctx, args, n_jobs, n_links)
    noop_s, to_running, to_final, chain_s = (measured.noop_s, measured.to_running_ms, measured.to_final_ms,
                                             measured.chain_s)
    rate, r50, r99, f50, f99, link = figure_names(mode(args))[:6]
    ctx.figures.add(rate, round(n_jobs / noop_s, 1), "jobs/s")
    ctx.figures.add(r50, round(percentile(to_running, 50), 1), "ms")
    ctx.figures.add(r99, round(percentile(to_running, 99), 1), "ms")
    ctx.figures.add(f50, round(percentile(to_final, 50), 1), "ms")
    ctx.figures.add(f99, round(percentile(to_final, 99), 1), "ms")
    ctx.figures.add(link, round(chain_s / n_links, 4), "s")
    cpu = measured.cpu
    names = cpu_figure_names(mode(args))
    for name, value in zip(names, [*(cpu.ms_per_job[g] for g in GROUPS), round(cpu.control_plane_ms_per_job, 3)]):
        ctx.figures.add(name, value, "ms")
    for name, value in zip(names[-2:], measured.statements):
        ctx.figures.add(name, round(value, 1), "statements")
    image = f"{NAME}.png" if mode(args) == "process" else f"{NAME}-{mode(args)}.png"
    workers = f"{args.fleet} simulated workers" if args.fleet else f"{args.runtime} runtime"
    plot(to_running, to_final, ctx.out_dir / image, f"{NAME}: {len(to_final):,} no-op jobs ({workers})")
    return {
        "n_jobs": n_jobs,
        "n_links": n_links,
        "job": f"busybox true ({args.runtime} runtime), {JOB_CORES} core, no parents",
        "runtime": "simulated: each attempt completes at once (bench/fleet_worker.py)" if args.fleet else args.runtime,
        "fleet": args.fleet,
        "worker_cores": args.worker_cores,
        "max_workers_per_pool": args.max_workers,
        "noop_seconds": round(noop_s, 2),
        "chain_seconds": round(chain_s, 2),
        "targets": {"jobs_per_s": TARGET_JOBS_PER_S, "s_per_link": TARGET_S_PER_LINK,
                    "control_plane_cpu_ms_per_job": TARGET_CONTROL_PLANE_MS},
        "cpu_processes_lost": measured.cpu.lost,
        "smoke": ctx.smoke,
        "services": "corral up: auth, frontend, two drivers, local workers; each its own process",
    }
