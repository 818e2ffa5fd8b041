"""cancel: cancel latency against batch size, and the drain rate.

For each batch size (1,000, 10,000, 100,000 and 1,000,000 Ready jobs), a
committed batch of Ready jobs is built through `JobStore` (parallel
bunches of insert_jobs, then commit_update). Auth and a frontend run as
their own processes; the benchmark is a user calling CancelBatch over gRPC
with `corral.aio.Client`, and times each call (the whole RPC: TLS channel,
bearer token, the frontend's ownership check, `cancel_job_group`, and the
batch it returns).

Each sample cancels a batch that is not cancelled: between samples the
benchmark deletes the batch's row from `job_groups_cancelled`. Cancelling
is that one insert (plus the `cancelled` event its trigger puts in the
outbox, which stays) and touches no counter, so deleting it restores the
state before (a benchmark-only reset; nothing in corral un-cancels).

The last cancellation stays, and the driver's real `ReadyCanceller` loop
(services/driver/canceller.py, its default 5,000 jobs per cycle, at least
500 per user) runs in this process against the database, under a leader epoch
of its own, until it has cancelled every job of the batch: the drain rate
is jobs / seconds from the loop's start to its last cancelling cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext, fresh_database, percentile, positive_int, progress
from bench.populate import ready_batch
from bench.stack import frontend_stack, work_dir
from corral import aio
from services.db.database import Database
from services.db.store import JobStore
from services.driver.store import DriverStore
from services.driver.canceller import ReadyCanceller

NAME = "cancel"
HELP = "CancelBatch latency for batches of 1k to 1M Ready jobs, and the canceller's drain rate"

SIZES = (1_000, 10_000, 100_000, 1_000_000)
SMOKE_SIZES = (100, 1_000)
DEFAULT_SAMPLES = 50
SMOKE_SAMPLES = 5
DRAIN_TIMEOUT_S = 3600.0
"""A drain that makes no progress for this long is a failure, not a figure."""

TARGET_P50_MS = 5.0
TARGET_DRAIN_JOBS_PER_S = 20_000
SEED_CANCEL_MS = 3.0
SEED_DRAIN_JOBS_PER_S = 917


@dataclasses.dataclass(frozen=True)
class SizeResult:
    """What one batch size measured."""

    n_jobs: int
    latencies_ms: list[float]
    drain_s: float

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 99)

    @property
    def drain_jobs_per_s(self) -> float:
        return self.n_jobs / self.drain_s



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-jobs", type=positive_int, metavar="N",
                        help="leave out batch sizes above N (e.g. 100000 to skip the million)")
    parser.add_argument("--samples", type=positive_int, metavar="N",
                        help=f"CancelBatch calls per size (default {DEFAULT_SAMPLES}; {SMOKE_SAMPLES} with --smoke)")


def sizes(smoke: bool, max_jobs: int | None) -> list[int]:
    """The batch sizes measured, smallest first."""
    return [n for n in (SMOKE_SIZES if smoke else SIZES) if max_jobs is None or n <= max_jobs]


def figure_names(sizes_measured: list[int]) -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.{n}.{what}" for n in sizes_measured for what in ("p50", "p99", "drain")]


async def cancel_latencies(client: aio.Client, db: Database, batch_id: int, samples: int) -> list[float]:
    """`samples` CancelBatch calls on the batch, each on an uncancelled batch; ms each."""
    latencies_ms = []
    for i in range(samples):
        started = time.perf_counter()
        batch = await client.cancel_batch(batch_id, reason="bench")
        latencies_ms.append((time.perf_counter() - started) * 1000)
        if not batch.HasField("cancellation"):
            raise RuntimeError(f"CancelBatch returned a batch that is not cancelled: {batch}")
        if i < samples - 1:
            await db.execute("DELETE FROM job_groups_cancelled WHERE batch_id = %s AND job_group_id = 0",
                             (batch_id,), name="bench_uncancel")
    return latencies_ms


async def drain(db: Database, store: JobStore, n_jobs: int) -> float:
    """Run the driver's ReadyCanceller until it has cancelled `n_jobs`; seconds."""
    epoch = await store.elect_leader("bench-canceller")
    canceller = ReadyCanceller(DriverStore(db, store.clock_ms), lambda: epoch)
    started = time.perf_counter()
    task = asyncio.create_task(canceller.run())
    try:
        while canceller.cancelled_total < n_jobs:
            before = canceller.cancelled_total
            # The loop re-runs at once while it cancels; a full period with
            # nothing cancelled means it found nothing to drain.
            await canceller.wait_cycles(1, timeout_s=DRAIN_TIMEOUT_S)
            if canceller.failures:
                raise RuntimeError("the canceller's cycle failed; see the log above")
            if canceller.cancelled_total == before and canceller.cycles > 1:
                raise RuntimeError(f"the canceller stopped at {before:,} of {n_jobs:,} jobs")
        return time.perf_counter() - started
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def verify_drained(db: Database, batch_id: int, n_jobs: int) -> None:
    """Every job cancelled, the batch complete (not timed)."""
    row = await db.fetchone(
        """SELECT b.state, (SELECT COALESCE(SUM(n_cancelled), 0) FROM job_groups_n_jobs_in_complete_states c
                            WHERE c.batch_id = b.batch_id AND c.job_group_id = 0) AS n_cancelled
           FROM batches b WHERE b.batch_id = %s""", (batch_id,))
    if row is None or (row["state"], int(row["n_cancelled"])) != ("complete", n_jobs):
        raise RuntimeError(f"batch {batch_id} did not drain: {row}")


def plot(results: list[SizeResult], path: Path) -> None:
    """Latency (p50, p99) and drain rate against batch size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (latency, rate) = plt.subplots(1, 2, figsize=(11, 4.5))
    xs = [r.n_jobs for r in results]
    latency.plot(xs, [r.p50_ms for r in results], marker="o", label="p50")
    latency.plot(xs, [r.p99_ms for r in results], marker="s", label="p99")
    latency.axhline(TARGET_P50_MS, color="green", linestyle="--", linewidth=1, label=f"target p50 {TARGET_P50_MS:g} ms")
    latency.axhline(SEED_CANCEL_MS, color="grey", linestyle=":", linewidth=1, label=f"seed ~{SEED_CANCEL_MS:g} ms")
    latency.set_ylim(bottom=0)
    latency.set_title("CancelBatch RPC latency")
    latency.set_ylabel("ms")
    rate.plot(xs, [r.drain_jobs_per_s for r in results], marker="o", label="ReadyCanceller")
    rate.axhline(TARGET_DRAIN_JOBS_PER_S, color="green", linestyle="--", linewidth=1,
                 label=f"target {TARGET_DRAIN_JOBS_PER_S:,}")
    rate.axhline(SEED_DRAIN_JOBS_PER_S, color="grey", linestyle=":", linewidth=1,
                 label=f"seed {SEED_DRAIN_JOBS_PER_S:,}")
    rate.set_yscale("log")
    rate.set_title("drain of the cancelled Ready jobs")
    rate.set_ylabel("jobs/s")
    for ax in (latency, rate):
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{x:,}" for x in xs])
        ax.set_xlabel("Ready jobs in the batch")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"cancel: {len(results[0].latencies_ms) if results else 0} calls per size")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    measured = sizes(ctx.smoke, args.max_jobs)
    if not measured:
        raise SystemExit(f"no batch size is at most --max-jobs {args.max_jobs}")
    samples = args.samples or (SMOKE_SAMPLES if ctx.smoke else DEFAULT_SAMPLES)
    results = []
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=8) as db, frontend_stack(db, root) as stack, \
                aio.Client(stack.frontend_address, stack.token, ca_cert=stack.ca_cert) as client:
            store = JobStore(db)
            for n_jobs in measured:
                progress(f"{NAME}: building a batch of {n_jobs:,} Ready jobs")
                batch = await ready_batch(store, stack.user, stack.billing_project, n_jobs)
                # Opens the channel, fills the token cache, loads the batch's rows.
                await client.get_batch(batch.batch_id)
                progress(f"{NAME}: {samples} CancelBatch calls")
                latencies_ms = await cancel_latencies(client, db, batch.batch_id, samples)
                progress(f"{NAME}: draining {n_jobs:,} jobs with the ReadyCanceller")
                drain_s = await drain(db, store, n_jobs)
                await verify_drained(db, batch.batch_id, n_jobs)
                result = SizeResult(n_jobs, latencies_ms, drain_s)
                results.append(result)
                ctx.figures.add(f"{NAME}.{n_jobs}.p50", round(result.p50_ms, 2), "ms")
                ctx.figures.add(f"{NAME}.{n_jobs}.p99", round(result.p99_ms, 2), "ms")
                ctx.figures.add(f"{NAME}.{n_jobs}.drain", round(result.drain_jobs_per_s, 1), "jobs/s")
    plot(results, ctx.out_dir / f"{NAME}.png")
    return {
        "sizes": measured,
        "samples_per_size": samples,
        "canceller": "services.driver.canceller.ReadyCanceller, default per_cycle and minimum_per_user",
        "services": "auth and frontend as processes, TLS; the canceller in the benchmark's process",
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
        "runs": [{"n_jobs": r.n_jobs, "p50_ms": round(r.p50_ms, 3), "p99_ms": round(r.p99_ms, 3),
                  "max_ms": round(max(r.latencies_ms), 3), "drain_s": round(r.drain_s, 3),
                  "drain_jobs_per_s": round(r.drain_jobs_per_s, 1)} for r in results],
    }
