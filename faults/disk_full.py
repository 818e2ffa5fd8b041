"""disk-full: a worker's scratch disk fills up.

The program puts a small tmpfs (`--size` MiB) over the scratch directory of
every live local worker (none may be running an attempt then), and submits
jobs that each write more than that into their working directory. Those
attempts must end as Error (a failure of the system, not the user's Failed)
with a message that names the disk, and the worker must keep serving: a
second batch of ordinary jobs on the same workers, on the same small disk,
all succeed. The tmpfs comes off afterwards (lazily: the attempts' logs
live there). Needs root (mount) on Linux.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from corral.batch.v1 import job_state_pb2
from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, batch, eventually, progress

NAME = "disk-full"
HELP = "a worker's scratch disk fills up: the attempt ends Error naming the disk, the worker goes on"
NEEDS_ROOT = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fillers", type=int, help="jobs that fill the disk (default 20; 3 with --short)")
    parser.add_argument("--jobs", type=int, help="ordinary jobs after them (default 200; 20 with --short)")
    parser.add_argument("--size", type=int, default=16, help="MiB of the small scratch disk (default %(default)s)")


@contextlib.contextmanager
def small_disks(paths: list[Path], size_mib: int) -> Iterator[None]:
    """A tmpfs of `size_mib` over each of `paths`, unmounted (lazily) afterwards."""
    mounted = []
    try:
        for path in paths:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700", "tmpfs", str(path)],
                           check=True, capture_output=True)
            mounted.append(path)
        yield
    finally:
        for path in mounted:
            subprocess.run(["umount", "--lazy", str(path)], capture_output=True)


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_fillers = args.fillers or (3 if args.short else 20)
    n_jobs = args.jobs or (20 if args.short else 200)
    outcome = Outcome()
    with stack.client() as client:
        warm = client.submit(batch("fault-disk-full-warm-up", 4, ["true"])).batch_id
    stack.wait_complete([warm], 180)

    def idle_workers() -> dict[str, int] | None:
        workers = stack.worker_pids()
        busy = {r["instance_name"] for r in stack.query("SELECT DISTINCT instance_name FROM attempts "
                                                        "WHERE end_time_ms IS NULL")}
        return workers if workers and not busy & workers.keys() else None

    workers = eventually(idle_workers, 120, 0.5, "live workers running nothing")
    scratch = [stack.data_dir / "workers" / name for name in workers]
    batch_ids = []
    with small_disks(scratch, args.size):
        progress(f"{NAME}: {args.size} MiB scratch disks under {', '.join(workers)}")
        with stack.client() as client:
            fill = f"dd if=/dev/zero of=fill bs=1M count={4 * args.size}"
            filled = client.submit(batch("fault-disk-full", n_fillers, ["sh", "-c", fill])).batch_id
            batch_ids.append(filled)
            stack.wait_complete([filled], 300)
            errors = [client.get_job(filled, job_id) for job_id in range(1, n_fillers + 1)]
            started = time.monotonic()
            after = client.submit(batch("fault-disk-full-after", n_jobs, ["true"])).batch_id
            batch_ids.append(after)
            try:
                stack.wait_complete([after], 300 + n_jobs)
                outcome.figure(f"{NAME}.after", time.monotonic() - started, f"s for {n_jobs} jobs")
            except TimeoutError as e:
                outcome.broken.append(str(e))
        ran_there = {r["instance_name"] for r in stack.query("SELECT DISTINCT instance_name FROM attempts "
                                                             "WHERE batch_id = %s", (after,))}
    named = [job for job in errors if job.state == job_state_pb2.JOB_STATE_ERROR and "disk" in job.error_message]
    outcome.figure(f"{NAME}.errors_naming_the_disk", len(named), f"of {n_fillers} fillers")
    if len(named) != n_fillers:
        outcome.broken.append("fillers that did not end Error naming the disk: " + "; ".join(
            f"{job_state_pb2.JobState.Name(job.state)}: {job.error_message!r}" for job in errors if job not in named))
    elif errors:
        progress(f"{NAME}: e.g. {errors[0].error_message!r}")
    if not ran_there & workers.keys():
        outcome.broken.append("no ordinary job ran on a worker whose disk had filled")
    outcome.audit = audit(stack, [batch_ids[1]])
    if (found := audit(stack, [batch_ids[0]], expect_success=False)).duplicated:
        outcome.broken.append(f"{found.duplicated} fillers were recorded twice")
    return outcome
