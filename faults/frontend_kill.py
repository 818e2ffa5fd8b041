"""frontend-kill: the frontend SIGKILLed in the middle of a large submission.

The client submits a batch in bunches; once a quarter of its jobs are
written the program SIGKILLs the frontend. `corral up` restarts it (on the same
address); the program then submits the same builder again, as a user would
after the error (the first submission may also finish by itself: the client
retries a bunch refused while the frontend is away). It checks that there is exactly one batch of that builder,
with exactly every job once, then cancels it (the jobs themselves are not
the point) and audits it: nothing half-written, nothing counted twice. It
prints how far the first submission got, how long the frontend was away,
and how long the second submission took.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid

import corral
from faults import Outcome
from faults.audit import audit
from faults.stack import Stack, batch, eventually, kill, progress

NAME = "frontend-kill"
HELP = "the frontend SIGKILLed during a large submission, then the same builder resubmitted"

BUNCH = 100
"""Jobs per bunch: small, so that the kill lands between bunches of even the short version."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, help="jobs in the batch (default 20,000; 2,000 with --short)")


def inject(stack: Stack, args: argparse.Namespace) -> Outcome:
    n_jobs = args.jobs or (2000 if args.short else 20_000)
    outcome = Outcome()
    name = f"fault-frontend-kill-{uuid.uuid4().hex[:8]}"
    builder = batch(name, n_jobs, ["true"])
    first: dict[str, object] = {}

    def submit() -> None:
        try:
            with stack.client() as client:
                first["batch"] = client.submit(builder, bunch_size=BUNCH, parallelism=2)
        except corral.CorralError as e:
            first["error"] = e

    frontend = stack.frontend_pid()
    assert frontend is not None, "no frontend"
    thread = threading.Thread(target=submit, daemon=True)
    thread.start()

    def jobs_written() -> int:
        rows = stack.query("SELECT COUNT(*) n FROM jobs j JOIN batch_attributes a USING (batch_id) "
                           "WHERE a.`key` = 'name' AND a.`value` = %s", (name,))
        return int(rows[0]["n"])

    eventually(lambda: jobs_written() >= n_jobs // 4 or not thread.is_alive(), 60, 0.01,
               "a quarter of the jobs to be written")
    kill(frontend)
    killed = time.monotonic()
    written = jobs_written()
    thread.join(60)
    progress(f"{NAME}: frontend {frontend} killed with {written} of {n_jobs} jobs written")
    outcome.figure(f"{NAME}.written_at_kill", written, f"of {n_jobs} jobs")
    if written >= n_jobs:
        outcome.broken.append("every job was written before the kill: nothing was tested")
    # The client retries a bunch refused with UNAVAILABLE (corral/retries.py), so the first submission may ride
    # out the restart and finish by itself; either way the same builder submitted again must give its one batch.
    outcome.figure(f"{NAME}.first_finished", int("batch" in first), "(1: the client's retries carried it through)")
    eventually(lambda: stack.frontend_pid() not in (None, frontend) and stack.api_answers(), 120, 0.2,
               "the frontend to be restarted")
    outcome.figure(f"{NAME}.frontend_away", time.monotonic() - killed, "s")
    started = time.monotonic()
    with stack.client() as client:
        submitted = client.submit(builder, bunch_size=BUNCH)  # the same bunches: a bunch is the unit re-sent
        outcome.figure(f"{NAME}.resubmit", time.monotonic() - started, "s")
        batches = stack.query("SELECT batch_id FROM batch_attributes WHERE `key` = 'name' AND `value` = %s", (name,))
        outcome.figure(f"{NAME}.batches", len(batches), "(must be 1)")
        jobs = jobs_written()
        outcome.figure(f"{NAME}.jobs", jobs, f"(must be {n_jobs})")
        if len(batches) != 1 or batches[0]["batch_id"] != submitted.batch_id:
            outcome.broken.append(f"the builder made {len(batches)} batches")
        if jobs != n_jobs or submitted.counts.n_jobs != n_jobs:
            outcome.broken.append(f"the batch has {jobs} jobs (n_jobs {submitted.counts.n_jobs}), not {n_jobs}")
        client.cancel_batch(submitted.batch_id, reason="fault program: the submission was the point")
    try:
        stack.wait_complete([submitted.batch_id], timeout_s=120)
    except TimeoutError as e:
        outcome.broken.append(str(e))
    outcome.audit = audit(stack, [submitted.batch_id], expect_success=False)
    return outcome
