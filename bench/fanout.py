"""fanout: one parent with a million children, completed and cancelled.

Three batches, each one parent job and N children that depend on it (the
default N is 1,000,000), built directly in the database through `JobStore`
(parallel `insert_jobs` bunches, `commit_update`; the children are Pending
behind their parent), the parent scheduled on an instance and started.
Everything then runs as the leading driver runs it, in this process under
a leader epoch of its own:

  release  MJC reports the parent Success: it releases the first thousand
           children itself and queues the rest; the driver's real
           `ChildReleaser` loop releases them in chunks until every child is
           Ready. Figures: the MJC call's latency and the children made
           Ready per second (from the MJC call to the last chunk).
  cancel   The batch is cancelled while its parent runs. The driver's real
           `ReadyCanceller` (its pass over Pending jobs of cancelled groups)
           and `ChildReleaser` run until every child is Cancelled: the drain
           rate. Then the parent is reported Cancelled (as the running
           canceller's stop ends) and the releaser counts down the cancelled
           children's pending parent until the batch is complete: the
           seconds this settling takes.
  fail     MJC reports the parent Failed: the releaser makes every child
           Ready with a failed dependency and the canceller's pass over
           Ready jobs (5,000 per cycle) cancels them, until the batch is
           complete: children per second.

With a local server (the private one, or a --database-url on this
machine that this user may read), the peak resident memory of the MariaDB
process during each phase is a figure too (VmHWM, reset before the phase
when the kernel allows it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import BenchContext, fresh_database, positive_int, progress
from services.db.database import Database
from services.db.store import INLINE_CHILDREN, JobStore
from services.driver.canceller import ReadyCanceller
from services.driver.loop import Loop
from services.driver.releaser import ChildReleaser
from services.driver.store import DriverStore

NAME = "fanout"
HELP = "complete and cancel a parent of 1M children: release and drain rates, the database's memory"

DEFAULT_CHILDREN = 1_000_000
SMOKE_CHILDREN = 3_000
PHASES = ("release", "cancel", "fail")
INSERT_BUNCH = 5000
PARALLEL_BUNCHES = 4
USER, BILLING_PROJECT, INSTANCE = "bench", "bench", "bench-i1"
STALL_S = 600.0
"""A phase that makes no progress for this long is a failure, not a figure."""

TARGET_DRAIN_JOBS_PER_S = 20_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--children", type=positive_int, metavar="N",
                        help=f"children of each parent (default {DEFAULT_CHILDREN:,}; {SMOKE_CHILDREN:,} with --smoke)")
    parser.add_argument("--inline", type=int, default=INLINE_CHILDREN, metavar="N",
                        help="children MJC releases itself (default %(default)s)")
    parser.add_argument("--release-chunk", type=positive_int, default=5000, metavar="N",
                        help="children per releaser transaction (default %(default)s)")
    parser.add_argument("--pending-chunk", type=positive_int, default=5000, metavar="N",
                        help="Pending jobs the canceller drains per cycle (default %(default)s)")


def figure_names(with_memory: bool) -> list[str]:
    """The names of every figure a run prints, in order."""
    names = {"release": ["mjc_ms", "jobs_per_s"], "cancel": ["jobs_per_s", "settle_s"], "fail": ["jobs_per_s"]}
    return [f"{NAME}.{phase}.{what}" for phase in PHASES
            for what in names[phase] + (["db_peak_mb"] if with_memory else [])]


# -- the database server's memory -------------------------------------------


@dataclasses.dataclass
class ServerMemory:
    """The MariaDB process's /proc status, if this process may read it."""

    pid: int

    @classmethod
    async def find(cls, db: Database) -> ServerMemory | None:
        row = await db.fetchone("SELECT @@pid_file AS pid_file", name="bench_pid_file")
        try:
            pid = int(Path(row["pid_file"]).read_text().split()[0]) if row else 0
            Path(f"/proc/{pid}/status").read_text()
        except (OSError, ValueError, IndexError):
            return None
        return cls(pid)

    def reset_peak(self) -> None:
        """Start VmHWM again from the current size (5 to clear_refs; the owner may)."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def peak_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM in /proc status")


# -- building ----------------------------------------------------------------


async def fan_out_batch(store: JobStore, n_children: int) -> tuple[int, int]:
    """A committed batch of one parent and `n_children` children depending on it; (batch_id, parent)."""
    started = time.perf_counter()
    batch_id = int((await store.create_batch(USER, BILLING_PROJECT))["batch_id"])
    update = await store.create_update(batch_id, n_children + 1)
    update_id, parent = int(update["update_id"]), int(update["start_job_id"])
    limit = asyncio.Semaphore(PARALLEL_BUNCHES)

    async def insert(first: int) -> None:
        rows = [{"job_id": job_id, "job_group_id": 0, "cores_mcpu": 1000, "inst_coll": "standard",
                 **({"parents": [{"job_id": parent}]} if job_id > parent else {})}
                for job_id in range(parent + first, parent + min(first + INSERT_BUNCH, n_children + 1))]
        async with limit:
            await store.insert_jobs(batch_id, update_id, rows)

    await asyncio.gather(*(insert(first) for first in range(0, n_children + 1, INSERT_BUNCH)))
    await store.commit_update(batch_id, update_id)
    progress(f"  batch {batch_id}: a parent and {n_children:,} children in {time.perf_counter() - started:.1f} s")
    return batch_id, parent


async def start_parent(store: JobStore, epoch: int, batch_id: int, parent: int) -> str:
    """SJ and MJS of the parent; returns its attempt id."""
    attempt = f"bench-{batch_id}"
    job = {"batch_id": batch_id, "job_id": parent, "attempt_id": attempt}
    outcome = await store.schedule_jobs(epoch, INSTANCE, [job])
    if outcome[0]["outcome"] != "scheduled":
        raise RuntimeError(f"the parent was not scheduled: {outcome}")
    await store.mark_jobs_started(epoch, INSTANCE, [{**job, "start_time_ms": store.clock_ms()}])
    return attempt


async def report(store: JobStore, epoch: int, batch_id: int, parent: int, attempt: str, state: str,
                 inline: int) -> None:
    outcome = await store.mark_jobs_complete(epoch, INSTANCE, [
        {"batch_id": batch_id, "job_id": parent, "attempt_id": attempt, "state": state,
         "exit_code": 0 if state == "Success" else 1, "end_time_ms": store.clock_ms()}], max_children=inline)
    if outcome[0]["outcome"] != "completed":
        raise RuntimeError(f"the parent's completion was refused: {outcome}")


# -- running the loops -------------------------------------------------------


async def children_in(db: Database, batch_id: int, parent: int, state: str) -> int:
    row = await db.fetchone("SELECT COUNT(*) AS n FROM jobs FORCE INDEX (jobs_group_state) "
                            "WHERE batch_id = %s AND job_group_id = 0 AND state = %s AND job_id > %s",
                            (batch_id, state, parent), name="bench_children_in")
    return int(row["n"]) if row else 0


async def queue_length(db: Database) -> int:
    row = await db.fetchone("SELECT COUNT(*) AS n FROM job_child_releases", name="bench_queue_length")
    return int(row["n"]) if row else 0


async def batch_state(db: Database, batch_id: int) -> str:
    row = await db.fetchone("SELECT state FROM batches WHERE batch_id = %s", (batch_id,), name="bench_batch_state")
    return str(row["state"]) if row else "missing"


async def run_until(loops: list[Loop], done: Callable[[], Awaitable[bool]], progress_of: Callable[[], object]) -> None:
    """Run `loops` until `await done()`; fail if a loop's cycle fails or nothing moves for STALL_S."""
    tasks = [asyncio.create_task(loop.run()) for loop in loops]
    try:
        last, last_moved = None, time.perf_counter()
        while not await done():
            waiters = [asyncio.create_task(loop.wait_cycles(1, timeout_s=STALL_S)) for loop in loops]
            _, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            for waiter in pending:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
            if any(loop.failures for loop in loops):
                raise RuntimeError("a loop's cycle failed; see the log above")
            now = progress_of()
            if now != last:
                last, last_moved = now, time.perf_counter()
            elif time.perf_counter() - last_moved > STALL_S:
                raise RuntimeError(f"no progress for {STALL_S:.0f} s (at {now})")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# -- the phases --------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    n_children: int
    inline: int
    release_chunk: int
    pending_chunk: int


async def phase_release(db: Database, store: DriverStore, epoch: int, s: Settings) -> dict[str, float]:
    batch_id, parent = await fan_out_batch(store, s.n_children)
    attempt = await start_parent(store, epoch, batch_id, parent)
    releaser = ChildReleaser(store, lambda: epoch, per_call=s.release_chunk)
    progress(f"{NAME}: the parent succeeds; releasing {s.n_children:,} children")
    started = time.perf_counter()
    await report(store, epoch, batch_id, parent, attempt, "Success", s.inline)
    mjc_s = time.perf_counter() - started

    async def done() -> bool:
        return await queue_length(db) == 0

    await run_until([releaser], done, lambda: releaser.released_total)
    elapsed = time.perf_counter() - started
    ready = await children_in(db, batch_id, parent, "Ready")
    if ready != s.n_children:
        raise RuntimeError(f"{ready:,} of {s.n_children:,} children are Ready")
    return {"mjc_ms": round(mjc_s * 1000, 2), "jobs_per_s": round(s.n_children / elapsed, 1)}


def driver_loops(db: Database, store: DriverStore, epoch: int, s: Settings) -> tuple[ReadyCanceller, ChildReleaser]:
    """The canceller and the releaser, each waking the other as services/driver/app.py wires them."""
    releaser = ChildReleaser(store, lambda: epoch, per_call=s.release_chunk, on_released=lambda: canceller.notify())
    canceller = ReadyCanceller(store, lambda: epoch, pending_per_cycle=s.pending_chunk,
                               on_cancelled=releaser.notify)
    return canceller, releaser


async def phase_cancel(db: Database, store: DriverStore, epoch: int, s: Settings) -> dict[str, float]:
    batch_id, parent = await fan_out_batch(store, s.n_children)
    attempt = await start_parent(store, epoch, batch_id, parent)
    canceller, releaser = driver_loops(db, store, epoch, s)
    progress(f"{NAME}: cancelling the batch while its parent runs; draining {s.n_children:,} children")
    await store.cancel_job_group(batch_id, 0, USER, "bench")
    started = time.perf_counter()

    async def drained() -> bool:
        return canceller.cancelled_total >= s.n_children

    await run_until([canceller, releaser], drained, lambda: canceller.cancelled_total)
    drain_s = time.perf_counter() - started
    if await children_in(db, batch_id, parent, "Cancelled") != s.n_children:
        raise RuntimeError("not every child was cancelled")

    progress(f"{NAME}: the parent is stopped; settling the batch")
    started = time.perf_counter()
    await report(store, epoch, batch_id, parent, attempt, "Cancelled", s.inline)

    async def complete() -> bool:
        return await queue_length(db) == 0 and await batch_state(db, batch_id) == "complete"

    await run_until([canceller, releaser], complete, lambda: releaser.released_total)
    return {"jobs_per_s": round(s.n_children / drain_s, 1), "settle_s": round(time.perf_counter() - started, 2)}


async def phase_fail(db: Database, store: DriverStore, epoch: int, s: Settings) -> dict[str, float]:
    batch_id, parent = await fan_out_batch(store, s.n_children)
    attempt = await start_parent(store, epoch, batch_id, parent)
    canceller, releaser = driver_loops(db, store, epoch, s)
    progress(f"{NAME}: the parent fails; releasing and cancelling {s.n_children:,} children")
    started = time.perf_counter()
    await report(store, epoch, batch_id, parent, attempt, "Failed", s.inline)

    async def complete() -> bool:
        return await batch_state(db, batch_id) == "complete"

    await run_until([canceller, releaser], complete, lambda: (releaser.released_total, canceller.cancelled_total))
    return {"jobs_per_s": round(s.n_children / (time.perf_counter() - started), 1)}


PHASE_RUNNERS = {"release": phase_release, "cancel": phase_cancel, "fail": phase_fail}


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    settings = Settings(args.children or (SMOKE_CHILDREN if ctx.smoke else DEFAULT_CHILDREN), args.inline,
                        args.release_chunk, args.pending_chunk)
    results: dict[str, dict[str, float]] = {}
    async with fresh_database(ctx.server, pool_size=8) as db:
        store = DriverStore(db)
        await store.create_billing_project(BILLING_PROJECT, [USER])
        epoch = await store.elect_leader("bench-fanout")
        await store.create_instance(epoch, INSTANCE, "standard", 10_000_000, "bench-token")
        await store.activate_instance(epoch, INSTANCE, "bench-token")
        memory = await ServerMemory.find(db)
        for phase in PHASES:
            progress(f"{NAME}: {phase}: building a batch of a parent and {settings.n_children:,} children")
            if memory is not None:
                memory.reset_peak()
            figures = await PHASE_RUNNERS[phase](db, store, epoch, settings)
            if memory is not None:
                figures["db_peak_mb"] = round(memory.peak_mb(), 1)
            results[phase] = figures
            for what, value in figures.items():
                unit = {"mjc_ms": "ms", "jobs_per_s": "jobs/s", "settle_s": "s", "db_peak_mb": "MB"}[what]
                ctx.figures.add(f"{NAME}.{phase}.{what}", value, unit)
    return {
        "n_children": settings.n_children,
        "inline_children": settings.inline,
        "release_chunk": settings.release_chunk,
        "pending_chunk": settings.pending_chunk,
        "loops": "services.driver.releaser.ChildReleaser, services.driver.canceller.ReadyCanceller, in this process",
        "server_memory": "VmHWM of the MariaDB process" if memory is not None else "not readable",
        "smoke": ctx.smoke,
        "server": "given by --database-url" if args.database_url else "private MariaDB, durable settings",
        "phases": results,
    }
