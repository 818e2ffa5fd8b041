"""The hot procedures make their scratch tables once per connection and empty them on later calls
(tests/unit/test_sql_scratch_tables.py says why, and checks the procedures' text): measured here by
the session's statement counters on a real server, around a connection's second call."""

from __future__ import annotations

from collections.abc import Iterator

import pymysql
import pytest

from services.db.database import DatabaseConfig

STALE = -1
"""No leader holds this epoch: each call makes or empties its tables, then stops at the epoch check."""

CALLS = {
    "mark_jobs_complete": f"CALL mark_jobs_complete({STALE}, 'i', '[]', 1, 10)",
    "mark_jobs_started": f"CALL mark_jobs_started({STALE}, 'i', '[]', FALSE)",
    "schedule_jobs": f"CALL schedule_jobs({STALE}, 'i', '[]', 1)",
    "release_children": f"CALL release_children({STALE}, 10, 10, 1)",
    "publish_batch_events": f"CALL publish_batch_events({STALE}, 10, NULL, 1)",
    "heartbeat_rollup": f"CALL heartbeat_rollup({STALE}, 'i', '[]', 1)",
    "claim_batch_callbacks": f"CALL claim_batch_callbacks({STALE}, 10, 1000, 1)",
    "read_ready_heads": "CALL read_ready_heads('[]')",
}


@pytest.fixture
def connection(db_config: DatabaseConfig) -> Iterator[pymysql.Connection]:
    connection = pymysql.connect(**db_config.connect_kwargs(with_database=False), database=db_config.database)
    connection.autocommit(True)
    try:
        yield connection
    finally:
        connection.close()


def _call(connection: pymysql.Connection, statement: str) -> list[tuple]:
    """Run a CALL, reading every result set; the last one's rows."""
    with connection.cursor() as cursor:
        cursor.execute(statement)
        rows = list(cursor.fetchall())
        while cursor.nextset():
            rows = list(cursor.fetchall())
    return rows


def _counters(connection: pymysql.Connection) -> dict[str, int]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN "
                       "('Com_create_temporary_table', 'Com_drop_temporary_table', 'Com_truncate', 'Com_delete')")
        return {name: int(value) for name, value in cursor.fetchall()}


def _around(connection: pymysql.Connection, statement: str) -> dict[str, int]:
    """The counters' change over one call (SHOW STATUS itself counts in none of them)."""
    before = _counters(connection)
    _call(connection, statement)
    return {name: value - before[name] for name, value in _counters(connection).items()}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_connection_makes_the_tables_on_its_first_call_and_only_empties_them_after(
        connection: pymysql.Connection, name: str) -> None:
    first = _around(connection, CALLS[name])
    assert first["Com_create_temporary_table"] > 0 and first["Com_drop_temporary_table"] > 0
    for _ in range(2):
        again = _around(connection, CALLS[name])
        assert again["Com_create_temporary_table"] == 0 and again["Com_drop_temporary_table"] == 0, again
        assert again["Com_truncate"] + again["Com_delete"] >= first["Com_create_temporary_table"], again


def test_the_tables_are_empty_on_the_next_call(connection: pymysql.Connection) -> None:
    _call(connection, "CALL create_completion_tables()")
    _call(connection, "INSERT INTO tmp_job_completions (batch_id, job_id, new_state) VALUES (1, 1, 'Success')")
    _call(connection, "INSERT INTO tmp_job_changes (batch_id, job_id, job_group_id, inst_coll, cores_mcpu, always_run,"
                      " old_state, new_state, old_dependency_failed, new_dependency_failed)"
                      " VALUES (1, 1, 0, 'p', 1, FALSE, 'Running', 'Success', FALSE, FALSE)")
    _call(connection, "CALL create_completion_tables()")
    assert _call(connection, "SELECT (SELECT COUNT(*) FROM tmp_job_completions) + (SELECT COUNT(*) FROM tmp_job_changes)") \
        == [(0,)]


def test_inside_a_transaction_the_tables_are_made_again_and_nothing_is_committed(
        connection: pymysql.Connection) -> None:
    """TRUNCATE would commit the caller's work: in a transaction the tables are dropped and made
    instead, as before they were kept."""
    _call(connection, "CREATE TABLE probe (i INT PRIMARY KEY) ENGINE=InnoDB")
    _call(connection, "CALL create_completion_tables()")
    _call(connection, "START TRANSACTION")
    _call(connection, "INSERT INTO probe VALUES (1)")
    inside = _around(connection, "CALL create_completion_tables()")
    _call(connection, "ROLLBACK")
    assert inside["Com_truncate"] == 0 and inside["Com_create_temporary_table"] > 0
    assert _call(connection, "SELECT COUNT(*) FROM probe") == [(0,)]
    # Out of the transaction again, the tables made inside it are kept.
    assert _around(connection, "CALL create_completion_tables()")["Com_create_temporary_table"] == 0


def test_tables_of_another_version_are_made_again(connection: pymysql.Connection) -> None:
    _call(connection, "CALL create_completion_tables()")
    _call(connection, "SET @corral_scratch_completion_tables = 'an-older-one'")
    changed = _around(connection, "CALL create_completion_tables()")
    # Its own five, not the change tables, whose version still matches.
    assert (changed["Com_create_temporary_table"], changed["Com_drop_temporary_table"], changed["Com_truncate"]) == (5, 5, 2)
