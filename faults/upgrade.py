"""upgrade: corral upgraded in place while a batch runs.

The previous release is a commit of this repository (`--from REV`; by
default the parent of the commit that added the newest migration, so that
the upgrade applies a migration to a live database). The program exports
that commit's tree (`git archive`) and runs its `corral up` on a data
directory of its own, submits a batch of short jobs, and once a third of
them have ended stops it (SIGTERM, as an operator stops a release: its
workers stop their jobs and report them) and starts this checkout's
`corral up` on the same data directory. Its migrations run on the live
database that holds the running batch; its drivers take the batch over.

It checks that the batch completes with every job succeeded, nothing lost
or recorded twice, the invariant checker clean, and nothing left to
migrate (`corral db status`). It prints how long the old release took to
stop and the new one to serve, and how many jobs ran again (an attempt the
old release's workers stopped is run again: a stop is not the job's
failure). The fault needs git and the repository's history (a clean clone
has it).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

from faults import Outcome
from faults.audit import audit
from faults.stack import UP_ARGS, Stack, eventually, progress
from services.db.migrations import status
from services.up import process as up_process

NAME = "upgrade"
HELP = "the previous release stopped and this one started on the same data directory while a batch runs"
OWN_DEPLOYMENT = True
"""It starts its own `corral up`s (the previous release's, then this one's); `--work-dir` is not used."""

LINKED = (".tools",)
"""What the exported tree borrows from this checkout: the tools scripts/setup.sh installed (not in git)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="half-second jobs in the batch (default 20,000; 200 with --short)")
    parser.add_argument("--from", dest="rev", metavar="REV",
                        help="the release upgraded from (default: the commit before the newest migration)")


def _git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=up_process.REPO_DIR, check=True, capture_output=True).stdout


def unavailable() -> str | None:
    """Why this fault cannot run here, if it cannot: it needs the repository's history."""
    try:
        previous_release()
    except (subprocess.CalledProcessError, OSError) as e:
        return f"the upgrade fault needs git and this repository's history ({e})"
    return None


def previous_release() -> str:
    """The parent of the commit that added the newest migration."""
    added = _git("log", "-1", "--diff-filter=A", "--format=%H", "--", "sql/migrations").decode().strip()
    return _git("rev-parse", f"{added}^").decode().strip()


def export(rev: str, into: Path) -> Path:
    """The tree of `rev`, written under `into`, with this checkout's tools beside its code."""
    tree = into / f"corral-{rev[:12]}"
    tree.mkdir()
    with tarfile.open(fileobj=io.BytesIO(_git("archive", "--format=tar", rev))) as archive:
        archive.extractall(tree, filter="fully_trusted")
    for name in LINKED:
        if (up_process.REPO_DIR / name).exists():
            (tree / name).symlink_to(up_process.REPO_DIR / name)
    return tree


def _ended(stack: Stack, batch_id: int) -> int:
    return int(stack.query("SELECT COUNT(*) n FROM jobs WHERE batch_id = %s AND state = 'Success'",
                           (batch_id,))[0]["n"])


def inject(stack: Stack | None, args: argparse.Namespace) -> Outcome:
    """`stack` is not used: an upgrade needs a deployment that began on the previous release."""
    n_jobs = args.jobs or (200 if args.short else 20_000)
    rev = args.rev or previous_release()
    outcome = Outcome()
    with tempfile.TemporaryDirectory(prefix="corral-upgrade-") as tmp, contextlib.ExitStack() as stopping:
        tree = export(_git("rev-parse", rev).decode().strip(), Path(tmp))
        work_dir = Path(tmp) / "work"
        work_dir.mkdir()
        progress(f"{NAME}: corral up of {rev} ({tree.name}) in {work_dir}")
        old = Stack(up_process.start(work_dir, *UP_ARGS, repo=tree))
        stopping.callback(lambda: old.up.stop())
        batch_id = old.submit("fault-upgrade", n_jobs, ["sleep", "0.5"])
        eventually(lambda: _ended(old, batch_id) >= n_jobs // 3, 300 + n_jobs, 0.2, "a third of the jobs to end")
        progress(f"{NAME}: {_ended(old, batch_id)} of {n_jobs} jobs ended; stopping {rev[:12]}")
        migrations = "SELECT COUNT(*) n FROM corral_migrations"
        before = int(old.query(migrations)[0]["n"])
        began = time.monotonic()
        old.up.stop()
        outcome.figure(f"{NAME}.old_stopped", time.monotonic() - began, "s")
        began = time.monotonic()
        new = Stack(up_process.start(work_dir, *UP_ARGS))
        stopping.callback(lambda: new.up.stop())
        outcome.figure(f"{NAME}.new_serving", time.monotonic() - began, "s (its migrations included)")
        applied = int(new.query(migrations)[0]["n"]) - before
        outcome.figure(f"{NAME}.migrations_applied", applied, "on the live database")
        if args.rev is None and not applied:
            outcome.broken.append("the upgrade applied no migration: did the old release run this checkout's code?")
        try:
            outcome.figure(f"{NAME}.complete_after_upgrade",
                           new.wait_complete([batch_id], timeout_s=300 + n_jobs / 5), "s")
        except TimeoutError as e:
            outcome.broken.append(str(e))
        if left := [f"{line.name} {line.state}" for line in status(new.database()) if line.state != "applied"]:
            outcome.broken.append(f"not applied after the upgrade: {', '.join(left)}")
        outcome.audit = audit(new, [batch_id])
    return outcome
