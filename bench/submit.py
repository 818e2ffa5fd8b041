"""submit: how fast a large batch is created and committed through the API.

N no-op jobs (`true`, 1 core, no dependencies) go up through the
frontend's gRPC API with the Python client's parallel bunches
(`corral.aio.Client.submit`: CreateBatch, AddJobs bunches in parallel,
CommitUpdate), as a user would submit them. Auth and a frontend run as
their own processes on a fresh schema, over TLS with a development CA;
the frontend writes each bunch's specs to blob storage (a temporary
directory) and inserts the jobs with `insert_jobs`.

Only `submit()` is timed; the client's builder is filled first. Figures:
jobs/s and seconds from the first call to the committed batch, and that
time split at the commit (from the update's own timestamps): seconds to
add the jobs, seconds to commit them; and the peak resident memory of this
process, the client (the services run apart), builder and submission
included.
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

from bench.common import BenchContext, fresh_database, positive_int, progress
from bench.stack import frontend_stack, work_dir
from corral import aio
from corral.batch.v1 import batch_pb2
from corral.builder import BatchBuilder

NAME = "submit"
HELP = "create and commit N jobs through the frontend's gRPC API in parallel bunches"

DEFAULT_JOBS = 100_000
LARGE_JOBS = 1_000_000
SMOKE_JOBS = 2_000
"""Above the client's one-call limit (corral.aio.SMALL_BATCH), so bunches are used."""

TARGETS_S = {100_000: 5.0, 1_000_000: 60.0}
"""Issue 4's targets: seconds to commit."""
TARGET_CLIENT_MIB = 200
"""Issue 15's: the client's memory for a million jobs."""



def add_arguments(parser: argparse.ArgumentParser) -> None:
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--large", action="store_true", help=f"{LARGE_JOBS:,} jobs")
    size.add_argument("--jobs", type=positive_int, metavar="N",
                      help=f"jobs to submit (default {DEFAULT_JOBS:,}; {SMOKE_JOBS:,} with --smoke)")
    parser.add_argument("--bunch-size", type=positive_int, default=aio.BUNCH_SIZE, metavar="N",
                        help=f"jobs per AddJobs call (default: the client's, {aio.BUNCH_SIZE:,})")
    parser.add_argument("--parallelism", type=positive_int, default=aio.PARALLEL_BUNCHES, metavar="N",
                        help=f"AddJobs calls in flight (default: the client's, {aio.PARALLEL_BUNCHES})")


def n_jobs_of(args: argparse.Namespace, smoke: bool) -> int:
    """The number of jobs a run submits."""
    if args.jobs:
        return int(args.jobs)
    if args.large:
        return LARGE_JOBS
    return SMOKE_JOBS if smoke else DEFAULT_JOBS


def figure_names(n_jobs: int) -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.{n_jobs}.{what}"
            for what in ("rate", "seconds", "add_jobs_seconds", "commit_seconds", "client_peak_rss")]


def builder(n_jobs: int, billing_project: str) -> BatchBuilder:
    """N independent no-op jobs."""
    batch = BatchBuilder(billing_project, attributes={"name": f"bench-submit-{n_jobs}"})
    for _ in range(n_jobs):
        batch.job("busybox", ["true"])
    return batch


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = n_jobs_of(args, ctx.smoke)
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=4) as db, frontend_stack(db, root) as stack:
            progress(f"{NAME}: building {n_jobs:,} job specs")
            batch = builder(n_jobs, stack.billing_project)
            async with aio.Client(stack.frontend_address, stack.token, ca_cert=stack.ca_cert) as client:
                # A first call opens the TLS channel and fills the frontend's token cache.
                async for _ in client.list_batches(page_size=1):
                    pass
                progress(f"{NAME}: submitting {n_jobs:,} jobs, bunches of {args.bunch_size:,}, "
                         f"{args.parallelism} in flight")
                started = time.perf_counter()
                submitted = await client.submit(batch, bunch_size=args.bunch_size, parallelism=args.parallelism)
                elapsed_s = time.perf_counter() - started
                ended_ms = time.time() * 1000
                committed = await client.get_batch(submitted.batch_id)
            # Read now: the invariant checker, when the database is handed back, holds the jobs' rows.
            peak_rss_mib = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            update = await db.fetchone(
                "SELECT time_created_ms, time_committed_ms FROM batch_updates WHERE batch_id = %s",
                (submitted.batch_id,))
    if (committed.state, committed.counts.n_jobs, committed.counts.n_ready) != (
            batch_pb2.BATCH_STATE_RUNNING, n_jobs, n_jobs):
        raise RuntimeError(f"the batch did not commit {n_jobs} Ready jobs: {committed}")
    assert update is not None
    add_jobs_s = (update["time_committed_ms"] - update["time_created_ms"]) / 1000
    commit_s = (ended_ms - update["time_committed_ms"]) / 1000

    rate, seconds, add_jobs, commit, client_rss = figure_names(n_jobs)
    ctx.figures.add(rate, round(n_jobs / elapsed_s, 1), "jobs/s")
    ctx.figures.add(seconds, round(elapsed_s, 2), "s")
    ctx.figures.add(add_jobs, round(add_jobs_s, 2), "s")
    ctx.figures.add(commit, round(commit_s, 2), "s")
    ctx.figures.add(client_rss, peak_rss_mib, "MiB")
    return {
        "n_jobs": n_jobs,
        "bunch_size": args.bunch_size,
        "parallelism": args.parallelism,
        "job": "busybox true, 1 core, no parents",
        "services": "auth and frontend as processes, TLS, file:// spec storage",
        "target_s": TARGETS_S.get(n_jobs),
        "target_client_mib": TARGET_CLIENT_MIB,
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
    }
