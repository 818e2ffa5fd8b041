"""`corral up`: run the whole system on this machine (see services/up.py)."""

from __future__ import annotations

import argparse
from pathlib import Path


def _up(args: argparse.Namespace) -> int:
    from services.up import UpConfig, serve_forever  # server-side code, imported only for this command

    return serve_forever(UpConfig(args.data_dir, args.database_url, args.drivers))


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `up`."""
    up = commands.add_parser("up", help="run corral on this machine until Ctrl-C")
    up.add_argument("--data-dir", type=Path, default=Path("~/.local/share/corral"),
                    help="state kept across restarts (default: %(default)s)")
    up.add_argument("--database-url", help="use this MySQL/MariaDB instead of a private MariaDB")
    up.add_argument("--drivers", type=int, default=2, help="driver processes: one leads (default: 2)")
    up.set_defaults(run=_up)
