"""paused-leader: the leading driver SIGSTOPped for longer than its lease, then resumed.

A batch of one-second jobs runs on local workers. The program SIGSTOPs the
leading driver (it keeps its connections, as a process in a long pause or
behind a partition does), waits until another driver leads, keeps it
stopped for `--pause` seconds in all, then SIGCONTs it. It checks that a
standby took over while the old leader was frozen, that the workers moved
to the new leader (jobs completed again while the old one was still
frozen, and no attempt was lost with its worker), that the old leader,
once resumed, wrote nothing (every write it tried was refused by the
fencing epoch: counted from its log) and stepped down, and that the batch
completes with every job succeeded, nothing lost or recorded twice.
"""

from __future__ import annotations

import argparse
import re
import signal
import time

from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, eventually, kill, progress

NAME = "paused-leader"
HELP = "SIGSTOP the leading driver past its lease, let a standby take over, then SIGCONT it"

FENCED = re.compile(r"StaleEpoch|stale epoch", re.IGNORECASE)
"""How a driver's log shows a write refused for its old epoch."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="one-second jobs in the batch (default 1,000; 200 with --short)")
    parser.add_argument("--pause", type=float, help="seconds the leader stays stopped (default 30; 15 with "
                                                    "--short); at least until another leads")


def _database_ms(stack: Stack) -> int:
    return int(stack.query("SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED) ms")[0]["ms"])


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (200 if args.short else 1000)
    pause_s = args.pause or (15.0 if args.short else 30.0)
    outcome = Outcome()
    batch_id = stack.submit("fault-paused-leader", n_jobs, ["sleep", "1"])
    eventually(lambda: stack.query("SELECT COUNT(*) n FROM jobs WHERE batch_id = %s AND state = 'Success'",
                                   (batch_id,))[0]["n"] > 0, 180, 0.2, "jobs to complete")
    epoch, address, pid = eventually(stack.leader, 60, 0.1, "a leader")
    marks = stack.log_marks()
    kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    progress(f"{NAME}: leader {address} (pid {pid}, epoch {epoch}) stopped")
    try:
        try:
            eventually(lambda: (now := stack.leader()) is not None and now[0] > epoch, max(pause_s, 60), 0.1,
                       "a standby to take over")
            outcome.figure(f"{NAME}.takeover", time.monotonic() - stopped, "s")
            took_over_ms = _database_ms(stack)
            eventually(lambda: stack.query("SELECT COUNT(*) n FROM attempts WHERE batch_id = %s AND end_time_ms > %s",
                                           (batch_id, took_over_ms))[0]["n"] > 0, max(pause_s, 60), 0.2,
                       "a job to complete under the new leader")
            outcome.figure(f"{NAME}.progress_after_takeover",
                           time.monotonic() - stopped - outcome.figures[-1][1], "s")
        except TimeoutError as e:
            outcome.broken.append(f"while the leader was stopped: {e}")
        time.sleep(max(0.0, pause_s - (time.monotonic() - stopped)))
    finally:
        kill(pid, signal.SIGCONT)
    progress(f"{NAME}: leader {address} resumed after {time.monotonic() - stopped:.1f} s")
    try:
        stack.wait_complete([batch_id], timeout_s=300 + n_jobs)
    except TimeoutError as e:
        outcome.broken.append(str(e))
    fenced = len(FENCED.findall(stack.logs_since(marks, f"{stack.service_name(pid)}.log")))
    outcome.figure(f"{NAME}.fenced_writes", fenced, "refused writes of the old leader")
    now = stack.leader()
    if now is not None and now[2] == pid and now[0] == epoch:
        outcome.broken.append("the old leader still leads with its old epoch")
    lost = stack.lost_attempts(batch_id)
    outcome.figure(f"{NAME}.lost_attempts", lost, "(must be 0)")
    if lost:
        outcome.broken.append(f"{lost} attempts were lost with their worker: {stack.lost_detail(batch_id)}")
    outcome.audit = audit(stack, [batch_id])
    return outcome

