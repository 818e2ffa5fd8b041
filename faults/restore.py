"""restore: the database's disk lost while a batch runs, and corral brought back from a backup.

A batch of two-second jobs runs on local workers. Once a third of its jobs
have ended, `corral db backup --data-dir DATA` takes a backup while the
rest run; more jobs end after it, and a second batch is submitted after it.
Then the disk that held the database dies: `corral up` is stopped, the data
directory's `mariadb/` is removed, and `corral up --restore FILE` starts on
the same data directory (its certificates, keys and passwords kept, as
docs/operations.md says to keep them beside the backups).

It checks that the first batch completes with every job succeeded, nothing
recorded twice and the invariant checker clean: the attempts that were
running at backup time, and those that ended after it (their completions
were lost with the disk), are ended as lost with their workers and run
again, never left open; and that the second batch, submitted after the
backup, is gone (not found), as the backup predates it. It prints the
backup's size and time, how long `corral up --restore` took, and how many
jobs ran again.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import corral
from faults import Outcome
from faults.audit import audit
from faults.stack import UP_ARGS, Stack, eventually, progress
from services.up import process as up_process

NAME = "restore"
HELP = "the database's disk lost while a batch runs; corral up --restore from a backup taken under load"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="two-second jobs in the batch (default 2,000; 200 with --short)")


def _ended(stack: Stack, batch_id: int) -> int:
    return int(stack.query("SELECT COUNT(*) n FROM jobs WHERE batch_id = %s AND state = 'Success'",
                           (batch_id,))[0]["n"])


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (200 if args.short else 2000)
    outcome = Outcome()
    first = stack.submit("fault-restore", n_jobs, ["sleep", "2"])
    eventually(lambda: _ended(stack, first) >= n_jobs // 3, 300 + n_jobs, 0.2, "a third of the jobs to end")
    with tempfile.TemporaryDirectory(prefix="corral-backup-") as tmp:
        path = Path(tmp) / "corral.sql.gz"
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "corral.cli", "db", "backup", "--data-dir", str(stack.data_dir),
                               str(path)], cwd=up_process.REPO_DIR, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            outcome.broken.append(f"corral db backup failed: {done.stderr.strip()}")
            return outcome
        outcome.figure(f"{NAME}.backup", time.monotonic() - began, f"s ({path.stat().st_size / 1e6:.2f} MB)")
        at_backup = _ended(stack, first)
        if at_backup == n_jobs:
            outcome.broken.append("the batch ended before the disk died: nothing was tested (more --jobs)")
            return outcome
        eventually(lambda: _ended(stack, first) > at_backup, 120, 0.2, "a job to end after the backup")
        second = stack.submit("fault-restore-after-backup", 10, ["true"])
        lost_with_disk = _ended(stack, first) - at_backup
        progress(f"{NAME}: backed up with about {at_backup} of {n_jobs} jobs ended; the disk dies with "
                 f"{at_backup + lost_with_disk} ended and batch {second} submitted since")
        stack.up.stop()
        shutil.rmtree(stack.data_dir / "mariadb")
        began = time.monotonic()
        stack.up = up_process.start(stack.data_dir.parent, *UP_ARGS, "--restore", str(path))
        outcome.figure(f"{NAME}.up_again", time.monotonic() - began, "s (corral up --restore until it serves)")
    if not any("database: restored" in line for line in stack.up.output):
        outcome.broken.append("corral up --restore did not say what it restored")
    try:
        outcome.figure(f"{NAME}.complete_after_restore", stack.wait_complete([first], timeout_s=300 + n_jobs),
                       "s")
    except TimeoutError as e:
        outcome.broken.append(str(e))
    outcome.figure(f"{NAME}.ended_after_backup", lost_with_disk, "jobs whose completion the disk took (at least)")
    lost = stack.lost_attempts(first)
    outcome.figure(f"{NAME}.attempts_ended_as_lost", lost, "running at backup time (or ended since): run again")
    if not lost:
        outcome.broken.append("no attempt running at backup time was ended as lost with its worker")
    if open_attempts := int(stack.query("SELECT COUNT(*) n FROM attempts WHERE batch_id = %s AND end_time_ms IS NULL",
                                        (first,))[0]["n"]):
        outcome.broken.append(f"{open_attempts} attempts are still open after the batch completed")
    try:
        with stack.client() as client:
            client.get_batch(second)
        outcome.broken.append(f"batch {second}, submitted after the backup, is there after the restore")
    except corral.CorralError as e:
        if e.code.name != "NOT_FOUND":
            outcome.broken.append(f"GetBatch of the batch submitted after the backup: {e.code.name}, not NOT_FOUND")
    outcome.audit = audit(stack, [first])
    return outcome
