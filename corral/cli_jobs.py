"""`corral jobs`, `job`, `logs`, `rerun`, `cancel-group`, `delete`: a batch's jobs.

Human output by default, `--json` for scripts (the API's messages as JSON).
`corral logs` writes the log's bytes as they are; `--follow` follows the
job (waits for it to start, goes on with each retry, returns when the job
is final, saying where it is on stderr), or with `--attempt` that attempt
until it ends. `corral job` shows the job's image as every container tool
reads it, and each attempt's image digest (what ran), cpu time and peak
memory; with `--usage`, its usage series.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from corral.batch.v1 import job_explanation_pb2, job_pb2, job_state_pb2
from corral.cli_common import bytes_option, open_client, print_json, usd, with_json
from corral.refusal_words import Option, option_words
from corral.sizes import binary_size


def state_name(state: int) -> str:
    return job_state_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def job_line(job: job_pb2.Job) -> str:
    parts = [f"job {job.job_id}", state_name(job.state)]
    if job.HasField("exit_code"):
        parts.append(f"exit={job.exit_code}")
    parts.append(f"group={job.job_group_id}")
    if job.rerun_of_job_id:
        parts.append(f"rerun-of={job.rerun_of_job_id}")
    parts.append(f"cost={usd(job.cost_micro_usd)}")
    parts += [f"{k}={v}" for k, v in sorted(job.attributes.items())]
    line = "  ".join(parts)
    return f"{line}  error: {job.error_message}" if job.error_message else line


def _jobs(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        jobs = []
        for job in client.jobs(args.batch_id, " ".join(args.query)):
            jobs.append(job)
            if len(jobs) >= args.limit:
                break
    if args.json:
        print_json(jobs)
    else:
        for job in jobs:
            print(job_line(job))
    return 0


def _reason_name(code: int) -> str:
    return job_explanation_pb2.WaitReasonCode.Name(code).removeprefix("WAIT_REASON_CODE_").lower().replace("_", " ")


def used(usage: job_pb2.ResourceUsage) -> str:
    """'cpu time 1.5 s, peak memory 64 MiB', or '' if the attempt reported neither."""
    parts = []
    if usage.HasField("cpu_time"):
        parts.append(f"cpu time {usage.cpu_time.ToMilliseconds() / 1000:g} s")
    if usage.peak_memory_bytes:
        parts.append(f"peak memory {binary_size(usage.peak_memory_bytes)}")
    return ", ".join(parts)


def image_words(job: job_pb2.Job) -> str:
    """The job's image as every container tool reads it, with the spec's words where they differ:
    'docker.io/library/busybox:latest (written busybox)'."""
    written, normalized = job.spec.image, job.normalized_image
    if not normalized or normalized == written:
        return written or "(none)"
    return f"{normalized} (written {written})"


def _optional_size(sample: job_pb2.UsageSample, field: str) -> str:
    return binary_size(getattr(sample, field)) if sample.HasField(field) else "-"


def usage_lines(usage: Any, start_ms: int | None) -> list[str]:
    """A GetAttemptUsageResponse as a table: seconds since the attempt started, and each counter."""
    lines = []
    if usage.note:
        lines.append(f"    usage: {usage.note}")
    if usage.samples:
        lines.append("      at_s   cpu_s    memory      peak   io_read  io_write")
    for s in usage.samples:
        at_s = (s.at.ToMilliseconds() - (start_ms or s.at.ToMilliseconds())) / 1000
        cpu = f"{s.cpu_time.ToMilliseconds() / 1000:.1f}" if s.HasField("cpu_time") else "-"
        lines.append(f"    {at_s:6.1f}  {cpu:>6}  " + "  ".join(
            f"{_optional_size(s, f):>8}" for f in ("memory_bytes", "peak_memory_bytes", "io_read_bytes",
                                                    "io_write_bytes")))
    return lines


def _job(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        job = client.get_job(args.batch_id, args.job_id)
        why = client.explain_job(args.batch_id, args.job_id)
        usages = {a.attempt_id: client.attempt_usage(args.batch_id, args.job_id, a.attempt_id)
                  for a in job.attempts} if args.usage else {}
    if args.json:
        print_json([job, why, *usages.values()])
        return 0
    print(job_line(job))
    command = list(job.spec.argv.args) if job.spec.WhichOneof("command") == "argv" else [job.spec.script]
    print(f"  image {image_words(job)}  command {json.dumps(command)}")
    r = job.resources
    print(f"  reserves {r.cores_mcpu / 1000:g} cores, memory {binary_size(r.memory_bytes)}, scratch storage "
          f"{binary_size(r.storage_bytes)} in pool {r.pool}")
    if job.spec.parents:
        print("  parents " + ", ".join(str(p.job_id) for p in job.spec.parents))
    for a in job.attempts:
        end = job_pb2.AttemptEndReason.Name(a.end_reason).removeprefix("ATTEMPT_END_REASON_").lower()
        exit_code = f" exit={a.exit_code}" if a.HasField("exit_code") else ""
        spot = " (spot)" if a.spot else ""
        memory = f"  memory={a.memory_bytes // 2**20} MiB" if a.memory_bytes else ""
        print(f"  attempt {a.attempt_id} on {a.instance_name}{spot}: {end if a.end_reason else 'running'}{exit_code}"
              f"{memory}  cost={usd(a.cost_micro_usd)}" + (f"  error: {a.error_message}" if a.error_message else ""))
        if summary := used(a.resources_used):
            print(f"    used: {summary}" + ("" if a.end_reason else " (last sample)"))
        if a.image_digest:
            print(f"    image digest: {a.image_digest}")
        if a.isolation:
            print(f"    ran as: {a.isolation}")
        if a.attempt_id in usages:
            for line in usage_lines(usages[a.attempt_id],
                                    a.started_at.ToMilliseconds() if a.HasField("started_at") else None):
                print(line)
        if a.retry_reason:
            print(f"    next attempt: {a.retry_reason}")
    reasons = why.reasons or []
    if not reasons:
        print("  why: nothing in its way; the scheduler places it in its next cycle")
    for r in reasons:
        print(f"  why: {_reason_name(r.code)}: {r.detail}")
    return 0


_NEVER_RAN = {"cancelled": "was cancelled before it ran", "error": "ended in error before it ran",
              "failed": "failed before it ran", "succeeded": "succeeded without running"}


def _follow(client: Any, args: argparse.Namespace, start_byte: int) -> None:
    """Write the log's bytes to stdout as they come; where the job is at goes to stderr, on lines of its own,
    so that stdout stays the job's bytes."""
    out, last_byte = sys.stdout.buffer, b"\n"

    def say(line: str) -> None:
        out.flush()
        # A line the job left unfinished on the terminal is ended first.
        print(("" if last_byte == b"\n" else "\n") + line, file=sys.stderr, flush=True)

    for message in client.follow_log_messages(args.batch_id, args.job_id, args.attempt, start_byte):
        if message.data:
            out.write(message.data)
            out.flush()
            last_byte = message.data[-1:]
        elif message.job_state:
            state = state_name(message.job_state)
            if message.attempt_id:
                say(f"--- job {args.job_id} {state} ---")
            else:
                say(f"job {args.job_id} of batch {args.batch_id} {_NEVER_RAN[state]}: it has no log")
        elif message.attempt_id:
            say(f"--- attempt {message.attempt_number} ({message.attempt_id}) on {message.instance_name} ---")
        else:
            say(f"job {args.job_id} of batch {args.batch_id} has not run yet: waiting for it to start "
                "(Ctrl-C to stop)")


def _logs(args: argparse.Namespace) -> int:
    out = sys.stdout.buffer
    start = -args.tail if args.tail else 0
    with open_client(args) as client:
        if args.follow:
            _follow(client, args, start)
        else:
            out.write(client.job_log(args.batch_id, args.job_id, args.attempt, start))
    out.flush()
    return 0


def _rerun(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        update = client.rerun_failed(args.batch_id, args.state or (), args.token)
    if args.json:
        print_json([update] if update is not None else [])
    elif update is None:
        print(f"batch {args.batch_id}: nothing to re-run")
    else:
        last = update.start_job_id + update.n_jobs - 1
        print(f"batch {args.batch_id}: update {update.update_id} re-runs {update.n_jobs} job(s) as jobs "
              f"{update.start_job_id}-{last}")
    return 0


def _cancel_group(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        group = client.cancel_job_group(args.batch_id, args.job_group_id, args.reason)
    if args.json:
        print_json([group])
    elif not group.HasField("cancellation"):  # it had finished: the server cancelled nothing
        print(f"job group {group.job_group_id} of batch {group.batch_id} is already complete: nothing to cancel")
    else:
        c = group.cancellation
        print(f"job group {group.job_group_id} of batch {group.batch_id}: cancelled by {c.cancelled_by}: {c.reason}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.delete_batch(args.batch_id)
    print(f"batch {args.batch_id} deleted")
    return 0


def add_commands(commands: Any) -> None:
    """Add jobs, job, logs, rerun, cancel-group and delete."""
    jobs = with_json(commands.add_parser("jobs", help="list a batch's jobs matching a query"))
    jobs.add_argument("batch_id", type=int)
    jobs.add_argument("query", nargs="*", help="e.g. state=failed name=~align (see docs/query-language.md)")
    jobs.add_argument("--limit", type=int, default=1000, help="most jobs to show")
    jobs.set_defaults(run=_jobs, words=option_words({"query": Option("the query")}))
    job = with_json(commands.add_parser("job", help="show one job, its attempts and why it is not running"))
    job.add_argument("batch_id", type=int)
    job.add_argument("job_id", type=int)
    job.add_argument("--usage", action="store_true",
                     help="also each attempt's resource usage over time (cpu, memory, I/O), as its worker sampled it")
    job.set_defaults(run=_job)
    logs = commands.add_parser("logs", help="print a job's log")
    logs.add_argument("batch_id", type=int)
    logs.add_argument("job_id", type=int)
    logs.add_argument("--attempt", help="an attempt id (default: the latest)")
    logs.add_argument("--follow", "-f", action="store_true",
                      help="keep printing while the job runs: wait for it to start, go on with each retry, "
                           "return when it is final (with --attempt: while that attempt runs)")
    logs.add_argument("--tail", type=bytes_option, metavar="SIZE",
                      help="only the last SIZE bytes (bytes, or with a unit: 64Ki, 1Mi, 10k)")
    logs.set_defaults(run=_logs, words=option_words({"attempt_id": Option("--attempt")}))
    rerun = with_json(commands.add_parser("rerun", help="re-run a batch's failed jobs and their dependents"))
    rerun.add_argument("batch_id", type=int)
    rerun.add_argument("--state", action="append", choices=("failed", "error", "cancelled"),
                       help="states to re-run (repeatable; default: failed and error)")
    rerun.add_argument("--token", help="idempotency token: the same token re-runs once (default: a new one)")
    rerun.set_defaults(run=_rerun, words=option_words({"idempotency_token": Option("--token"),
                                                        "states": Option("--state")}))
    cancel_group = with_json(commands.add_parser("cancel-group", help="cancel a job group and its subtree"))
    cancel_group.add_argument("batch_id", type=int)
    cancel_group.add_argument("job_group_id", type=int)
    cancel_group.add_argument("--reason", default="cancelled from the command line")
    cancel_group.set_defaults(run=_cancel_group, words=option_words({"reason": Option("--reason")}))
    delete = commands.add_parser("delete", help="delete a batch (cancelling it if it runs)")
    delete.add_argument("batch_id", type=int)
    delete.set_defaults(run=_delete)
