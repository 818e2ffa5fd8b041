"""`corral db`: apply `sql/` to a database and show what is applied; back it up and restore it.

    corral db migrate --database-url mysql://root@localhost/corral?unix_socket=/run/mysqld/mysqld.sock
    corral db status --json
    corral db backup --data-dir DATA corral.sql.gz
    corral db restore --database-url URL corral.sql.gz

Errors the operator must act on (edited history, a failing statement, an
unreachable server) print one `error: ...` line to stderr and exit 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from pathlib import Path

import pymysql

from services.db.backup import BackupError, backup, restore
from services.db.database import DatabaseConfig
from services.db.migrations import SQL_DIR, MigrationError, MigrationStatus, migrate, status
from services.db.server import administrator
from services.db.sqlfile import SqlFileError

DATABASE_URL_ENV = "CORRAL_DATABASE_URL"

_ERRORS = (MigrationError, SqlFileError, BackupError, pymysql.MySQLError)


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add `db migrate` and `db status` to the top-level command list."""
    db = commands.add_parser(
        "db", help="apply and inspect the database schema", description="Apply sql/ to a database and show what is applied."
    )
    db_commands = db.add_subparsers(title="commands", metavar="COMMAND", required=True)

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--database-url",
        type=_database_config,
        default=os.environ.get(DATABASE_URL_ENV),
        required=DATABASE_URL_ENV not in os.environ,
        metavar="URL",
        help=f"mysql://user:password@host:port/database?unix_socket=/path (default: ${DATABASE_URL_ENV})",
    )
    common.add_argument(
        "--sql-dir",
        type=Path,
        default=SQL_DIR,
        metavar="DIR",
        help="for development: read migrations and routines from DIR instead of the repository's sql/",
    )

    migrate_parser = db_commands.add_parser(
        "migrate",
        parents=[common],
        help="apply pending migrations and changed procedures and triggers",
        description="Apply pending migrations, then every procedure and trigger whose file changed.",
    )
    migrate_parser.add_argument(
        "--no-create", action="store_true", help="fail if the database does not exist instead of creating it"
    )
    migrate_parser.set_defaults(run=run_migrate)

    status_parser = db_commands.add_parser(
        "status",
        parents=[common],
        help="show each migration and routine as applied, pending, edited or changed",
        description="Compare sql/ with what the database recorded; changes nothing. Exits 1 if an applied "
        "migration was edited.",
    )
    status_parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    status_parser.set_defaults(run=run_status)

    target = argparse.ArgumentParser(add_help=False)
    where = target.add_mutually_exclusive_group()
    where.add_argument("--database-url", type=_database_config, default=os.environ.get(DATABASE_URL_ENV),
                       metavar="URL", help=f"the database, as an account that may read (backup) or create "
                                           f"(restore) every table (default: ${DATABASE_URL_ENV})")
    where.add_argument("--data-dir", type=Path, metavar="DATA",
                       help="`corral up`'s data directory: its private server, as its administrator")
    target.add_argument("--database", metavar="NAME", type=_database_name,
                        help="this database instead of the URL's (with --data-dir: instead of corral), e.g. to "
                             "try a backup out beside the live database")
    backup_parser = db_commands.add_parser(
        "backup", parents=[target], help="write a consistent backup of the database while it serves",
        description="Dump every table in one consistent snapshot (mariadb-dump --single-transaction, gzip), "
        "without stopping anything; the file is readable by you only and appears once whole.")
    backup_parser.add_argument("file", type=Path, metavar="FILE", help="where the backup goes (e.g. corral.sql.gz)")
    backup_parser.set_defaults(run=run_backup)
    restore_parser = db_commands.add_parser(
        "restore", parents=[target], help="load a backup into an empty database, then migrate it",
        description="Load FILE into the database, which must be empty or absent, then apply the migrations "
        "newer than the backup and every procedure and trigger. Stop the services first.")
    restore_parser.add_argument("file", type=Path, metavar="FILE", help="a backup `corral db backup` wrote")
    restore_parser.set_defaults(run=run_restore)


def run_migrate(args: argparse.Namespace) -> int:
    """`corral db migrate`: one line per applied file, then a summary."""
    config: DatabaseConfig = args.database_url
    try:
        report = migrate(config, sql_dir=args.sql_dir, create_database=not args.no_create)
    except _ERRORS as e:
        return _fail(e)
    for name in report.applied_migrations:
        print(f"applied migration {name}")
    for name in report.applied_routines:
        print(f"applied routine   {name}")
    if report.applied_migrations or report.applied_routines:
        counts = f"{_count(len(report.applied_migrations), 'migration')} and " + _count(
            len(report.applied_routines), "routine"
        )
        print(f"{config.database}: applied {counts}")
    else:
        print(f"{config.database}: up to date, nothing to apply")
    return 0


def run_status(args: argparse.Namespace) -> int:
    """`corral db status`: one line per file with its state; exit 1 if history was edited."""
    config: DatabaseConfig = args.database_url
    try:
        lines = status(config, sql_dir=args.sql_dir)
    except _ERRORS as e:
        return _fail(e)
    if args.json:
        files = [{"name": line.name, "state": line.state} for line in lines]
        print(json.dumps({"database": config.database, "files": files}, indent=2))
    else:
        for line in lines:
            print(f"{line.state:<8} {line.name}")
        print(f"{config.database}: {_summary(lines)}")
    edited = [line.name for line in lines if line.state == "edited"]
    if edited:
        return _fail(
            f"applied migrations were edited: {', '.join(edited)}; "
            "revert the edits and put the change in a new migration"
        )
    missing = [line.name for line in lines if line.state == "missing"]
    if missing:
        return _fail(f"applied migrations are missing from the sql directory: {', '.join(missing)}")
    return 0


def _target(args: argparse.Namespace) -> DatabaseConfig:
    if args.data_dir is not None:
        try:
            config = administrator(args.data_dir.expanduser() / "mariadb", "corral")
        except FileNotFoundError:
            raise BackupError(f"{args.data_dir} holds no database of `corral up` (no mariadb/admin.password)") from None
    elif args.database_url is None:
        raise BackupError(f"name the database: --database-url URL, --data-dir DATA or ${DATABASE_URL_ENV}")
    else:
        config = args.database_url
    return dataclasses.replace(config, database=args.database) if args.database else config


def run_backup(args: argparse.Namespace) -> int:
    """`corral db backup`: the file's size and what it holds."""
    try:
        config = _target(args)
        size = backup(config, args.file)
    except _ERRORS as e:
        return _fail(e)
    print(f"{config.database}: backed up to {args.file} ({size / 1e6:.1f} MB)")
    return 0


def run_restore(args: argparse.Namespace) -> int:
    """`corral db restore`: what came back, and what happens to the attempts that were running."""
    try:
        config = _target(args)
        restored = restore(config, args.file)
    except _ERRORS as e:
        return _fail(e)
    for name in restored.applied_migrations:
        print(f"applied migration {name}")
    print(f"{config.database}: restored {restored.batches} batches, {restored.jobs} jobs from {args.file}; "
          f"{restored.open_attempts} attempts were running at backup time: their jobs run again once their "
          f"workers are declared dead")
    return 0


def _database_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_]{1,64}", name):
        raise argparse.ArgumentTypeError(f"{name!r}: a database name is 1 to 64 letters, digits and underscores")
    return name


def _database_config(url: str) -> DatabaseConfig:
    try:
        return DatabaseConfig.from_url(url)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _summary(lines: list[MigrationStatus]) -> str:
    by_state: dict[str, int] = {}
    for line in lines:
        by_state[line.state] = by_state.get(line.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(by_state.items())) or "no files"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _fail(error: Exception | str) -> int:
    if isinstance(error, pymysql.MySQLError) and len(error.args) == 2:
        error = f"database error {error.args[0]}: {error.args[1]}"
    print(f"error: {error}", file=sys.stderr)
    return 1
