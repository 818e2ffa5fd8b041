"""Backups of corral's database, taken online, and restores from them.

A backup is `mariadb-dump --single-transaction` of the database, gzipped:
one consistent snapshot of every table (InnoDB's repeatable read), taken
while batches run, without locking the tables the services write. It holds
the tables and their rows and the record of applied migrations, not the
procedures and triggers: those are code, and a restore applies them from
`sql/` (with any migration newer than the backup), so a backup taken by one
release restores under the next. The file is written beside its name and
renamed into place once whole, readable by its owner only (it holds every
user's data and the tokens' hashes).

A restore loads a backup into a database that is empty or absent (never
over one that holds tables), then migrates it. What it cannot bring back is
what happened after the backup: batches submitted since are gone, and jobs
that ended since are as they were then. The attempts that were running at
backup time are still open in the restored database; their workers are not
there to report them, so the driver declares those workers dead at its
first look (their last heartbeat is older than the deadline) and the jobs
run again, as for any lost worker. docs/operations.md (Backup and restore)
says what to keep besides the database.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pymysql

from services.db.database import DatabaseConfig
from services.db.migrations import SQL_DIR, MigrationReport, drop_database, migrate
from services.db.server import find_program

COMPLETED = b"-- Dump completed"
"""The last line mariadb-dump writes once every table is dumped: a backup without it is cut short."""
SKIPPED_TABLES = ("corral_routines",)
"""Not backed up: the record of applied routines, so that a restore applies every routine anew."""
_VIEW_DEFINER = re.compile(rb"^/\*!50013 DEFINER=\S+ (SQL SECURITY \w+) \*/$", re.MULTILINE)
"""A view's definer as mariadb-dump writes it: dropped on restore (the restoring account defines it), so a
backup of one server's administrator restores under another's."""
CHUNK = 1 << 20


class BackupError(Exception):
    """A backup or restore that could not be made; nothing was left half-written."""


@dataclasses.dataclass
class Restored:
    """What a restore brought back."""

    batches: int
    jobs: int
    open_attempts: int
    """Attempts running (or sent) at backup time: their jobs run again once their workers are declared dead."""
    applied_migrations: list[str]


@contextlib.contextmanager
def _login(config: DatabaseConfig) -> Iterator[Path]:
    """A client option file holding the login, readable by this user only, for the duration: a password on a
    command line is readable by every local user (ps, /proc/PID/cmdline)."""
    with tempfile.TemporaryDirectory(prefix="corral-db-") as tmp:
        path = Path(tmp) / "client.cnf"
        lines = ["[client]", f"user={config.user}", f"password={config.password}"]
        if config.unix_socket:
            lines.append(f"socket={config.unix_socket}")
        else:
            lines += [f"host={config.host}", f"port={config.port}", "protocol=tcp"]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")
        yield path


def backup(config: DatabaseConfig, path: Path) -> int:
    """Write a consistent backup of `config`'s database to `path` (gzip, 0600); its size in bytes. Raises
    BackupError, leaving no file, if the dump fails."""
    partial = path.with_name(path.name + ".partial")
    with _login(config) as login:
        argv = [find_program("mariadb-dump"), f"--defaults-extra-file={login}", "--single-transaction", "--quick",
                "--skip-lock-tables", "--hex-blob", "--no-tablespaces", "--skip-triggers",
                "--default-character-set=utf8mb4",
                *(f"--ignore-table={config.database}.{table}" for table in SKIPPED_TABLES), config.database]
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            with os.fdopen(fd, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3) as out, \
                    subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as dump:
                assert dump.stdout is not None and dump.stderr is not None
                shutil.copyfileobj(dump.stdout, out, CHUNK)
                errors = dump.stderr.read().decode(errors="replace").strip()
                if dump.wait() != 0:
                    raise BackupError(f"mariadb-dump failed: {errors.splitlines()[-1] if errors else dump.returncode}")
                out.flush()
                out.close()
                raw.flush()
                os.fsync(raw.fileno())
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
    return path.stat().st_size


def check(path: Path) -> None:
    """Raise BackupError unless `path` is a whole backup: gzip that decompresses to the end, and a dump that
    mariadb-dump finished."""
    tail = b""
    try:
        with gzip.open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                tail = (tail + chunk)[-4096:]
    except (OSError, EOFError) as e:
        raise BackupError(f"{path} is not a whole backup: {e}") from e
    if COMPLETED not in tail:
        raise BackupError(f"{path} is cut short: it does not end as a finished mariadb-dump does")


def _tables(config: DatabaseConfig) -> int:
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = %s",
                           (config.database,))
            (n,) = cursor.fetchone()
            if n == 0:
                cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{config.database}` "
                               "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
            return int(n)
    finally:
        conn.close()


def _load(config: DatabaseConfig, path: Path, sql_dir: Path) -> MigrationReport:
    """Pipe the backup into `mariadb`, then migrate."""
    with _login(config) as login, gzip.open(path, "rb") as dump, subprocess.Popen(
            [find_program("mariadb"), f"--defaults-extra-file={login}", f"--database={config.database}",
             "--default-character-set=utf8mb4", "--binary-mode"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as load:
        assert load.stdin is not None and load.stderr is not None
        try:
            for line in dump:
                load.stdin.write(_VIEW_DEFINER.sub(rb"/*!50013 \1 */", line))
            load.stdin.close()
        except BrokenPipeError:
            pass
        errors = load.stderr.read().decode(errors="replace").strip()
        if load.wait() != 0:
            raise BackupError(f"loading {path} failed: {errors.splitlines()[-1] if errors else load.returncode}")
    return migrate(config, sql_dir=sql_dir, create_database=False)


def restore(config: DatabaseConfig, path: Path, sql_dir: Path = SQL_DIR) -> Restored:
    """Load the backup at `path` into `config`'s database, which must be empty or absent, then migrate it.
    Raises BackupError (the backup cut short, the database not empty, the load failed)."""
    check(path)
    if tables := _tables(config):
        raise BackupError(f"database {config.database} holds {tables} tables: a backup is restored only into an "
                          "empty database (drop or rename it first)")
    try:
        report = _load(config, path, sql_dir)
    except BaseException as e:
        try:
            drop_database(config)  # it was empty or absent: nothing is left half-restored
        except pymysql.MySQLError as drop_error:
            e.add_note(f"database {config.database} is left half-restored: dropping it failed ({drop_error})")
        raise
    kwargs = config.connect_kwargs()
    kwargs["database"] = kwargs.pop("db", config.database)  # aiomysql's name for it; pymysql's is `database`
    conn = pymysql.connect(**kwargs)
    try:
        with conn.cursor() as cursor:
            counts = []
            for sql in ("SELECT COUNT(*) FROM batches", "SELECT COUNT(*) FROM jobs",
                        "SELECT COUNT(*) FROM attempts WHERE end_time_ms IS NULL"):
                cursor.execute(sql)
                counts.append(int(cursor.fetchone()[0]))
    finally:
        conn.close()
    return Restored(*counts, applied_migrations=report.applied_migrations)
