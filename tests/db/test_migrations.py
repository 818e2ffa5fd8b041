"""The migration runner and `corral db` against a real MariaDB.

Applied history is append-only: re-running is a no-op, edited or removed
migrations and badly numbered files are refused before anything is applied,
and a changed procedure file is re-applied on its own. Tests that change
`sql/` do it on a copy in tmp_path, passed as `sql_dir` (or `--sql-dir`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pymysql
import pytest

from services.db.database import DatabaseConfig
from services.db.migrations import (
    SQL_DIR,
    MigrationError,
    MigrationReport,
    drop_database,
    migrate,
    migration_files,
    status,
)

REPO = SQL_DIR.parent
PROCEDURE = "check_epoch"
"""A small procedure whose file the tests change."""


@pytest.fixture
def sql_copy(tmp_path: Path) -> Path:
    """A private copy of the repository's sql/ that a test may edit."""
    return Path(shutil.copytree(SQL_DIR, tmp_path / "sql"))


def _query(config: DatabaseConfig, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    kwargs = config.connect_kwargs(with_database=False)
    conn = pymysql.connect(**kwargs, database=config.database)  # pymysql deprecates aiomysql's `db`
    try:
        with conn.cursor() as cursor:
            cursor.execute(sql, args)
            return list(cursor.fetchall())
    finally:
        conn.close()


def _schema(config: DatabaseConfig) -> dict[str, list[tuple[Any, ...]]]:
    """Tables, columns, routines, triggers and the runner's bookkeeping rows."""
    where = "WHERE {} = %s ORDER BY 1, 2"
    db = (config.database,)
    return {
        "tables": _query(config, "SELECT table_name, table_type FROM information_schema.tables "
                         + where.format("table_schema"), db),
        "columns": _query(config, "SELECT table_name, column_name, column_type FROM information_schema.columns "
                          + where.format("table_schema"), db),
        "routines": _query(config, "SELECT routine_name, routine_type, routine_definition, created, last_altered "
                           "FROM information_schema.routines " + where.format("routine_schema"), db),
        "triggers": _query(config, "SELECT trigger_name, event_object_table, action_statement, created "
                           "FROM information_schema.triggers " + where.format("trigger_schema"), db),
        "migrations": _query(config, "SELECT * FROM corral_migrations ORDER BY version"),
        "routine_records": _query(config, "SELECT * FROM corral_routines ORDER BY name"),
    }


def _next_migration_number(sql_dir: Path) -> int:
    return len(migration_files(sql_dir)) + 1


def _change_procedure(sql_dir: Path, comment: str) -> None:
    """Give the procedure a COMMENT, so the database shows whether it was re-created."""
    path = sql_dir / "procedures" / f"{PROCEDURE}.sql"
    text, n = re.subn(rf"^(CREATE PROCEDURE {PROCEDURE}\(.*\))$", rf"\1 COMMENT '{comment}'", path.read_text(), flags=re.M)
    assert n == 1, "the procedure's parameter list is expected on its CREATE line"
    path.write_text(text)


def _procedure_comment(config: DatabaseConfig) -> str:
    [(comment,)] = _query(
        config,
        "SELECT routine_comment FROM information_schema.routines WHERE routine_schema = %s AND routine_name = %s",
        (config.database, PROCEDURE),
    )
    return comment


def _has_table(config: DatabaseConfig, name: str) -> bool:
    return bool(_query(config, "SHOW TABLES LIKE %s", (name,)))


# ---------------------------------------------------------------- the runner


def test_migrating_again_applies_nothing(db_config: DatabaseConfig) -> None:
    before = _schema(db_config)
    assert migrate(db_config) == MigrationReport()
    assert _schema(db_config) == before


def test_status_of_a_migrated_database_is_all_applied(db_config: DatabaseConfig) -> None:
    lines = status(db_config)
    assert {line.state for line in lines} == {"applied"}
    names = {line.name for line in lines}
    assert "0001_schema.sql" in names and f"procedures/{PROCEDURE}" in names


def test_new_migration_is_applied_alone(db_config: DatabaseConfig, sql_copy: Path) -> None:
    name = f"{_next_migration_number(sql_copy):04d}_test_marker.sql"
    (sql_copy / "migrations" / name).write_text("CREATE TABLE test_marker (id INT PRIMARY KEY);\n")

    assert migrate(db_config, sql_dir=sql_copy) == MigrationReport(applied_migrations=[name])
    assert _has_table(db_config, "test_marker")
    assert migrate(db_config, sql_dir=sql_copy) == MigrationReport()


def test_edited_migration_is_refused_and_nothing_more_is_applied(db_config: DatabaseConfig, sql_copy: Path) -> None:
    new_migration = f"{_next_migration_number(sql_copy):04d}_test_marker.sql"
    (sql_copy / "migrations" / new_migration).write_text("CREATE TABLE test_marker (id INT PRIMARY KEY);\n")
    _change_procedure(sql_copy, "changed by test")
    # Even a comment counts: the recorded checksum is of the file's bytes.
    with (sql_copy / "migrations" / "0001_schema.sql").open("a") as f:
        f.write("\n-- an innocent-looking edit\n")
    before = _schema(db_config)

    with pytest.raises(MigrationError, match=r"migration 0001_schema\.sql was edited after it was applied") as error:
        migrate(db_config, sql_dir=sql_copy)

    assert "add a new migration" in str(error.value)
    assert _schema(db_config) == before
    assert not _has_table(db_config, "test_marker")
    assert _procedure_comment(db_config) == ""
    states = {line.name: line.state for line in status(db_config, sql_dir=sql_copy)}
    assert states["0001_schema.sql"] == "edited"
    assert states[new_migration] == "pending"
    assert states[f"procedures/{PROCEDURE}"] == "changed"


def test_removed_migration_is_refused(db_config: DatabaseConfig, sql_copy: Path) -> None:
    last = migration_files(sql_copy)[-1]
    (sql_copy / "migrations" / last.path.name).unlink()
    _change_procedure(sql_copy, "changed by test")

    with pytest.raises(MigrationError, match=rf"migration {last.key} is recorded as applied but its file is gone"):
        migrate(db_config, sql_dir=sql_copy)
    assert _procedure_comment(db_config) == ""
    missing = [line for line in status(db_config, sql_dir=sql_copy) if line.state == "missing"]
    assert [line.name for line in missing] == [f"{last.key} (file removed)"]


def test_changed_procedure_is_reapplied_alone(db_config: DatabaseConfig, sql_copy: Path) -> None:
    _change_procedure(sql_copy, "changed by test")
    changed = [line.name for line in status(db_config, sql_dir=sql_copy) if line.state != "applied"]
    assert changed == [f"procedures/{PROCEDURE}"]
    before = _schema(db_config)

    report = migrate(db_config, sql_dir=sql_copy)

    assert report == MigrationReport(applied_routines=[f"procedures/{PROCEDURE}"])
    assert _procedure_comment(db_config) == "changed by test"
    after = _schema(db_config)
    # Every other routine and trigger is untouched (same definition and creation time).
    assert [r for r in after["routines"] if r[0] != PROCEDURE] == [r for r in before["routines"] if r[0] != PROCEDURE]
    assert after["triggers"] == before["triggers"]
    assert after["migrations"] == before["migrations"]
    assert migrate(db_config, sql_dir=sql_copy) == MigrationReport()


FUNCTION = "job_reserve_ms"
"""A stored function among the procedures' files (sql/procedures/ holds both kinds of routine)."""


def test_a_function_is_applied_and_reapplied_like_a_procedure(db_config: DatabaseConfig, sql_copy: Path) -> None:
    [(kind,)] = _query(db_config, "SELECT routine_type FROM information_schema.routines "
                                  "WHERE routine_schema = %s AND routine_name = %s", (db_config.database, FUNCTION))
    assert kind == "FUNCTION"
    assert _query(db_config, f"SELECT {FUNCTION}(NULL, 60000)") == [(75_000,)]
    path = sql_copy / "procedures" / f"{FUNCTION}.sql"
    text, n = re.subn(r"KILL_ALLOWANCE_MS BIGINT DEFAULT 15000;", "KILL_ALLOWANCE_MS BIGINT DEFAULT 20000;",
                      path.read_text())
    assert n == 1, "the function's kill allowance is expected as a DECLARE"
    path.write_text(text)
    assert [line.name for line in status(db_config, sql_dir=sql_copy) if line.state != "applied"] == [
        f"procedures/{FUNCTION}"]

    assert migrate(db_config, sql_dir=sql_copy) == MigrationReport(applied_routines=[f"procedures/{FUNCTION}"])
    assert _query(db_config, f"SELECT {FUNCTION}(NULL, 60000)") == [(80_000,)]
    assert migrate(db_config, sql_dir=sql_copy) == MigrationReport()
    # And back: the checksum decides, not which way the file changed.
    assert migrate(db_config) == MigrationReport(applied_routines=[f"procedures/{FUNCTION}"])
    assert _query(db_config, f"SELECT {FUNCTION}(NULL, 60000)") == [(75_000,)]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("{next_plus_1:04d}_gap.sql", "without gaps; found {name}"),
        ("0001_duplicate.sql", "two migrations are numbered 0001"),
        ("{next:04d}_CamelCase.sql", "{name}: migration files are named NNNN_lowercase_name.sql"),
        ("{next:04d}-dashed.sql", "{name}: migration files are named"),
        ("{next:03d}_three_digits.sql", "{name}: migration files are named"),
        ("{next:04d}_not_sql.txt", "{name}: migration files are named"),
        ("README.md", "{name}: migration files are named"),
    ],
)
def test_badly_numbered_or_named_migration_is_refused(
    db_config: DatabaseConfig, sql_copy: Path, name: str, message: str
) -> None:
    number = _next_migration_number(sql_copy)
    name = name.format(next=number, next_plus_1=number + 1)
    (sql_copy / "migrations" / name).write_text("CREATE TABLE test_marker (id INT PRIMARY KEY);\n")
    _change_procedure(sql_copy, "changed by test")
    before = _schema(db_config)

    with pytest.raises(MigrationError, match=re.escape(message.format(name=name))):
        migrate(db_config, sql_dir=sql_copy)

    assert _schema(db_config) == before
    assert not _has_table(db_config, "test_marker")


# ---------------------------------------------------------------- the CLI


def _url(config: DatabaseConfig, database: str | None = None) -> str:
    database = database or config.database
    credentials = quote(config.user, safe="") + (":" + quote(config.password, safe="") if config.password else "")
    if config.unix_socket:
        return f"mysql://{credentials}@localhost/{database}?unix_socket={config.unix_socket}"
    return f"mysql://{credentials}@{config.host}:{config.port}/{database}"


def _corral(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m corral.cli ARGS` as its own process."""
    environment = {k: v for k, v in os.environ.items() if k != "CORRAL_DATABASE_URL"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "corral.cli", *map(str, args)],
        cwd=REPO, env=environment, capture_output=True, text=True, timeout=120,
    )


@pytest.fixture
def new_database(mariadb_server: DatabaseConfig) -> Iterator[DatabaseConfig]:
    """The name of a database that does not exist yet; dropped afterwards."""
    config = dataclasses.replace(mariadb_server, database=f"corral_test_{uuid.uuid4().hex[:12]}")
    try:
        yield config
    finally:
        drop_database(config)


def test_cli_migrates_a_new_database_then_reports_it_applied(new_database: DatabaseConfig) -> None:
    url = _url(new_database)
    migrations = [f.path.name for f in migration_files()]

    refused = _corral("db", "migrate", "--database-url", url, "--no-create")
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: database error 1049: Unknown database")

    applied = _corral("db", "migrate", "--database-url", url)
    assert applied.returncode == 0, applied.stderr
    lines = applied.stdout.splitlines()
    assert lines[: len(migrations)] == [f"applied migration {name}" for name in migrations]
    assert f"applied routine   procedures/{PROCEDURE}" in lines
    n_routines = len(lines) - len(migrations) - 1
    assert lines[-1] == f"{new_database.database}: applied {len(migrations)} migrations and {n_routines} routines"

    shown = _corral("db", "status", "--database-url", url)
    assert shown.returncode == 0, shown.stderr
    assert f"applied  {migrations[0]}" in shown.stdout.splitlines()
    assert shown.stdout.splitlines()[-1] == f"{new_database.database}: {len(migrations) + n_routines} applied"

    again = _corral("db", "migrate", "--database-url", url)
    assert (again.returncode, again.stdout) == (0, f"{new_database.database}: up to date, nothing to apply\n")


def test_cli_status_json_shows_a_changed_procedure_that_migrate_applies(
    db_config: DatabaseConfig, sql_copy: Path
) -> None:
    _change_procedure(sql_copy, "changed by test")
    url = _url(db_config)

    shown = _corral("db", "status", "--database-url", url, "--sql-dir", sql_copy, "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert document["database"] == db_config.database
    states = {f["name"]: f["state"] for f in document["files"]}
    assert states.pop(f"procedures/{PROCEDURE}") == "changed"
    assert set(states.values()) == {"applied"}

    applied = _corral("db", "migrate", "--database-url", url, "--sql-dir", sql_copy)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.splitlines() == [
        f"applied routine   procedures/{PROCEDURE}",
        f"{db_config.database}: applied 0 migrations and 1 routine",
    ]
    assert _procedure_comment(db_config) == "changed by test"


def test_cli_refuses_an_edited_migration(db_config: DatabaseConfig, sql_copy: Path) -> None:
    with (sql_copy / "migrations" / "0001_schema.sql").open("a") as f:
        f.write("\n-- an innocent-looking edit\n")
    url = _url(db_config)

    refused = _corral("db", "migrate", "--database-url", url, "--sql-dir", sql_copy)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.startswith("error: migration 0001_schema.sql was edited after it was applied")
    assert len(refused.stderr.splitlines()) == 1

    shown = _corral("db", "status", "--database-url", url, "--sql-dir", sql_copy)
    assert shown.returncode == 1
    assert "edited   0001_schema.sql" in shown.stdout.splitlines()
    assert shown.stderr.startswith("error: applied migrations were edited: 0001_schema.sql;")


def test_cli_reads_the_database_url_from_the_environment(db_config: DatabaseConfig) -> None:
    shown = _corral("db", "status", env={"CORRAL_DATABASE_URL": _url(db_config)})
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[-1].startswith(f"{db_config.database}: ")


def test_console_script_runs(db_config: DatabaseConfig) -> None:
    script = Path(sys.executable).with_name("corral")
    if not script.exists():
        pytest.skip(f"no console script beside {sys.executable}")
    done = subprocess.run(
        [script, "db", "status", "--json", "--database-url", _url(db_config)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["database"] == db_config.database


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["db", "status"], "the following arguments are required: --database-url"),
        (["db", "migrate", "--database-url", "postgres://x/y"], "database URL must start with mysql://"),
        (["db"], "the following arguments are required: COMMAND"),
    ],
)
def test_cli_usage_errors_exit_2(args: list[str], message: str) -> None:
    done = _corral(*args)
    assert done.returncode == 2
    assert message in done.stderr
