"""`corral submit`, `ls`, `status`, `cancel`, `wait`: the batch commands.

Human output by default, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml
from google.protobuf import json_format

from corral.batch.v1 import batch_pb2
from corral.builder import BatchBuilder, JobHandle
from corral.cli_common import EXIT_NOT_ALL_SUCCEEDED, open_client, with_json
from corral.errors import CorralError, UsageError


def _print_batch(batch: batch_pb2.Batch) -> None:
    c = batch.counts
    state = batch_pb2.BatchState.Name(batch.state).removeprefix("BATCH_STATE_").lower()
    if batch.HasField("cancellation"):
        state += f" (cancelled by {batch.cancellation.cancelled_by}: {batch.cancellation.reason})"
    print(f"batch {batch.batch_id}  {state}  user={batch.user}  project={batch.billing_project}  "
          f"jobs={c.n_jobs} pending={c.n_pending} ready={c.n_ready} running={c.n_running} "
          f"succeeded={c.n_succeeded} failed={c.n_failed} errored={c.n_errored} cancelled={c.n_cancelled}  "
          f"cost=${batch.cost_micro_usd / 1e6:.6f}")


def _emit(args: argparse.Namespace, batches: list[batch_pb2.Batch]) -> None:
    if args.json:
        print(json.dumps([json_format.MessageToDict(b) for b in batches], indent=2))
    else:
        for batch in batches:
            _print_batch(batch)


def builder_from_yaml(document: dict[str, Any]) -> BatchBuilder:
    """A batch file: billing_project, attributes, and jobs with local names for parents."""
    if not isinstance(document, dict) or "billing_project" not in document:
        raise CorralError("the batch file needs a billing_project and a list of jobs")
    builder = BatchBuilder(document["billing_project"], attributes=document.get("attributes"),
                           callback_url=document.get("callback_url"),
                           cancel_after_n_failures=document.get("cancel_after_n_failures"))
    named: dict[str, JobHandle] = {}
    for i, job in enumerate(document.get("jobs") or []):
        try:
            parents = [named[p] for p in job.get("parents", [])]
        except KeyError as e:
            raise CorralError(f"jobs[{i}]: parent {e.args[0]!r} is not the name of an earlier job") from None
        handle = builder.job(
            job.get("image", ""), job.get("command", []), parents=parents,
            accept=job.get("accept", ("succeeded",)), always_run=job.get("always_run", False),
            cores=job.get("cores", 1.0), memory_bytes=job.get("memory_bytes", 0),
            storage_bytes=job.get("storage_bytes", 0), env=job.get("env"),
            attributes=job.get("attributes"), timeout_s=job.get("timeout_s"), priority=job.get("priority", 0))
        if "name" in job:
            named[job["name"]] = handle
    return builder


def _submit(args: argparse.Namespace) -> int:
    with open(args.file, "rb") as f:  # a file that cannot be read is reported by the CLI's `main`, as its YAML
        document = yaml.safe_load(f)
    try:
        builder = builder_from_yaml(document)
    except (AttributeError, CorralError, KeyError, TypeError, ValueError) as e:  # what a value of the file did
        raise UsageError(f"the batch file does not describe a batch: {e}", location=args.file) from e
    with open_client(args) as client:
        batch = client.submit(builder)
    if args.quiet:
        print(batch.batch_id)  # for scripts: batch=$(corral submit -q FILE)
    else:
        _emit(args, [batch])
    return 0


def _ls(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        batches = []
        for batch in client.list_batches(" ".join(args.query)):
            batches.append(batch)
            if len(batches) >= args.limit:
                break
        _emit(args, batches)
    return 0


def _status(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        _emit(args, [client.get_batch(args.batch_id)])
    return 0


def _cancel(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        _emit(args, [client.cancel_batch(args.batch_id, args.reason)])
    return 0


def _wait(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        batch = client.wait(args.batch_id, progress=not args.quiet)
    _emit(args, [batch])
    return 0 if batch.counts.n_succeeded == batch.counts.n_jobs else EXIT_NOT_ALL_SUCCEEDED


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add submit, ls, status, cancel and wait."""
    submit = with_json(commands.add_parser("submit", help="submit a batch described in YAML"))
    submit.add_argument("file")
    submit.add_argument("-q", "--quiet", action="store_true", help="print only the new batch's id")
    submit.set_defaults(run=_submit)
    ls = with_json(commands.add_parser("ls", help="list batches matching a query (newest first)"))
    ls.add_argument("query", nargs="*", help="e.g. state=running name=~align")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(run=_ls)
    status = with_json(commands.add_parser("status", help="show one batch"))
    status.add_argument("batch_id", type=int)
    status.set_defaults(run=_status)
    cancel = with_json(commands.add_parser("cancel", help="cancel a batch"))
    cancel.add_argument("batch_id", type=int)
    cancel.add_argument("--reason", default="cancelled from the command line")
    cancel.set_defaults(run=_cancel)
    wait = with_json(commands.add_parser(
        "wait", help="wait until a batch completes, showing progress; exit 0 if every job succeeded, "
                     f"{EXIT_NOT_ALL_SUCCEEDED} if not"))
    wait.add_argument("batch_id", type=int)
    wait.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    wait.set_defaults(run=_wait)
