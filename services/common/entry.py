"""What every service's `python -m` entry point does before it runs.

- Files it creates are private to its own account (umask 077): specs, logs,
  ports files, keys. Where another account must read something (a job's
  working directory), the code that makes it says so with an explicit mode.
- The database URL, which carries the service's password, comes from
  `$CORRAL_DATABASE_URL` rather than the command line: every local account
  can read a process's arguments (`ps`), and only the process's own account
  (and root) its environment.
"""

from __future__ import annotations

import argparse
import os

DATABASE_URL_VARIABLE = "CORRAL_DATABASE_URL"


def private_files() -> None:
    """Make every file and directory this process creates readable by its own account only."""
    os.umask(0o077)


def add_database_url(parser: argparse.ArgumentParser) -> None:
    """`--database-url`, defaulting to $CORRAL_DATABASE_URL; one of the two is required."""
    parser.add_argument("--database-url", default=os.environ.get(DATABASE_URL_VARIABLE),
                        required=DATABASE_URL_VARIABLE not in os.environ,
                        help=f"mysql://USER:PASSWORD@HOST/DB (default: ${DATABASE_URL_VARIABLE}, which keeps "
                             "the password off the command line)")
