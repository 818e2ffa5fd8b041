"""The data layer's pool: a call that fails hands nothing on to the next one.

A procedure that fails may leave its session behind it: an open
transaction, or the session variables the hot procedures set around their
bulk statements (MariaDB 10.11 runs no handler for a CHECK that fails
inside a multi-table UPDATE). The pool must not hand that connection to the
next caller; one that merely succeeded or was retried is reused.
"""

from __future__ import annotations

import asyncio

import pymysql
import pytest

from services.db.database import Database


async def connection_id(db: Database) -> int:
    row = await db.fetchone("SELECT CONNECTION_ID() AS id")
    assert row is not None
    return int(row["id"])


LEAVES_ITS_SESSION_DIRTY = """
CREATE PROCEDURE leaves_its_session_dirty()
BEGIN
  SET @corral_bulk_job_changes = TRUE;
  START TRANSACTION;
  INSERT INTO regions (region_id, name) VALUES (61, 'left-open');
  SELECT * FROM no_such_table;
END
"""


async def test_a_failed_call_leaves_no_session_state_behind(one_connection: Database) -> None:
    """A procedure that fails with no handler, as one does when a CHECK trips
    inside a multi-table UPDATE: its transaction is open and its session
    variable set, and the client saw no OK packet saying so."""
    db = one_connection
    await db.execute(LEAVES_ITS_SESSION_DIRTY)
    before = await connection_id(db)

    with pytest.raises(pymysql.err.ProgrammingError):
        await db.call("leaves_its_session_dirty")

    row = await db.fetchone("SELECT @corral_bulk_job_changes AS flag, CONNECTION_ID() AS id")
    assert row is not None
    assert row["flag"] is None
    assert row["id"] != before
    # Had the connection been reused, this transaction would have committed the half-done insert.
    await db.execute("START TRANSACTION")
    assert await db.fetchone("SELECT name FROM regions WHERE name = 'left-open'") is None


async def test_a_cancelled_call_does_not_return_its_connection(one_connection: Database) -> None:
    db = one_connection
    before = await connection_id(db)
    call = asyncio.create_task(db.fetchone("SELECT SLEEP(5) AS s"))
    await asyncio.sleep(0.3)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # The sleeping query's reply would otherwise be read as the next call's.
    assert await connection_id(db) != before


async def test_a_successful_call_keeps_its_connection(one_connection: Database) -> None:
    db = one_connection
    assert await connection_id(db) == await connection_id(db)
