"""The statement time limit of the frontend's reads (Database.time_limited):
a read that runs past it is aborted by MariaDB (error 1969) and raises
StatementTimeout; the connection it ran on is closed, and the pool goes on."""

from __future__ import annotations

import time

import pymysql
import pytest

from services.db.database import Database, DatabaseConfig, StatementTimeout


async def test_a_read_past_the_limit_raises_statement_timeout_and_the_pool_goes_on(
        one_connection: Database) -> None:
    reads = one_connection.time_limited(0.2)
    first = await one_connection.fetchone("SELECT CONNECTION_ID() AS id")
    started = time.monotonic()
    with pytest.raises(StatementTimeout) as error:
        await reads.fetchall("SELECT SLEEP(5) AS slept", name="slow_read")
    assert time.monotonic() - started < 4  # aborted at the limit, not after the sleep
    assert (error.value.name, error.value.limit_s) == ("slow_read", 0.2)
    assert "0.2 s" in str(error.value)
    # The connection was closed; the pool opens another and both views work.
    again = await reads.fetchone("SELECT CONNECTION_ID() AS id")
    assert again is not None and first is not None and again["id"] != first["id"]
    assert await one_connection.fetchone("SELECT 1 AS one") == {"one": 1}


async def test_the_limit_holds_while_waiting_for_a_lock(db: Database, db_config: DatabaseConfig) -> None:
    """A read blocked by another session's table lock is aborted at the limit too: how
    the service tests make a read slow on purpose."""
    await db.execute("CREATE TABLE t (i INT)")
    holder = pymysql.connect(**db_config.connect_kwargs(with_database=False), database=db_config.database)
    try:
        with holder.cursor() as cursor:
            cursor.execute("LOCK TABLES t WRITE")
        with pytest.raises(StatementTimeout):
            await db.time_limited(0.2).fetchall("SELECT * FROM t")
    finally:
        holder.close()
    assert await db.time_limited(0.2).fetchall("SELECT * FROM t") == []


async def test_the_unlimited_pool_and_procedures_are_not_limited(db: Database) -> None:
    reads = db.time_limited(0.05)
    assert await db.fetchone("SELECT SLEEP(0.2) AS slept") == {"slept": 0}
    assert await reads.fetchone("SELECT 1 AS one") == {"one": 1}
    assert reads.statement_time_limit_s == 0.05 and db.statement_time_limit_s is None


async def test_other_errors_are_not_mistaken_for_the_limit(db: Database) -> None:
    with pytest.raises(pymysql.err.ProgrammingError):
        await db.time_limited(1).fetchall("SELECT * FROM no_such_table")
