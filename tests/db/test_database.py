"""The data layer's pool: a call that fails hands nothing on to the next one.

A procedure that fails may leave its session behind it: an open
transaction, or the session variables the hot procedures set around their
bulk statements (MariaDB 10.11 runs no handler for a CHECK that fails
inside a multi-table UPDATE). The pool must not hand that connection to the
next caller; one that merely succeeded or was retried is reused.
"""

from __future__ import annotations

import asyncio
import json
import random
from typing import Any

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


ECHO_JSON = """
CREATE PROCEDURE echo_json(IN in_value JSON, IN in_text TEXT)
BEGIN
  SELECT 0 AS rc, 'echoed' AS message, in_value AS value, in_text AS text, JSON_VALID(in_value) AS valid;
END
"""

TRICKY_TEXT = ["", "'", "''", "\\", "\\'", "'\\", '"', "\\\"", "%s", "%%", "%(x)s", "\0", "\x1a", "\n\r\t",
               "é", "日本", "🐄", "a'b\\c\"d%e", "'); DROP TABLE jobs; --", "\\' OR 1=1 -- "]


def tricky_values(n: int) -> list[Any]:
    """JSON values whose strings hold every character SQL literals care about, and random ones."""
    rng = random.Random(15)
    alphabet = "".join(TRICKY_TEXT) + "abc 0{}[]:,"
    values: list[Any] = [{"key": t, t: [t, {"nested": t}]} for t in TRICKY_TEXT]
    for _ in range(n):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
        values.append([{"job_id": rng.randint(0, 2**31), "attributes": [{"key": text, "value": text[::-1]}]}])
    return values


@pytest.mark.parametrize("sql_mode", ["default", "no_backslash_escapes"])
async def test_json_arguments_reach_the_procedure_unchanged(one_connection: Database, sql_mode: str) -> None:
    """A procedure's JSON argument is written as a literal by corral itself (sql_literal), not by pymysql: every
    quote, backslash, percent sign and non-ASCII character arrives as sent, beside a text argument that
    pymysql escapes, whether or not the server treats backslashes as escapes."""
    db = one_connection
    await db.execute(ECHO_JSON)
    if sql_mode == "no_backslash_escapes":
        await db.execute("SET SESSION sql_mode = CONCAT(@@sql_mode, ',NO_BACKSLASH_ESCAPES')")
        row = await db.fetchone("SELECT @@sql_mode AS mode")
        assert row is not None and "NO_BACKSLASH_ESCAPES" in row["mode"]
    for value in tricky_values(300):
        text = json.dumps(value)
        status, _ = await db.call("echo_json", value, text)
        assert status["valid"] == 1
        assert json.loads(status["value"]) == value
        assert status["text"] == text
