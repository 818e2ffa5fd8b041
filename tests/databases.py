"""Migrated databases for the tests, each used by one test at a time and made new between tests by
emptying it, not by migrating another (issue 34: 685 tests each migrated a database of their own, some
1.2 s apiece, a third of the suite's time; emptying one takes about 0.1 s).

A database is migrated once, when no emptied one is free, and its rows right after migrating (the
seeds: regions, pools, resources, the leader lease, ...) are kept in memory. When its test ends it is
made as new again: every table the test touched (its rows or its AUTO_INCREMENT differ from what
migrating left) emptied with TRUNCATE, which resets AUTO_INCREMENT too, and its seeds put back. A test
that changed more than rows (a table's columns, a procedure, a trigger, a view, an index: the schema's
fingerprint differs from the one taken after migrating), or whose database cannot be emptied (a
connection it left holds a lock), gives it up: it is dropped, never handed out again.

Tests stay independent: each still starts from exactly what a migrated database holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from typing import Any

import pymysql

from services.db.database import DatabaseConfig
from services.db.migrations import connect, drop_database, migrate

BOOKKEEPING = frozenset({"corral_migrations", "corral_routines"})
"""The migration runner's own tables: left as migrating left them."""
RESET_LOCK_WAIT_S = 30
"""How long emptying a database waits for a lock a test's leftover connection holds, before it gives the
database up."""

_FINGERPRINT = """
SELECT 'table', CONCAT_WS('|', table_name, table_type, engine, table_collation, create_options)
  FROM information_schema.tables WHERE table_schema = %(db)s
UNION ALL SELECT 'column', CONCAT_WS('|', table_name, column_name, column_type, is_nullable, column_default, extra,
                                     collation_name)
  FROM information_schema.columns WHERE table_schema = %(db)s
UNION ALL SELECT 'constraint', CONCAT_WS('|', table_name, constraint_name, constraint_type)
  FROM information_schema.table_constraints WHERE constraint_schema = %(db)s
UNION ALL SELECT 'index', CONCAT_WS('|', table_name, index_name, seq_in_index, column_name, non_unique)
  FROM information_schema.statistics WHERE table_schema = %(db)s
UNION ALL SELECT 'routine', CONCAT_WS('|', routine_type, routine_name, MD5(routine_definition), routine_comment,
                                      security_type, sql_mode, is_deterministic, sql_data_access)
  FROM information_schema.routines WHERE routine_schema = %(db)s
UNION ALL SELECT 'parameter', CONCAT_WS('|', specific_name, ordinal_position, parameter_mode, parameter_name,
                                        dtd_identifier)
  FROM information_schema.parameters WHERE specific_schema = %(db)s
UNION ALL SELECT 'trigger', CONCAT_WS('|', trigger_name, event_object_table, MD5(action_statement))
  FROM information_schema.triggers WHERE trigger_schema = %(db)s
UNION ALL SELECT 'view', CONCAT_WS('|', table_name, MD5(view_definition))
  FROM information_schema.views WHERE table_schema = %(db)s
"""


@dataclasses.dataclass(frozen=True)
class _Migrated:
    """What a database held right after migrating."""

    tables: tuple[str, ...]
    seeds: dict[str, tuple[tuple[str, ...], list[tuple[Any, ...]]]]
    """Per table that had rows: its columns and its rows."""
    fingerprint: str
    state: dict[str, tuple[int | None, int | None]]
    """Per table: its AUTO_INCREMENT, and its CHECKSUM TABLE (None where it had no rows)."""


def _state(cursor: pymysql.cursors.Cursor, database: str, tables: tuple[str, ...],
           seeded: set[str]) -> dict[str, tuple[int | None, int | None]]:
    """Per table, what says whether a test touched it: its AUTO_INCREMENT (a row inserted and deleted
    again moves it), and its rows' checksum (for a table without seeds, 0 if empty and 1 if not)."""
    cursor.execute("SELECT table_name, auto_increment FROM information_schema.tables "
                   "WHERE table_schema = %s AND table_type = 'BASE TABLE'", (database,))
    increments = dict(cursor.fetchall())
    cursor.execute(" UNION ALL ".join(f"SELECT '{t}', EXISTS(SELECT 1 FROM `{t}`)" for t in tables if t not in seeded))
    rows = dict(cursor.fetchall())
    if seeded:
        cursor.execute("CHECKSUM TABLE " + ", ".join(f"`{t}`" for t in sorted(seeded)))
        rows |= {name.split(".", 1)[1]: checksum for name, checksum in cursor.fetchall()}
    return {t: (increments.get(t), rows.get(t)) for t in tables}


def _fingerprint(cursor: pymysql.cursors.Cursor, database: str) -> str:
    """The schema's shape, and what the migration runner recorded of it (a test may re-apply a routine)."""
    cursor.execute(_FINGERPRINT + f"""
UNION ALL SELECT 'migration', CONCAT_WS('|', version, checksum) FROM `{database}`.corral_migrations
UNION ALL SELECT 'recorded', CONCAT_WS('|', name, checksum) FROM `{database}`.corral_routines""", {"db": database})
    return hashlib.sha256("\n".join(sorted(f"{kind} {text}" for kind, text in cursor.fetchall())).encode()).hexdigest()


class MigratedDatabases:
    """The session's databases on one server (see the module docstring)."""

    def __init__(self, server: DatabaseConfig, prefix: str = "corral_test_"):
        self._server = server
        self._prefix = prefix
        self._free: list[str] = []
        self._made: dict[str, _Migrated] = {}
        self.migrations = 0
        """How many databases were migrated (for the curious: the rest of the tests reused them)."""

    def take(self, **overrides: Any) -> DatabaseConfig:
        """A database as migrating leaves it, for one test; `overrides` are DatabaseConfig fields."""
        if self._free:
            name = self._free.pop()
        else:
            name = f"{self._prefix}{uuid.uuid4().hex[:12]}"
            config = dataclasses.replace(self._server, database=name)
            migrate(config, create_database=True)
            self._made[name] = self._read(config)
            self.migrations += 1
        return dataclasses.replace(self._server, database=name, **overrides)

    def give_back(self, config: DatabaseConfig) -> None:
        """The test of `config` ended: empty its database for the next one, or drop it if it cannot be."""
        name = config.database
        try:
            if self._reset(dataclasses.replace(self._server, database=name)):
                self._free.append(name)
                return
        except pymysql.MySQLError:
            pass
        self._drop(name)

    def close(self) -> None:
        """Drop every database this made."""
        for name in list(self._made):
            self._drop(name)
        self._free.clear()

    def _drop(self, name: str) -> None:
        self._made.pop(name, None)
        drop_database(dataclasses.replace(self._server, database=name))

    @staticmethod
    def _read(config: DatabaseConfig) -> _Migrated:
        conn = connect(config)
        try:
            with conn.cursor() as cursor:
                cursor.execute("SELECT table_name FROM information_schema.tables "
                               "WHERE table_schema = %s AND table_type = 'BASE TABLE'", (config.database,))
                tables = tuple(sorted(name for (name,) in cursor.fetchall() if name not in BOOKKEEPING))
                seeds = {}
                for table in tables:
                    cursor.execute(f"SELECT * FROM `{table}`")
                    rows = list(cursor.fetchall())
                    if rows:
                        seeds[table] = (tuple(d[0] for d in cursor.description), rows)
                return _Migrated(tables, seeds, _fingerprint(cursor, config.database),
                                 _state(cursor, config.database, tables, set(seeds)))
        finally:
            conn.close()

    def _reset(self, config: DatabaseConfig) -> bool:
        """Make the database as new; False if the test changed its schema (it is then given up)."""
        migrated = self._made.get(config.database)
        if migrated is None:
            return False
        conn = connect(config)
        try:
            with conn.cursor() as cursor:
                if _fingerprint(cursor, config.database) != migrated.fingerprint:
                    return False
                now = _state(cursor, config.database, migrated.tables, set(migrated.seeds))
                touched = [table for table in migrated.tables if now[table] != migrated.state[table]]
                cursor.execute(f"SET SESSION lock_wait_timeout = {RESET_LOCK_WAIT_S}, FOREIGN_KEY_CHECKS = 0")
                for table in touched:
                    cursor.execute(f"TRUNCATE TABLE `{table}`")
                for table in touched:
                    if table not in migrated.seeds:
                        continue
                    columns, rows = migrated.seeds[table]
                    names = ", ".join(f"`{c}`" for c in columns)
                    marks = ", ".join(["%s"] * len(columns))
                    cursor.executemany(f"INSERT INTO `{table}` ({names}) VALUES ({marks})", rows)
                cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
            conn.commit()
            return True
        finally:
            conn.close()
