"""Apply `sql/` to a database: numbered migrations once, routines when changed.

- `sql/migrations/NNNN_name.sql` are append-only. Each is applied once, in
  order, and recorded with its SHA-256; if an applied file is later edited
  the runner refuses to do anything (history must not be rewritten: add a new
  migration instead).
- `sql/procedures/*.sql` and `sql/triggers/*.sql` hold one routine each as
  `DROP ... IF EXISTS; CREATE ...`. They are (re)applied after the migrations
  whenever their checksum differs from the recorded one, so a procedure's
  history reads as ordinary diffs of one file.

A named lock (`GET_LOCK`) keeps two runners from interleaving.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pymysql

from services.db.database import DatabaseConfig
from services.db.sqlfile import SqlFileError, split_statements

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_ROUTINE_KINDS = ("procedures", "triggers")


class MigrationError(Exception):
    """The database's recorded history disagrees with `sql/`, or a file failed."""


@dataclasses.dataclass(frozen=True)
class SqlFile:
    """One migration or routine file and its checksum."""

    key: str
    """Migration number as text ('0001') or routine name ('procedures/commit_update')."""
    path: Path
    """Where the file is."""
    checksum: str
    """SHA-256 of the file's bytes."""

    @classmethod
    def load(cls, key: str, path: Path) -> SqlFile:
        return cls(key, path, hashlib.sha256(path.read_bytes()).hexdigest())


@dataclasses.dataclass
class MigrationReport:
    """What `migrate` did."""

    applied_migrations: list[str] = dataclasses.field(default_factory=list)
    applied_routines: list[str] = dataclasses.field(default_factory=list)


def migration_files(sql_dir: Path = SQL_DIR) -> list[SqlFile]:
    """Numbered migrations in order; refuses gaps, duplicates and odd names."""
    files = []
    for path in sorted((sql_dir / "migrations").iterdir()):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_lowercase_name.sql")
        files.append(SqlFile.load(match.group(1), path))
    seen: dict[str, Path] = {}
    for f in files:
        if f.key in seen:
            raise MigrationError(f"two migrations are numbered {f.key}: {seen[f.key].name} and {f.path.name}")
        seen[f.key] = f.path
    for expected, f in enumerate(files, start=1):
        if int(f.key) != expected:
            raise MigrationError(f"migrations must be numbered 0001, 0002, ... without gaps; found {f.path.name}")
    return files


def routine_files(sql_dir: Path = SQL_DIR) -> list[SqlFile]:
    """Procedure files first (triggers may call them), each sorted by name."""
    files = []
    for kind in _ROUTINE_KINDS:
        folder = sql_dir / kind
        if folder.is_dir():
            files += [SqlFile.load(f"{kind}/{p.stem}", p) for p in sorted(folder.glob("*.sql"))]
    return files


def connect(config: DatabaseConfig, create_database: bool = False) -> pymysql.Connection:
    """A plain blocking connection for the runner, creating the schema if asked."""
    kwargs = config.connect_kwargs(with_database=False)
    kwargs.pop("init_command")
    conn = pymysql.connect(**kwargs, client_flag=pymysql.constants.CLIENT.MULTI_STATEMENTS)
    with conn.cursor() as cursor:
        if create_database:
            cursor.execute(
                f"CREATE DATABASE IF NOT EXISTS `{config.database}` "
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
            )
        cursor.execute(f"USE `{config.database}`")
    return conn


def drop_database(config: DatabaseConfig) -> None:
    """Drop `config.database` if it exists (a test's or a benchmark's own schema)."""
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{config.database}`")
    finally:
        conn.close()


@contextmanager
def _migration_lock(conn: pymysql.Connection, database: str) -> Iterator[None]:
    # Named locks are server-wide: name it after the schema being migrated.
    lock_name = f"corral_migrate:{database}"[:64]
    with conn.cursor() as cursor:
        cursor.execute("SELECT GET_LOCK(%s, 60)", (lock_name,))
        (got,) = cursor.fetchone()
        if got != 1:
            raise MigrationError("another migration runner holds the lock")
    try:
        yield
    finally:
        with conn.cursor() as cursor:
            cursor.execute("SELECT RELEASE_LOCK(%s)", (lock_name,))


def _ensure_bookkeeping(conn: pymysql.Connection) -> None:
    with conn.cursor() as cursor:
        cursor.execute(
            """CREATE TABLE IF NOT EXISTS corral_migrations (
                 version CHAR(4) NOT NULL PRIMARY KEY,
                 name VARCHAR(255) NOT NULL,
                 checksum CHAR(64) NOT NULL,
                 applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
               ) ENGINE=InnoDB"""
        )
        cursor.execute(
            """CREATE TABLE IF NOT EXISTS corral_routines (
                 name VARCHAR(255) NOT NULL PRIMARY KEY,
                 checksum CHAR(64) NOT NULL,
                 applied_at TIMESTAMP(3) NOT NULL DEFAULT CURRENT_TIMESTAMP(3)
               ) ENGINE=InnoDB"""
        )


def _recorded(conn: pymysql.Connection, table: str, key: str) -> dict[str, str]:
    with conn.cursor() as cursor:
        cursor.execute(f"SELECT {key}, checksum FROM {table}")
        return {row[0]: row[1] for row in cursor.fetchall()}


def check_history(conn: pymysql.Connection, sql_dir: Path = SQL_DIR) -> list[SqlFile]:
    """Raise if an applied migration was edited or removed; return pending ones."""
    files = migration_files(sql_dir)
    applied = _recorded(conn, "corral_migrations", "version")
    by_key = {f.key: f for f in files}
    for version, checksum in sorted(applied.items()):
        f = by_key.get(version)
        if f is None:
            raise MigrationError(
                f"migration {version} is recorded as applied but its file is gone from {sql_dir / 'migrations'}"
            )
        if f.checksum != checksum:
            raise MigrationError(
                f"migration {f.path.name} was edited after it was applied "
                f"(recorded sha256 {checksum[:12]}, file has {f.checksum[:12]}); "
                "applied migrations are append-only: revert the edit and add a new migration"
            )
    return [f for f in files if f.key not in applied]


def _apply_file(conn: pymysql.Connection, f: SqlFile) -> None:
    try:
        statements = split_statements(f.path.read_text())
    except SqlFileError as e:
        raise MigrationError(f"{f.path.name}: {e}") from e
    with conn.cursor() as cursor:
        for statement in statements:
            try:
                cursor.execute(statement)
                while cursor.nextset():
                    pass
            except pymysql.MySQLError as e:
                first_line = statement.strip().splitlines()[0][:120]
                raise MigrationError(f"{f.path.name}: {e.args[-1]} (in statement starting {first_line!r})") from e


def migrate(config: DatabaseConfig, sql_dir: Path = SQL_DIR, create_database: bool = True) -> MigrationReport:
    """Apply pending migrations, then changed routines. Idempotent."""
    report = MigrationReport()
    conn = connect(config, create_database=create_database)
    try:
        with _migration_lock(conn, config.database):
            _ensure_bookkeeping(conn)
            for f in check_history(conn, sql_dir):
                _apply_file(conn, f)
                with conn.cursor() as cursor:
                    cursor.execute(
                        "INSERT INTO corral_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                        (f.key, f.path.name, f.checksum),
                    )
                report.applied_migrations.append(f.path.name)
            applied = _recorded(conn, "corral_routines", "name")
            for f in routine_files(sql_dir):
                if applied.get(f.key) == f.checksum:
                    continue
                _apply_file(conn, f)
                with conn.cursor() as cursor:
                    cursor.execute(
                        "REPLACE INTO corral_routines (name, checksum) VALUES (%s, %s)",
                        (f.key, f.checksum),
                    )
                report.applied_routines.append(f.key)
    finally:
        conn.close()
    return report


@dataclasses.dataclass(frozen=True)
class MigrationStatus:
    """One line of `corral db status`."""

    name: str
    state: str
    """'applied', 'pending', 'edited', 'missing' (applied, file removed) or
    'changed' (a routine to re-apply)."""


def status(config: DatabaseConfig, sql_dir: Path = SQL_DIR) -> list[MigrationStatus]:
    """Compare `sql/` with what the database recorded; never writes."""
    conn = connect(config)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SHOW TABLES LIKE 'corral_migrations'")
            has_tables = cursor.fetchone() is not None
        migrations = _recorded(conn, "corral_migrations", "version") if has_tables else {}
        routines = _recorded(conn, "corral_routines", "name") if has_tables else {}
    finally:
        conn.close()
    lines = []
    files = migration_files(sql_dir)
    for f in files:
        recorded = migrations.get(f.key)
        state = "pending" if recorded is None else ("applied" if recorded == f.checksum else "edited")
        lines.append(MigrationStatus(f.path.name, state))
    present = {f.key for f in files}
    lines += [MigrationStatus(f"{version} (file removed)", "missing") for version in sorted(migrations)
              if version not in present]
    for f in routine_files(sql_dir):
        recorded = routines.get(f.key)
        state = "pending" if recorded is None else ("applied" if recorded == f.checksum else "changed")
        lines.append(MigrationStatus(f.key, state))
    return lines
