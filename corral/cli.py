"""The `corral` command line.

Each command group lives in its own `cli_<group>` module that adds its
subcommands to the parser and sets `run(args) -> exit code` on each; what
they share is in `cli_common`. This module wires them together and is the
one place a failure is reported: one `error: ...` line on stderr and an
exit code (`cli_common.failure`), or with `--debug` the traceback. The
commands that run the server itself (`corral up`, `corral db`) belong to
the server package, which registers them under the `corral.commands`
entry point group (pyproject.toml): the client package imports nothing of
the server's, and a client installed alone simply has no such commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from corral import (
    __version__,
    cli_admin,
    cli_batches,
    cli_identity,
    cli_images,
    cli_jobs,
    cli_locks,
    cli_quotas,
    cli_secrets,
    reachability,
)
from corral.cli_common import EXIT_BROKEN_PIPE, Parser, debug_line, failure, print_error
from corral.cli_config import Config

COMMANDS_GROUP = "corral.commands"
"""Entry points (`add_commands(subparsers)`) of the packages that add commands: the server's `up` and `db`."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = Parser(prog="corral", description="Run and use corral, a multi-tenant batch job system.")
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    parser.add_argument("--profile", metavar="NAME",
                        help="use this profile of the configuration file instead of the current one")
    parser.add_argument("--debug", action="store_true",
                        help="on a failure, also show the server's status and field paths, and the traceback")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cli_identity.add_commands(commands)
    cli_batches.add_commands(commands)
    cli_jobs.add_commands(commands)
    cli_locks.add_commands(commands)
    cli_secrets.add_commands(commands)
    cli_images.add_commands(commands)
    cli_admin.add_commands(commands)
    cli_quotas.add_commands(commands)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), run the command and return its exit code."""
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except (Exception, KeyboardInterrupt) as e:
        if args.debug:
            _show_debug(e, args)
            raise
        line, code = failure(e, getattr(args, "words", None), _addresses(args), _prober(args))
        if code == EXIT_BROKEN_PIPE:
            _discard_stdout()
        if line is not None:
            print_error(line)
        return code


def _show_debug(error: BaseException, args: argparse.Namespace) -> None:
    """`--debug`: the line a user would read, then what the server said, field paths and all (the traceback
    follows)."""
    try:
        line, _ = failure(error, getattr(args, "words", None), _addresses(args), _prober(args))
    except BaseException:  # noqa: BLE001 - an error the CLI does not know: the traceback says it all
        return
    if line is not None:
        print_error(line)
    if (said := debug_line(error)) is not None:
        print(f"debug: {said}", file=sys.stderr, flush=True)


def _prober(args: argparse.Namespace) -> Callable[[str], str | None]:
    """corral.reachability's probe, trusting the CA the command trusts (`--ca-cert`, else its profile's)."""
    ca_cert = getattr(args, "ca_cert", None)
    if ca_cert is None:
        try:
            ca_cert = Config.load().profile(args.profile).ca_cert
        except Exception:  # no profile: the system's roots, as the channel had
            ca_cert = None
    path = os.path.expanduser(ca_cert) if ca_cert else None
    return lambda address: reachability.probe(address, path)


def _addresses(args: argparse.Namespace) -> list[str]:
    """The servers the command talks to, frontend first, as the user configured them (`localhost:8443`, not
    the address gRPC resolved it to): those it was given, else its profile's."""
    given = [a for a in (getattr(args, "frontend", None), getattr(args, "auth", None)) if a]
    try:
        profile = Config.load().profile(args.profile) if len(given) < 2 else None
    except Exception:  # no profile: the command failed before any call, or it names its own servers
        profile = None
    found = given + ([profile.frontend, profile.auth] if profile is not None else [])
    return [a for i, a in enumerate(found) if a and a not in found[:i]]


def _run(args: argparse.Namespace) -> int:
    code: int = args.run(args)
    sys.stdout.flush()  # now rather than at exit, so that a closed pipe is a failure like any other
    return code


def _discard_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered would fail again at exit, and Python would
    report that."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # not a real file (a test's captured output)
        pass


if __name__ == "__main__":
    sys.exit(main())
