"""`corral db backup` and `restore` (services/db/backup.py) on a real MariaDB: a backup taken while jobs
finish restores whole (the invariant checker clean, every routine back, the attempts that were running
still open), a restore never writes over a database that holds tables, and a backup cut short or a dump
that fails leaves nothing behind."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pymysql
import pytest

from services.db.backup import BackupError, backup, restore
from services.db.database import Database, DatabaseConfig
from services.db.invariants import check_invariants
from services.db.migrations import drop_database
from services.driver.store import DriverStore
from tests.world import World

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def empty(mariadb_server: DatabaseConfig) -> AsyncIterator[DatabaseConfig]:
    """The name of a database that does not exist yet, dropped after the test."""
    config = dataclasses.replace(mariadb_server, database=f"corral_test_restore_{uuid.uuid4().hex[:8]}")
    try:
        yield config
    finally:
        drop_database(config)


async def _routines(db: Database, name: str) -> list[tuple[str, str]]:
    rows = await db.fetchall(
        "SELECT routine_type kind, routine_name name FROM information_schema.routines WHERE routine_schema = %s "
        "UNION ALL SELECT 'TRIGGER', trigger_name FROM information_schema.triggers WHERE trigger_schema = %s "
        "UNION ALL SELECT 'VIEW', table_name FROM information_schema.views WHERE table_schema = %s ORDER BY 1, 2",
        (name, name, name))
    return [(row["kind"], row["name"]) for row in rows]


async def test_a_backup_taken_while_jobs_finish_restores_whole(world: World, db_config: DatabaseConfig,
                                                             empty: DatabaseConfig, tmp_path: Path) -> None:
    await world.instance()
    batch_id, _, start = await world.batch([{} for _ in range(400)])
    attempts = {job_id: await world.run(batch_id, job_id) for job_id in range(start, start + 300)}
    path = tmp_path / "corral.sql.gz"

    async def finishing() -> int:
        done = 0
        for job_id, attempt in attempts.items():
            if job_id >= start + 200:
                break
            await world.finish(batch_id, job_id, attempt, "Success")
            done += 1
        return done

    # The dump's snapshot falls somewhere among these completions: whichever it sees, it sees whole.
    size, finished = await asyncio.gather(asyncio.to_thread(backup, db_config, path), finishing())
    assert size > 0 and finished == 200
    assert path.stat().st_mode & 0o777 == 0o600
    assert not list(tmp_path.glob("*.partial"))

    assert not _exists(empty)
    restored = await asyncio.to_thread(restore, empty, path)
    assert _exists(empty)
    assert (restored.batches, restored.jobs) == (1, 400)
    assert 100 <= restored.open_attempts <= 300  # running when the snapshot was taken
    copy = await Database.connect(empty)
    try:
        assert await check_invariants(copy) == []
        assert await _routines(copy, empty.database) == await _routines(world.db, db_config.database)
        migrations = "SELECT version, checksum FROM corral_migrations ORDER BY version"
        assert await copy.fetchall(migrations) == await world.db.fetchall(migrations)
        # The restored database works: its procedures run, its triggers keep the counters.
        epoch = await DriverStore(copy, world.clock).elect_leader("driver-9")
        assert epoch > world.epoch
    finally:
        await copy.close()


async def test_a_restore_never_writes_over_a_database_that_holds_tables(world: World, db_config: DatabaseConfig,
                                                                       tmp_path: Path) -> None:
    await world.batch([{}])
    path = tmp_path / "corral.sql.gz"
    backup(db_config, path)
    before = await world.db.fetchall("SELECT batch_id, state FROM batches")
    with pytest.raises(BackupError, match=r"holds \d+ tables: a backup is restored only into an empty database"):
        restore(db_config, path)
    assert await world.db.fetchall("SELECT batch_id, state FROM batches") == before


async def test_a_backup_cut_short_is_refused_before_anything_is_made(world: World, db_config: DatabaseConfig,
                                                                     empty: DatabaseConfig, tmp_path: Path) -> None:
    await world.batch([{}, {}])
    whole = tmp_path / "corral.sql.gz"
    backup(db_config, whole)
    text = gzip.decompress(whole.read_bytes())
    for name, data in (("truncated-gzip", whole.read_bytes()[:-100]),
                       ("truncated-dump", gzip.compress(text[:len(text) // 2]))):
        cut = tmp_path / f"{name}.sql.gz"
        cut.write_bytes(data)
        with pytest.raises(BackupError, match="not a whole backup|cut short"):
            restore(empty, cut)
    assert not _exists(empty), "a refused restore created the database"


async def test_a_load_that_fails_halfway_leaves_no_database(world: World, db_config: DatabaseConfig,
                                                           empty: DatabaseConfig, tmp_path: Path) -> None:
    await world.batch([{}, {}])
    whole = tmp_path / "corral.sql.gz"
    backup(db_config, whole)
    text = gzip.decompress(whole.read_bytes())
    middle = text.index(b"INSERT INTO `jobs`")
    broken = tmp_path / "broken.sql.gz"  # whole by its ending, but one statement in it fails
    broken.write_bytes(gzip.compress(text[:middle] + b"INSERT INTO no_such_table VALUES (1);\n" + text[middle:]))
    with pytest.raises(BackupError, match="loading .* failed: .*no_such_table"):
        restore(empty, broken)
    assert not _exists(empty)


def _exists(config: DatabaseConfig) -> bool:
    conn = pymysql.connect(**config.connect_kwargs(with_database=False))
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = %s",
                           (config.database,))
            return cursor.fetchone()[0] == 1
    finally:
        conn.close()


def test_a_dump_that_fails_leaves_no_file(db_config: DatabaseConfig, tmp_path: Path) -> None:
    path = tmp_path / "corral.sql.gz"
    with pytest.raises(BackupError, match="mariadb-dump failed"):
        backup(dataclasses.replace(db_config, password="not-the-password", user="nobody"), path)
    assert list(tmp_path.iterdir()) == []


def test_the_cli_says_what_it_needs_in_one_line(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key != "CORRAL_DATABASE_URL"}
    for argv, said in ((["backup", "--data-dir", str(tmp_path), str(tmp_path / "b.sql.gz")],
                        "holds no database of `corral up`"),
                       (["restore", str(tmp_path / "b.sql.gz")], "name the database")):
        done = subprocess.run([sys.executable, "-m", "corral.cli", "db", *argv], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done
        assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
