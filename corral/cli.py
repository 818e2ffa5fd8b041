"""The `corral` command line.

Each command group lives in its own `cli_<group>` module that adds its
subcommands to the parser and sets `run(args) -> exit code` on each; this
module only wires them together. The commands that run the server itself
(`corral up`, `corral db`) belong to the server package, which registers
them under the `corral.commands` entry point group (pyproject.toml): the
client package imports nothing of the server's, and a client installed
alone simply has no such commands.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from corral import __version__, cli_admin, cli_batches, cli_jobs, cli_locks

COMMANDS_GROUP = "corral.commands"
"""Entry points (`add_commands(subparsers)`) of the packages that add commands: the server's `up` and `db`."""


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = argparse.ArgumentParser(prog="corral", description="Run and use corral, a multi-tenant batch job system.")
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cli_batches.add_commands(commands)
    cli_jobs.add_commands(commands)
    cli_locks.add_commands(commands)
    cli_admin.add_commands(commands)
    for entry in sorted(entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        entry.load()(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), run the command and return its exit code."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
