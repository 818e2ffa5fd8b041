"""`corral quotas set|ls`: the quotas and fair-share weights of billing projects and users.

Administrators set them; anyone lists those they may see (their projects' and their own). `set` changes only
the caps and weight it is given: it reads the quota first and sends it whole (SetQuota replaces a quota), and
`none` clears a cap.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from corral import quantities
from corral.billing.v1 import quota_pb2
from corral.cli_admin import when_text
from corral.cli_common import open_client, print_messages, with_json
from corral.errors import UsageError
from corral.quantities import format_mcpu
from corral.refusal_words import CORES, Option, option_words

T = TypeVar("T")
NONE = object()
"""A cap given as `none`: cleared."""

QUOTA_OPTIONS = {
    "name": Option("PROJECT or --user"), "max_running_cores_mcpu": Option("--running-cores", CORES),
    "max_running_jobs": Option("--running-jobs"), "max_ready_jobs": Option("--ready-jobs"),
    "weight": Option("--weight"),
}
"""The request fields `corral quotas set` sets, as its options say them."""


def _or_none(parse: Callable[[str], T]) -> Callable[[str], T | object]:
    def option(text: str) -> T | object:
        if text.lower() == "none":
            return NONE
        try:
            return parse(text)
        except (ValueError, quantities.QuantityError) as e:
            raise argparse.ArgumentTypeError(f"{text!r}: {e}; or 'none' for no cap") from None
    return option


def _weight(text: str) -> int:
    try:
        weight = int(text)
    except ValueError:
        weight = 0
    if not 1 <= weight <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r}: a weight is a whole number from 1 to 1000")
    return weight


def quota_line(q: quota_pb2.Quota) -> str:
    kind = "project" if q.kind == quota_pb2.QUOTA_KIND_PROJECT else "user"

    def cap(field: str, say: Callable[[int], str] = str) -> str:
        return say(getattr(q, field)) if q.HasField(field) else "none"
    set_by = f"  set by {q.set_by} at {when_text(q.set_at)}" if q.set_by else ""
    return (f"{kind} {q.name}  running_cores={cap('max_running_cores_mcpu', format_mcpu)}  "
            f"running_jobs={cap('max_running_jobs')}  ready_jobs={cap('max_ready_jobs')}  "
            f"weight={q.weight or 1}{set_by}")


def _merged(given: object, current: int | None) -> int | None:
    """A cap from its option: not given keeps the current one, `none` clears it."""
    if given is None:
        return current
    return None if given is NONE else int(given)  # type: ignore[call-overload]


def _quotas(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        if args.action == "ls":
            found = list(client.quotas(args.kind))
        else:
            if (args.project is None) == (args.user is None):
                raise UsageError("name a billing project (PROJECT) or a user (--user USER), not both")
            user = args.user is not None
            name = args.user if user else args.project
            current = next((q for q in client.quotas("user" if user else "project") if q.name == name),
                           quota_pb2.Quota())
            cores = _merged(args.running_cores, current.max_running_cores_mcpu
                            if current.HasField("max_running_cores_mcpu") else None)
            found = [client.set_quota(
                name, user=user, running_cores=None if cores is None else f"{cores}m",
                running_jobs=_merged(args.running_jobs, current.max_running_jobs
                                     if current.HasField("max_running_jobs") else None),
                ready_jobs=_merged(args.ready_jobs, current.max_ready_jobs
                                   if current.HasField("max_ready_jobs") else None),
                weight=args.weight if args.weight is not None else (current.weight or 1))]
    return print_messages(args, found, quota_line)


def add_commands(commands: Any) -> None:
    """Add `quotas` with `set` and `ls`."""
    quotas = commands.add_parser("quotas", help="caps on what a billing project or user runs, and fair-share weights")
    actions = quotas.add_subparsers(title="actions", dest="action", metavar="ACTION", required=True)
    ls = with_json(actions.add_parser("ls", help="the quotas you may see (administrators: every one)"))
    ls.add_argument("--kind", choices=("project", "user"), help="only these")
    set_ = with_json(actions.add_parser("set", help="set a project's or a user's quota (admin); options not given "
                                                    "keep their value"))
    set_.add_argument("project", nargs="?", metavar="PROJECT", help="the billing project")
    set_.add_argument("--user", metavar="USER", help="a user's quota instead of a project's")
    set_.add_argument("--running-cores", type=_or_none(quantities.parse_mcpu), metavar="N",
                      help="most cores its running jobs hold at once, across every pool (2, 0.5, 250m; none: no cap)")
    set_.add_argument("--running-jobs", type=_or_none(int), metavar="N",
                      help="most of its jobs starting or running at once (none: no cap)")
    set_.add_argument("--ready-jobs", type=_or_none(int), metavar="N",
                      help="most open (unfinished) jobs its batches may have; more are refused at submission "
                           "(none: no cap)")
    set_.add_argument("--weight", type=_weight, metavar="W",
                      help="fair-share weight, 1 to 1000: when both want more, weight 2 gets twice the cores of 1")
    quotas.set_defaults(run=_quotas, words=option_words(QUOTA_OPTIONS))
