"""The `corral` command line.

Each command group lives in its own `cli_<group>` module that adds its
subcommands to the parser and sets `run(args) -> exit code` on each; this
module only wires them together.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from corral import __version__, cli_admin, cli_batches, cli_db, cli_jobs, cli_locks, cli_up


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = argparse.ArgumentParser(prog="corral", description="Run and use corral, a multi-tenant batch job system.")
    parser.add_argument("--version", action="version", version=f"corral {__version__}")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    cli_db.add_commands(commands)
    cli_batches.add_commands(commands)
    cli_jobs.add_commands(commands)
    cli_locks.add_commands(commands)
    cli_admin.add_commands(commands)
    cli_up.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process's arguments), run the command and return its exit code."""
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
