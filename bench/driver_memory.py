"""driver-memory: the driver's peak memory with a million queued Ready jobs.

A real driver process (`python -m services.driver`, as `corral up` starts
it, with a development CA in a temporary directory) runs against a fresh
schema, becomes leader, and runs all its loops for a fixed time while the
benchmark samples its /proc/PID/status: VmRSS (resident now) and VmHWM
(the kernel's high-water mark of resident memory, the peak). It does this
twice: on the empty schema (the baseline: the process and its imports),
then on the same schema holding N Ready jobs (default 1,000,000, in 10
committed batches of 5 users, built through `JobStore`).

No workers: every pool's `max_instances` is set to 0, so the autoscaler
reads the demand of the million jobs but starts no worker processes, and
the scheduler, with no live worker session, places nothing. Running the
jobs is the e2e benchmark's business; here the loops (scheduler,
cancellers, autoscaler, dead-worker detection, and whatever else the
driver runs) look at a full queue. Figures: the peak (VmHWM) of each run
and the resident memory at the end of the queued run, in MB (10^6 bytes).
The driver's log of each run is kept beside the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import BenchContext, fresh_database, positive_int, progress
from bench.populate import ready_batch
from bench.stack import certificate_authority, service, work_dir
from services.db.database import Database
from services.db.store import JobStore

NAME = "driver-memory"
HELP = "driver peak RSS with 1,000,000 queued Ready jobs (a real driver process, no workers)"

DEFAULT_JOBS, SMOKE_JOBS = 1_000_000, 2_000
DEFAULT_SECONDS, SMOKE_SECONDS = 60.0, 3.0
N_BATCHES, SMOKE_BATCHES = 10, 2
N_USERS = 5
SAMPLE_INTERVAL_S = 0.2
LEADER_TIMEOUT_S = 60.0
TARGET_MB = 300.0
MB = 1_000_000


@dataclasses.dataclass(frozen=True)
class MemoryRun:
    """The samples of one driver run."""

    label: str
    """'empty' or 'queued'."""
    times_s: list[float]
    """Seconds since the driver started leading."""
    rss_bytes: list[int]
    hwm_bytes: list[int]
    failed_cycles: int
    """'cycle failed' lines in the driver's log."""

    @property
    def peak_mb(self) -> float:
        return max(self.hwm_bytes) / MB

    @property
    def end_mb(self) -> float:
        return self.rss_bytes[-1] / MB



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=positive_int, metavar="N",
                        help=f"queued Ready jobs (default {DEFAULT_JOBS:,}; {SMOKE_JOBS:,} with --smoke)")
    parser.add_argument("--seconds", type=float, metavar="S",
                        help=f"how long each driver run lasts once leading (default {DEFAULT_SECONDS:g}; "
                             f"{SMOKE_SECONDS:g} with --smoke)")


def figure_names() -> list[str]:
    """The names of every figure a run prints, in order."""
    return [f"{NAME}.empty.peak_rss", f"{NAME}.queued.peak_rss", f"{NAME}.queued.end_rss"]


def read_status(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024  # the kernel reports kB
    return fields["VmRSS"], fields["VmHWM"]


async def wait_for_leader(db: Database, address: str, alive: Callable[[], bool]) -> None:
    """Until the driver at `address` holds the leader epoch."""
    deadline = time.monotonic() + LEADER_TIMEOUT_S
    while True:
        row = await db.fetchone("SELECT leader_name FROM leader_epoch")
        if row is not None and row["leader_name"] == address:
            return
        if not alive():
            raise RuntimeError("the driver exited before leading")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the driver did not lead within {LEADER_TIMEOUT_S:g} s")
        await asyncio.sleep(0.1)


async def driver_run(db: Database, root: Path, label: str, seconds: float, out_dir: Path) -> MemoryRun:
    """Start a driver on `db`'s schema, sample it for `seconds` once it leads,
    stop it; its log is kept as `<out_dir>/driver-memory-<label>.log`."""
    certs = certificate_authority(root)
    args = ["services.driver", "--database-url", db.config.to_url(), "--certs-dir", str(certs.directory),
            "--spec-root-url", f"file://{root / 'blobs'}", "--data-dir", str(root / "driver-data")]
    run_dir = root / label
    run_dir.mkdir()
    times_s, rss, hwm = [], [], []
    with service("driver", args, run_dir) as (driver, ports):
        await wait_for_leader(db, f"localhost:{ports['internal']}", lambda: driver.process.poll() is None)
        progress(f"{NAME}: driver (pid {driver.pid}) leads; sampling for {seconds:g} s")
        started = time.monotonic()
        while (elapsed := time.monotonic() - started) < seconds:
            if driver.process.poll() is not None:
                raise RuntimeError(f"the driver exited with {driver.process.returncode}:\n{driver.log_tail()}")
            now_rss, now_hwm = read_status(driver.pid)
            times_s.append(elapsed)
            rss.append(now_rss)
            hwm.append(now_hwm)
            await asyncio.sleep(SAMPLE_INTERVAL_S)
    log = driver.log_path.read_text(errors="replace")
    kept = out_dir / f"{NAME}-{label}.log"
    kept.write_text(log)
    failed = log.count("cycle failed")
    if failed:
        progress(f"{NAME}: warning: {failed} failed loop cycles in the driver's log ({kept})")
    return MemoryRun(label, times_s, rss, hwm, failed)


def plot(runs: list[MemoryRun], n_jobs: int, path: Path) -> None:
    """Resident memory over time, both runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for run, color in zip(runs, ("grey", "tab:blue")):
        name = "no jobs" if run.label == "empty" else f"{n_jobs:,} Ready jobs"
        ax.plot(run.times_s, [b / MB for b in run.rss_bytes], color=color, label=f"RSS, {name}")
        ax.plot(run.times_s, [b / MB for b in run.hwm_bytes], color=color, linestyle="--", linewidth=1,
                label=f"peak (VmHWM), {name}")
    ax.axhline(TARGET_MB, color="green", linestyle="--", linewidth=1, label=f"target {TARGET_MB:g} MB")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("seconds since the driver became leader")
    ax.set_ylabel("MB")
    ax.set_title("driver memory, loops running, no workers")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    n_jobs = args.jobs or (SMOKE_JOBS if ctx.smoke else DEFAULT_JOBS)
    seconds = args.seconds or (SMOKE_SECONDS if ctx.smoke else DEFAULT_SECONDS)
    n_batches = min(n_jobs, SMOKE_BATCHES if ctx.smoke else N_BATCHES)
    with work_dir() as root:
        async with fresh_database(ctx.server, pool_size=4) as db:
            store = JobStore(db)
            users = [f"user{i}" for i in range(N_USERS)]
            await store.create_billing_project("bench", users)
            await db.execute("UPDATE instance_collections SET max_instances = 0", name="bench_no_workers")
            progress(f"{NAME}: driver on the empty schema")
            empty = await driver_run(db, root, "empty", seconds, ctx.out_dir)
            progress(f"{NAME}: queueing {n_jobs:,} Ready jobs in {n_batches} batches")
            for i in range(n_batches):
                size = n_jobs // n_batches + (1 if i < n_jobs % n_batches else 0)
                await ready_batch(store, users[i % N_USERS], "bench", size)
            progress(f"{NAME}: driver with {n_jobs:,} queued jobs")
            queued = await driver_run(db, root, "queued", seconds, ctx.out_dir)
            row = await db.fetchone("SELECT COUNT(*) AS n FROM jobs WHERE state = 'Ready'")
    if row is None or int(row["n"]) != n_jobs:
        raise RuntimeError(f"expected {n_jobs} Ready jobs at the end, found {row}")

    ctx.figures.add(f"{NAME}.empty.peak_rss", round(empty.peak_mb, 1), "MB")
    ctx.figures.add(f"{NAME}.queued.peak_rss", round(queued.peak_mb, 1), "MB")
    ctx.figures.add(f"{NAME}.queued.end_rss", round(queued.end_mb, 1), "MB")
    plot([empty, queued], n_jobs, ctx.out_dir / f"{NAME}.png")
    return {
        "n_ready_jobs": n_jobs,
        "n_batches": n_batches,
        "n_users": N_USERS,
        "seconds_per_run": seconds,
        "sample_interval_s": SAMPLE_INTERVAL_S,
        "workers": "none: every pool's max_instances is 0",
        "failed_cycles": {"empty": empty.failed_cycles, "queued": queued.failed_cycles},
        "target_mb": TARGET_MB,
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
    }
