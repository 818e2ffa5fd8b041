"""`corral locks`: the lock monitor, a table like Ganeti's `gnt-debug locks`.

One line per lock held by a running job or wanted by a ready one: its
billing project, its name (`level/name`; `level/[all]` for a hold on the
whole level, `*` for the big lock), the mode its holders hold it in, the
holders (`batch/job`) and the waiters by mode, in the order the scheduler
tries them. `--json` prints the API's LockStatus messages.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

from corral.batch.v1 import job_spec_pb2, lock_pb2
from corral.cli_common import open_client, print_json, with_json
from corral.refusal_words import Option, option_words

HEADER = ("PROJECT", "LOCK", "MODE", "HOLDERS", "WAITERS")


def mode_name(mode: int) -> str:
    return job_spec_pb2.LockMode.Name(mode).removeprefix("LOCK_MODE_").lower()


def lock_name(lock: lock_pb2.LockStatus) -> str:
    if lock.level == "*":
        return "*"
    return f"{lock.level}/{lock.name}" if lock.name else f"{lock.level}/[all]"


def _job(ref: Any) -> str:
    return f"{ref.batch_id}/{ref.job_id}"


def lock_row(lock: lock_pb2.LockStatus) -> tuple[str, ...]:
    """The table's cells for one lock."""
    modes = list(dict.fromkeys(mode_name(h.mode) for h in lock.holders))
    waiting = " ".join(f"{mode_name(mode)}:{','.join(_job(w.job) for w in group)}"
                       for mode, group in itertools.groupby(lock.waiters, key=lambda w: w.mode))
    more = lock.n_waiters - len(lock.waiters)
    if more > 0:
        waiting += f" (+{more} more)"
    return (lock.billing_project, lock_name(lock), ",".join(modes) or "-",
            ",".join(_job(h.job) for h in lock.holders) or "-", waiting or "-")


def table(rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell; the last is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths)), row[-1]]) for row in rows]


def _locks(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        locks = list(client.locks(args.project or "", args.level or "", args.name or ""))
    if args.json:
        print_json(locks)
    elif not locks:
        print("no lock is held or wanted")
    else:
        for line in table([HEADER, *(lock_row(lock) for lock in locks)]):
            print(line)
    return 0


def add_commands(commands: Any) -> None:
    """Add locks."""
    locks = with_json(commands.add_parser(
        "locks", help="show each lock, who holds it and who waits for it (like Ganeti's lock monitor)"))
    locks.add_argument("--project", help="only this billing project's locks (default: every project you see)")
    locks.add_argument("--level", help="only locks at this level")
    locks.add_argument("--name", help="only the lock of this name (with --level)")
    locks.set_defaults(run=_locks, words=option_words({
        "billing_project": Option("--project"), "level": Option("--level"), "name": Option("--name")}))
