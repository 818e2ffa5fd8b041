"""`corral submit`, `ls`, `status`, `cancel`, `hold`, `release`, `wait`: the batch commands.

Human output by default, `--json` for scripts.
"""

from __future__ import annotations

import argparse
import json

from google.protobuf import json_format

from corral.batch.v1 import batch_pb2
from corral.batch_file import read_batch_file
from corral.batch_file_words import FileSource, file_refusal
from corral.cli_common import EXIT_NOT_ALL_SUCCEEDED, open_client, with_json
from corral.costs import estimate_lines
from corral.errors import UsageError
from corral.refusal_words import Option, option_words


def _print_batch(batch: batch_pb2.Batch) -> None:
    c = batch.counts
    state = batch_pb2.BatchState.Name(batch.state).removeprefix("BATCH_STATE_").lower()
    if batch.HasField("cancellation"):
        state += f" (cancelled by {batch.cancellation.cancelled_by}: {batch.cancellation.reason})"
    if batch.HasField("hold"):
        state += f" (held by {batch.hold.held_by})"
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


def _submit(args: argparse.Namespace) -> int:
    builder = read_batch_file(args.file)
    source = builder.source
    if isinstance(source, FileSource):  # a refusal names the file's keys, lines and units
        args.words = lambda error: file_refusal(source, error)
    if args.estimate:
        with open_client(args) as client:
            estimate = client.estimate(builder)
        if args.json:
            print(json.dumps(json_format.MessageToDict(estimate, always_print_fields_with_no_presence=True),
                             indent=2))
        else:
            print("\n".join(estimate_lines(estimate, builder.billing_project)))
        return 0
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
        batch = client.cancel_batch(args.batch_id, args.reason)
    if not args.json and not batch.HasField("cancellation"):  # it had finished: the server cancelled nothing
        print(f"batch {batch.batch_id} is already complete: nothing to cancel")
    _emit(args, [batch])
    return 0


def _what(args: argparse.Namespace) -> str:
    if args.job_id is not None:
        return f"job {args.batch_id}/{args.job_id}"
    return f"job group {args.batch_id}/{args.group}" if args.group is not None else f"batch {args.batch_id}"


_HOLD_WORDS = {"held": "{what} is held: its ready jobs are not scheduled until `corral release`",
               "already held": "{what} was already held",
               "complete": "{what} is already complete: nothing to hold",
               "released": "{what} is released: its ready jobs are scheduled again",
               "not held": "{what} was not held: nothing to release"}


def _hold_or_release(args: argparse.Namespace) -> int:
    if args.job_id is not None and args.group is not None:
        raise UsageError(f"corral {args.verb}: name a job or --group, not both")
    with open_client(args) as client:
        call = client.hold if args.verb == "hold" else client.release
        change = call(args.batch_id, job_id=args.job_id, job_group_id=args.group)
    if args.json:
        print(json.dumps({"change": change}))
    else:
        print(_HOLD_WORDS[change].format(what=_what(args)))
    return 0


def _wait(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        batch = client.wait(args.batch_id, progress=not args.quiet)
    _emit(args, [batch])
    return 0 if batch.counts.n_succeeded == batch.counts.n_jobs else EXIT_NOT_ALL_SUCCEEDED


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add submit, ls, status, cancel, hold, release and wait."""
    submit = with_json(commands.add_parser("submit", help="submit a batch file (YAML, see docs/batch-file.md)"))
    submit.add_argument("file")
    submit.add_argument("-q", "--quiet", action="store_true", help="print only the new batch's id")
    submit.add_argument("--estimate", action="store_true",
                        help="submit nothing: print what the batch would cost, its worst case (what a spending "
                             "limit reserves) and its expected cost (from each job name's history, else its timeout)")
    submit.set_defaults(run=_submit)
    ls = with_json(commands.add_parser("ls", help="list batches matching a query (newest first)"))
    ls.add_argument("query", nargs="*", help="e.g. state=running name=~align")
    ls.add_argument("--limit", type=int, default=50)
    ls.set_defaults(run=_ls, words=option_words({"query": Option("the query")}))
    status = with_json(commands.add_parser("status", help="show one batch"))
    status.add_argument("batch_id", type=int)
    status.set_defaults(run=_status)
    cancel = with_json(commands.add_parser("cancel", help="cancel a batch"))
    cancel.add_argument("batch_id", type=int)
    cancel.add_argument("--reason", default="cancelled from the command line")
    cancel.set_defaults(run=_cancel, words=option_words({"reason": Option("--reason")}))
    for name, words in (("hold", "hold a batch, a job group or a job: its ready jobs wait until released"),
                        ("release", "release the hold of a batch, a job group or a job")):
        command = with_json(commands.add_parser(name, help=words))
        command.add_argument("batch_id", type=int)
        command.add_argument("job_id", type=int, nargs="?", help="one job of the batch (default: the batch)")
        command.add_argument("--group", type=int, metavar="JOB_GROUP_ID",
                             help="a job group of the batch, with the groups under it")
        command.set_defaults(run=_hold_or_release, verb=name)
    wait = with_json(commands.add_parser(
        "wait", help="wait until a batch completes, showing progress; exit 0 if every job succeeded, "
                     f"{EXIT_NOT_ALL_SUCCEEDED} if not"))
    wait.add_argument("batch_id", type=int)
    wait.add_argument("--quiet", action="store_true", help="no progress line on stderr")
    wait.set_defaults(run=_wait)
