"""slurm-compare: corral beside Slurm, the same no-op work on the same machine, rounds alternating.

Both systems run at once for the whole benchmark, each idle while the other is timed:

  corral   `corral up` with local workers (as `bench e2e`: two workers of 16 cores per pool, the
           process runtime, a quarter core per job, so 128 jobs at once), the Python client
           submitting a batch of N jobs of `true` and waiting for it to complete;
  Slurm    a private single-node Slurm on loopback (bench/slurm.py: munged, slurmctld and slurmd
           from Debian's slurm-wlm, non-default ports, a node declaring 128 CPUs so 128 tasks run at
           once), `sbatch --array=1-N --wrap=true`, complete when its job-completion log holds every
           task.

Each round times one no-op batch on each, then a dependency chain of L jobs on each (corral: each job
the child of the one before; Slurm: `--dependency=afterok:` on the one before); the order of the two
systems alternates from round to round. Printed: each system's jobs/s and seconds per link (the
median over rounds), and corral's ratio to Slurm for both, the median of the rounds' ratios (issue 15's
target: corral ≥ 10× Slurm's jobs/s).

Slurm's scheduler is tuned as its documentation suggests for throughput (`SchedulerParameters=defer`,
`sched/builtin`, no accounting); its chain is bounded by its scheduling tick (about one second), which
is how Slurm works, not how it was set up here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import corral
from bench.common import BenchContext, positive_int, progress
from bench.e2e import JOB_CORES, fresh_schema, noop_batch
from bench.slurm import SlurmCluster
from services.up import process as up_process

NAME = "slurm-compare"
HELP = "corral and a private Slurm, the same no-op batch and chain, rounds alternating"

DEFAULT_JOBS, SMOKE_JOBS = 2_000, 50
DEFAULT_CHAIN, SMOKE_CHAIN = 20, 3
DEFAULT_ROUNDS, SMOKE_ROUNDS = 3, 1
WORKER_CORES, MAX_WORKERS = 16, 2
SLOTS = int(MAX_WORKERS * WORKER_CORES / JOB_CORES)
"""Jobs that run at once on either system."""
TARGET_RATIO = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help=f"no-op jobs per batch (default {DEFAULT_JOBS:,}; {SMOKE_JOBS} with --smoke)")
    parser.add_argument("--chain", type=positive_int, metavar="L",
                        help=f"links of each chain (default {DEFAULT_CHAIN}; {SMOKE_CHAIN} with --smoke)")
    parser.add_argument("--rounds", type=positive_int, metavar="R",
                        help=f"rounds, the order alternating (default {DEFAULT_ROUNDS}; {SMOKE_ROUNDS} with --smoke)")


def figure_names() -> list[str]:
    return [f"{NAME}.corral.jobs_per_s", f"{NAME}.slurm.jobs_per_s", f"{NAME}.ratio.jobs_per_s",
            f"{NAME}.corral.s_per_link", f"{NAME}.slurm.s_per_link", f"{NAME}.ratio.s_per_link"]


def corral_noop_s(client: corral.Client, n_jobs: int) -> float:
    batch = noop_batch(n_jobs, "bench-slurm-compare-noop")
    started = time.perf_counter()
    done = client.wait(client.submit(batch).batch_id)
    elapsed = time.perf_counter() - started
    if done.counts.n_succeeded != n_jobs:
        raise RuntimeError(f"not every corral job succeeded: {done.counts}")
    return elapsed


def corral_chain_s(client: corral.Client, n_links: int) -> float:
    chain = corral.BatchBuilder("default", attributes={"name": "bench-slurm-compare-chain"})
    previous = None
    for _ in range(n_links):
        previous = chain.job("busybox", ["true"], cores=JOB_CORES, parents=[previous] if previous is not None else [])
    started = time.perf_counter()
    done = client.wait(client.submit(chain).batch_id)
    elapsed = time.perf_counter() - started
    if done.counts.n_succeeded != n_links:
        raise RuntimeError(f"not every link of corral's chain succeeded: {done.counts}")
    return elapsed


def measure(ctx: BenchContext, n_jobs: int, n_links: int, n_rounds: int) -> dict[str, list[float]]:
    """Seconds per round for each system and workload (blocking: run in a thread)."""
    times: dict[str, list[float]] = {"corral.noop": [], "slurm.noop": [], "corral.chain": [], "slurm.chain": []}
    with fresh_schema(ctx.server) as database_url, tempfile.TemporaryDirectory(prefix="corral-bench-slurm-") as tmp:
        progress(f"{NAME}: starting Slurm ({SLOTS} CPUs on one node) and corral up ({MAX_WORKERS} workers of "
                 f"{WORKER_CORES} cores)")
        with SlurmCluster.start(Path(tmp) / "slurm", cpus=SLOTS) as slurm:
            up = up_process.start(Path(tmp) / "corral", "--database-url", database_url, "--worker-cores",
                                  str(WORKER_CORES), "--max-workers", str(MAX_WORKERS), "--idle-timeout", "600")
            try:
                with corral.Client(up.endpoints["frontend"], up.admin_token, ca_cert=up.endpoints["ca_cert"]) as client:
                    progress(f"{NAME}: warm-up (corral's workers start; Slurm runs a first array)")
                    client.wait(client.submit(noop_batch(2 * SLOTS, "warm-up", ("sleep", "1"))).batch_id)
                    slurm.array_s(SLOTS)
                    runs = {"corral": (lambda: corral_noop_s(client, n_jobs), lambda: corral_chain_s(client, n_links)),
                            "slurm": (lambda: slurm.array_s(n_jobs), lambda: slurm.chain_s(n_links))}
                    for round_ in range(n_rounds):
                        order = ["corral", "slurm"] if round_ % 2 == 0 else ["slurm", "corral"]
                        for system in order:
                            noop, chain = runs[system]
                            times[f"{system}.noop"].append(noop())
                            times[f"{system}.chain"].append(chain())
                            progress(f"{NAME}: round {round_ + 1}, {system}: {n_jobs / times[f'{system}.noop'][-1]:.1f} "
                                     f"jobs/s, {times[f'{system}.chain'][-1] / n_links:.3f} s per link")
            finally:
                up.stop()
    return times


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    n_links = args.chain or (SMOKE_CHAIN if ctx.smoke else DEFAULT_CHAIN)
    n_rounds = args.rounds or (SMOKE_ROUNDS if ctx.smoke else DEFAULT_ROUNDS)
    times = await asyncio.to_thread(measure, ctx, n_jobs, n_links, n_rounds)
    rates = {s: [n_jobs / t for t in times[f"{s}.noop"]] for s in ("corral", "slurm")}
    links = {s: [t / n_links for t in times[f"{s}.chain"]] for s in ("corral", "slurm")}
    corral_rate, slurm_rate, rate_ratio, corral_link, slurm_link, link_ratio = figure_names()
    ctx.figures.add(corral_rate, round(statistics.median(rates["corral"]), 1), "jobs/s")
    ctx.figures.add(slurm_rate, round(statistics.median(rates["slurm"]), 1), "jobs/s")
    ctx.figures.add(rate_ratio, round(statistics.median(c / s for c, s in zip(rates["corral"], rates["slurm"])), 2), "x")
    ctx.figures.add(corral_link, round(statistics.median(links["corral"]), 4), "s")
    ctx.figures.add(slurm_link, round(statistics.median(links["slurm"]), 4), "s")
    # How many times faster corral's chain is: Slurm's seconds per link over corral's.
    ctx.figures.add(link_ratio, round(statistics.median(s / c for c, s in zip(links["corral"], links["slurm"])), 2), "x")
    return {
        "n_jobs": n_jobs,
        "n_links": n_links,
        "n_rounds": n_rounds,
        "slots": SLOTS,
        "rounds": {key: [round(t, 3) for t in values] for key, values in times.items()},
        "target_ratio_jobs_per_s": TARGET_RATIO,
        "corral": f"corral up, {MAX_WORKERS} local workers of {WORKER_CORES} cores, process runtime, "
                  f"{JOB_CORES} core per job",
        "slurm": f"Slurm {SlurmCluster.version()}, one node of {SLOTS} CPUs, sched/builtin with defer, "
                 "no accounting, completion from jobcomp/filetxt",
        "smoke": ctx.smoke,
    }
