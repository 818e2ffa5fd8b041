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
from collections.abc import Sequence
from importlib.metadata import entry_points

from corral import __version__, cli_admin, cli_batches, cli_identity, cli_images, cli_jobs, cli_locks, cli_secrets
from corral.cli_common import EXIT_BROKEN_PIPE, Parser, failure, print_error

COMMANDS_GROUP = "corral.commands"
"""Entry points (`add_commands(subparsers)`) of the packages that add commands: the server's `up` and `db`."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = Parser(prog="corral", description="Run and use corral, a multi-tenant batch job system.")
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    parser.add_argument("--profile", metavar="NAME",
                        help="use this profile of the configuration file instead of the current one")
    parser.add_argument("--debug", action="store_true", help="on a failure, show the traceback")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cli_identity.add_commands(commands)
    cli_batches.add_commands(commands)
    cli_jobs.add_commands(commands)
    cli_locks.add_commands(commands)
    cli_secrets.add_commands(commands)
    cli_images.add_commands(commands)
    cli_admin.add_commands(commands)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), run the command and return its exit code."""
    args = build_parser().parse_args(argv)
    if args.debug:
        return _run(args)
    try:
        return _run(args)
    except (Exception, KeyboardInterrupt) as e:
        line, code = failure(e)
        if code == EXIT_BROKEN_PIPE:
            _discard_stdout()
        if line is not None:
            print_error(line)
        return code


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
