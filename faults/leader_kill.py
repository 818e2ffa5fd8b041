"""leader-kill: the leading driver SIGKILLed again and again during a run.

A batch of short jobs runs on local workers. Every `--interval` seconds the
program SIGKILLs the driver that leads, waits until another leads (a higher
epoch in the database, held by a live driver) and until `corral up` has
restarted the killed one, and kills again, `--kills` times or until the
batch completes. It checks that the batch completes with every job
succeeded, nothing lost or recorded twice, and that every kill was
followed by a new leader. It prints the failover time (kill to new leader)
and the restart time (kill to the killed driver running again) at p50,
p99 and max.
"""

from __future__ import annotations

import argparse
import time

from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, eventually, kill, progress

NAME = "leader-kill"
HELP = "SIGKILL the leading driver again and again while a batch runs"

FAILOVER_GOAL_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="jobs in the batch (default 10,000; 200 with --short)")
    parser.add_argument("--sleep", type=float, default=2.0, help="seconds each job sleeps (default %(default)s)")
    parser.add_argument("--kills", type=int, help="kills of the leader (default 100; 3 with --short)")
    parser.add_argument("--interval", type=float, default=3.0,
                        help="seconds between a restart and the next kill (default %(default)s)")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (200 if args.short else 10_000)
    n_kills = args.kills or (3 if args.short else 100)
    outcome = Outcome()
    batch_id = stack.submit("fault-leader-kill", n_jobs, ["sleep", f"{args.sleep:g}"])
    n_drivers = len(stack.driver_pids())
    failovers, restarts = [], []
    for n in range(n_kills):
        if stack.batch_state(batch_id) == "complete":
            outcome.broken.append(f"the batch completed after {n} of {n_kills} kills: make it longer (--jobs)")
            break
        epoch, address, pid = eventually(stack.leader, 60, 0.1, "a leader")
        kill(pid)
        killed = time.monotonic()
        progress(f"{NAME}: kill {n + 1} of {n_kills}: driver {address} (pid {pid}, epoch {epoch})")
        try:
            eventually(lambda: (now := stack.leader()) is not None and now[0] > epoch, 60, 0.05, "a new leader")
            failovers.append(time.monotonic() - killed)
            eventually(lambda: len(stack.driver_pids()) == n_drivers and pid not in stack.driver_pids().values(),
                       120, 0.1, f"corral up to restart the driver {address}")
            restarts.append(time.monotonic() - killed)
        except TimeoutError as e:
            outcome.broken.append(str(e))
            break
        time.sleep(args.interval)
    outcome.figure(f"{NAME}.kills", len(failovers), "")
    for q, label in ((0.5, "p50"), (0.99, "p99"), (1.0, "max")):
        outcome.figure(f"{NAME}.failover.{label}", _percentile(failovers, q), "s")
    for q, label in ((0.5, "p50"), (1.0, "max")):
        outcome.figure(f"{NAME}.restart.{label}", _percentile(restarts, q), "s")
    if failovers and _percentile(failovers, 0.99) > FAILOVER_GOAL_S:
        progress(f"{NAME}: failover p99 is over the goal of {FAILOVER_GOAL_S:g} s")
    try:
        stack.wait_complete([batch_id], timeout_s=300 + n_jobs * args.sleep / 4)
    except TimeoutError as e:
        outcome.broken.append(str(e))
    outcome.audit = audit(stack, [batch_id])
    return outcome
