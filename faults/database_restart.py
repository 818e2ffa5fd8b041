"""database-restart: MariaDB hangs, then crashes, while a batch runs.

A batch of one-second jobs runs on local workers. Once jobs run, the
program SIGSTOPs MariaDB for `--down` seconds (it hangs: connections stay
open, nothing answers), SIGCONTs it, waits until the API answers again, and
then SIGKILLs it: `corral up` restarts it. It checks that the batch
completes with every job succeeded and nothing lost or recorded twice
(workers keep each completion until it is acknowledged), that no service
process was restarted (each reconnects on its own), and that no worker was
declared dead for the outage (no attempt lost with its worker). It prints
how long the API was away after each phase and how many attempts ran again.
"""

from __future__ import annotations

import argparse
import signal
import time

import corral
from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, alive, eventually, kill, progress

NAME = "database-restart"
HELP = "MariaDB SIGSTOPped for a while, then SIGKILLed and restarted by corral up, while a batch runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="one-second jobs in the batch (default 1,000; 100 with --short)")
    parser.add_argument("--down", type=float, help="seconds MariaDB hangs (default 45; 5 with --short)")


def _api_answers(stack: Stack, batch_id: int) -> bool:
    try:
        with stack.client() as client:
            client.get_batch(batch_id)
        return True
    except corral.CorralError:
        return False


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (100 if args.short else 1000)
    down_s = args.down or (5.0 if args.short else 45.0)
    outcome = Outcome()
    batch_id = stack.submit("fault-database-restart", n_jobs, ["sleep", "1"])
    eventually(lambda: stack.query("SELECT COUNT(*) n FROM jobs WHERE batch_id = %s AND state = 'Running'",
                                   (batch_id,))[0]["n"] > 0, 120, 0.2, "jobs to run")
    services = {pid for pid in (stack.frontend_pid(), *stack.driver_pids().values()) if pid}

    mariadb = stack.mariadb_pid()
    assert mariadb is not None, "no private MariaDB (the fault needs corral up's own)"
    progress(f"{NAME}: MariaDB ({mariadb}) stopped for {down_s:g} s")
    kill(mariadb, signal.SIGSTOP)
    time.sleep(down_s)
    kill(mariadb, signal.SIGCONT)
    resumed = time.monotonic()
    eventually(lambda: _api_answers(stack, batch_id), 120, 0.2, "the API after MariaDB resumed")
    outcome.figure(f"{NAME}.hang.api_back_after", time.monotonic() - resumed, "s")

    progress(f"{NAME}: MariaDB ({mariadb}) killed; corral up restarts it")
    kill(mariadb)
    killed = time.monotonic()
    eventually(lambda: stack.mariadb_pid() not in (None, mariadb), 120, 0.2, "corral up to restart MariaDB")
    eventually(lambda: _api_answers(stack, batch_id), 120, 0.2, "the API after MariaDB's restart")
    outcome.figure(f"{NAME}.crash.api_back_after", time.monotonic() - killed, "s")

    try:
        stack.wait_complete([batch_id], timeout_s=300 + n_jobs)
    except TimeoutError as e:
        outcome.broken.append(str(e))
    if restarted := [pid for pid in services if not alive(pid)]:
        outcome.broken.append(f"service processes had to be restarted: {restarted} are gone")
    lost_workers = stack.lost_attempts(batch_id)
    outcome.figure(f"{NAME}.worker_lost_attempts", lost_workers, "(must be 0)")
    if lost_workers:
        outcome.broken.append(f"{lost_workers} attempts were lost with their worker: {stack.lost_detail(batch_id)}")
    outcome.audit = audit(stack, [batch_id])
    return outcome
