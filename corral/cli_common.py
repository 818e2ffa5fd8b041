"""What every `corral` command shares: its parser class, the client it talks with, `--json`, and how a
failure becomes one `error: ...` line and an exit code (the table in docs/cli.md#exit-codes).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

import grpc
import yaml
from google.protobuf import json_format, message

from corral import quantities
from corral.client import Client
from corral.errors import CorralError, UsageError, from_rpc_error
from corral.refusal_words import unreachable_words

Words = Callable[[CorralError], "str | None"]
"""A command's way of saying a refusal in the words its user typed (corral.refusal_words), set as `args.words`
(None: the server's line as it is)."""

EXIT_FAILED = 1
"""The server failed (INTERNAL, UNKNOWN, ...), or the CLI met an error it does not know."""
EXIT_USAGE = 2
"""The command line, a file or a setting is wrong, found before any call (argparse's own code)."""
EXIT_NOT_ALL_SUCCEEDED = 3
"""`corral wait`: the batch completed but not every job succeeded."""
EXIT_REFUSED = 4
"""The server refused the request as it stands (INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE,
ALREADY_EXISTS, RESOURCE_EXHAUSTED)."""
EXIT_NOT_FOUND = 5
"""NOT_FOUND."""
EXIT_UNAUTHENTICATED = 6
"""Not logged in, or the token is invalid, expired or revoked (UNAUTHENTICATED)."""
EXIT_PERMISSION_DENIED = 7
"""PERMISSION_DENIED."""
EXIT_UNAVAILABLE = 8
"""The server could not be reached or did not answer in time (UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED):
trying again later may work."""
EXIT_INTERRUPTED = 130
"""Ctrl-C (128 + SIGINT, as a shell reports it)."""
EXIT_BROKEN_PIPE = 141
"""Whoever read the output went away (`corral jobs 7 | head`): 128 + SIGPIPE, what a shell reports for a
tool that SIGPIPE ended; nothing is printed."""

_EXIT_BY_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: EXIT_REFUSED,
    grpc.StatusCode.FAILED_PRECONDITION: EXIT_REFUSED,
    grpc.StatusCode.OUT_OF_RANGE: EXIT_REFUSED,
    grpc.StatusCode.ALREADY_EXISTS: EXIT_REFUSED,
    grpc.StatusCode.RESOURCE_EXHAUSTED: EXIT_REFUSED,
    grpc.StatusCode.NOT_FOUND: EXIT_NOT_FOUND,
    grpc.StatusCode.UNAUTHENTICATED: EXIT_UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: EXIT_PERMISSION_DENIED,
    grpc.StatusCode.UNAVAILABLE: EXIT_UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED: EXIT_UNAVAILABLE,
    grpc.StatusCode.ABORTED: EXIT_UNAVAILABLE,
}


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad command line is one `error: ...` line too (argparse prints the usage
    first). Subcommands' parsers are of the same class."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"error: {message} (see `{self.prog} --help`)\n")


def failure(error: BaseException, words: Words | None = None, addresses: Sequence[str] = (),
            probe: Callable[[str], str | None] | None = None) -> tuple[str | None, int]:
    """The one line to print for a command that raised `error` (None: print nothing) and the exit code,
    or raise `error` again if it is not a failure the CLI knows how to report. `words` says a refusal in the
    user's words; `addresses` are the servers the command talks to (the frontend first), for a call that
    never reached one, and `probe` finds why (corral.reachability)."""
    if isinstance(error, BrokenPipeError):
        return None, EXIT_BROKEN_PIPE
    if isinstance(error, KeyboardInterrupt):
        return None, EXIT_INTERRUPTED
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):  # a stream's error no call turned typed
        error = from_rpc_error(error)
    if isinstance(error, CorralError):
        code = _EXIT_BY_STATUS.get(error.code, EXIT_FAILED)
        if addresses and (unreachable := unreachable_words(_address(addresses, error.message), error.code,
                                                            error.message, probe)) is not None:
            return unreachable, code
        said = words(error) if words is not None else None
        return said or str(error), code
    if isinstance(error, UsageError):
        return str(error), EXIT_USAGE
    if isinstance(error, yaml.YAMLError):
        return yaml_error(error), EXIT_USAGE
    if isinstance(error, OSError) and error.filename is not None:  # a file the user named or configured
        return f"{error.filename}: {error.strerror}", EXIT_USAGE
    if isinstance(error, Exception):
        return f"{type(error).__name__}: {error} (`corral --debug ...` shows where)", EXIT_FAILED
    raise error


def _address(addresses: Sequence[str], details: str) -> str:
    """The one of `addresses` gRPC's `details` are about ("ipv4:127.0.0.1:8443: ..." is localhost:8443's):
    the first whose port they name, else the first."""
    return next((a for a in addresses if re.search(rf":{re.escape(a.rpartition(':')[2])}\b", details)),
                addresses[0])


def debug_line(error: BaseException) -> str | None:
    """What `--debug` adds for a failed call: the status and the server's own field paths, as API users see
    them (the `error:` line says them in the user's words)."""
    if isinstance(error, grpc.RpcError) and hasattr(error, "code"):
        error = from_rpc_error(error)
    if not isinstance(error, CorralError):
        return None
    said = [f"{v.field}: {v.description}" if v.field else v.description for v in error.field_violations]
    return f"status {error.code.name}: {error.message}" + "".join(f"\n  field {v}" for v in said)


def yaml_error(error: yaml.YAMLError) -> str:
    """A YAML syntax error as `file:line:column: problem` (PyYAML's own text takes several lines)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    text = f"{problem} ({context})" if context else problem
    if mark is None:
        return f"not valid YAML: {text}"
    where = f"{mark.line + 1}:{mark.column + 1}"
    if mark.name and not mark.name.startswith("<"):  # "<unicode string>" when it was not read from a file
        where = f"{mark.name}:{where}"
    return f"{where}: not valid YAML: {text}"


def print_error(line: str) -> None:
    """`error: LINE` on stderr, on one line whatever the message holds."""
    print("error: " + " ".join(line.split()), file=sys.stderr, flush=True)


def open_client(args: argparse.Namespace) -> Client:
    """A client as the command's profile (`--profile`, else the current one) and token (`$CORRAL_TOKEN`,
    else the profile's)."""
    return Client.from_profile(args.profile)


def seconds_option(text: str) -> float:
    """An option's duration: seconds ("3600") or with its unit ("1h", "30m", "90s", "1h30m"), for argparse's
    `type=` (its refusal: `error: argument --max-job-duration: "1 hour": ...`)."""
    try:
        return quantities.parse_duration_s(text)
    except quantities.QuantityError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def bytes_option(text: str) -> int:
    """An option's size: bytes ("65536") or with its unit ("64Ki", "1Mi", "10M"), for argparse's `type=`."""
    try:
        return quantities.parse_bytes(text)
    except quantities.QuantityError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def with_json(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def print_json(messages: Iterable[message.Message]) -> None:
    print(json.dumps([json_format.MessageToDict(m) for m in messages], indent=2))


def print_messages(args: argparse.Namespace, messages: list[Any], line: Callable[[Any], str]) -> int:
    """The messages as JSON (`--json`), else one line each; the command's exit code (0)."""
    if args.json:
        print_json(messages)
    else:
        for item in messages:
            print(line(item))
    return 0


def usd(micro_usd: int) -> str:
    return f"${micro_usd / 1e6:.6f}"
