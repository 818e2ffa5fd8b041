"""The one way corral talks to MySQL/MariaDB: a pool, whole-transaction
retries on deadlock, and stored-procedure calls that raise typed errors.

Every procedure in `sql/procedures/` ends with a status row whose first two
columns are `rc` and `message`; `call()` turns a non-zero `rc` into the
matching `ProcedureError` subclass so services map it to a gRPC status.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote, unquote, urlparse

import aiomysql
import pymysql
from pymysql.constants import SERVER_STATUS

from services.common.metrics import DB_RETRIES

log = logging.getLogger(__name__)

T = TypeVar("T")

# MySQL/MariaDB errors after which the whole transaction must be retried:
#   1213 ER_LOCK_DEADLOCK      - InnoDB chose this transaction as the victim and
#                                rolled it back entirely;
#   1205 ER_LOCK_WAIT_TIMEOUT  - only the statement was rolled back, so the
#                                caller rolls back the rest before retrying.
RETRYABLE_ERRORS = frozenset({1213, 1205})
NO_BACKSLASH_ESCAPES = SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES
# 1969 ER_STATEMENT_TIMEOUT: the statement ran past max_statement_time and
# was aborted (it had no effect; the session is fine, but the connection is
# closed like after any other error that is not retried).
STATEMENT_TIMEOUT = 1969


class JsonText(str):
    """Text that json.dumps wrote (ASCII only, control characters escaped): a procedure's JSON argument."""


def sql_literal(connection: aiomysql.Connection, value: Any) -> str:
    """`value` as a SQL literal for `connection`. JSON text needs only its quotes and backslashes escaped,
    which str.replace does at memory speed; pymysql's escape maps every character through a table, which took
    15 µs per job of an insert_jobs bunch."""
    if not isinstance(value, JsonText):
        return connection.escape(value)
    if connection.server_status & NO_BACKSLASH_ESCAPES:
        return "'" + value.replace("'", "''") + "'"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ProcedureError(Exception):
    """A stored procedure returned a non-zero `rc`."""

    rc: int = -1

    def __init__(self, message: str, rc: int | None = None, procedure: str = "",
                 status: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.procedure = procedure
        if rc is not None:
            self.rc = rc
        self.status = status or {}
        """The whole status row: `rc`, `message` and whatever else the procedure says of its refusal."""


class NotFoundError(ProcedureError):
    """rc 1: the batch, job, update, instance or project does not exist."""

    rc = 1


class FailedPreconditionError(ProcedureError):
    """rc 2: the row exists but is in a state that refuses the change."""

    rc = 2


class InvalidArgumentError(ProcedureError):
    """rc 3: the request itself is malformed (bad ids, parents, states)."""

    rc = 3


class StaleEpochError(ProcedureError):
    """rc 4: the caller's leader epoch is not the current one (fencing)."""

    rc = 4


class ConflictError(ProcedureError):
    """rc 5: the request conflicts with what is already stored."""

    rc = 5


class PermissionDeniedError(ProcedureError):
    """rc 6: the user may not touch this billing project or batch."""

    rc = 6


class ResourceExhaustedError(ProcedureError):
    """rc 7: a quota would be passed (open jobs of a user or billing project)."""

    rc = 7


class StatementTimeout(Exception):
    """A read ran past the statement time limit (MariaDB aborted it)."""

    def __init__(self, name: str, limit_s: float):
        super().__init__(f"{name} ran longer than the statement time limit of {limit_s:g} s")
        self.name = name
        self.limit_s = limit_s


_ERRORS_BY_RC = {
    cls.rc: cls
    for cls in (
        NotFoundError,
        FailedPreconditionError,
        InvalidArgumentError,
        StaleEpochError,
        ConflictError,
        PermissionDeniedError,
        ResourceExhaustedError,
    )
}


def raise_for_status(procedure: str, row: dict[str, Any]) -> None:
    """Raise the typed error for a status row whose `rc` is not 0."""
    rc = int(row["rc"])
    if rc == 0:
        return
    cls = _ERRORS_BY_RC.get(rc, ProcedureError)
    raise cls(str(row.get("message") or ""), rc=rc, procedure=procedure, status=row)


@dataclasses.dataclass(frozen=True)
class DatabaseConfig:
    """Where the database is and how to talk to it."""

    host: str = "127.0.0.1"
    """Host name; ignored when `unix_socket` is set."""
    port: int = 3306
    """TCP port."""
    user: str = "root"
    """User name."""
    password: str = ""
    """Password (empty for socket auth in development)."""
    database: str = "corral"
    """Schema name."""
    unix_socket: str | None = None
    """Path of a Unix socket; takes precedence over host and port."""
    pool_size: int = 10
    """Maximum open connections."""

    @classmethod
    def from_url(cls, url: str, **overrides: Any) -> DatabaseConfig:
        """Parse `mysql://user:pw@host:port/db?unix_socket=/path&pool_size=N`."""
        parsed = urlparse(url)
        if parsed.scheme not in ("mysql", "mariadb"):
            raise ValueError(f"database URL must start with mysql:// or mariadb://, got {url!r}")
        query = parse_qs(parsed.query)
        fields: dict[str, Any] = {
            "host": parsed.hostname or "127.0.0.1",
            "port": parsed.port or 3306,
            "user": unquote(parsed.username or "root"),
            "password": unquote(parsed.password or ""),
            "database": parsed.path.lstrip("/") or "corral",
        }
        if "unix_socket" in query:
            fields["unix_socket"] = query["unix_socket"][0]
        if "pool_size" in query:
            fields["pool_size"] = int(query["pool_size"][0])
        fields.update(overrides)
        return cls(**fields)

    def to_url(self) -> str:
        """The mysql:// URL of this configuration (what `from_url` parses)."""
        auth = quote(self.user, safe="") + (f":{quote(self.password, safe='')}" if self.password else "")
        if self.unix_socket:
            return f"mysql://{auth}@localhost/{self.database}?unix_socket={quote(self.unix_socket)}"
        return f"mysql://{auth}@{self.host}:{self.port}/{self.database}"

    def connect_kwargs(self, with_database: bool = True) -> dict[str, Any]:
        """Keyword arguments for aiomysql `connect` (pymysql takes them too
        when `with_database` is False)."""
        kwargs: dict[str, Any] = {
            "user": self.user,
            "password": self.password,
            "autocommit": True,
            "charset": "utf8mb4",
            # READ COMMITTED: no gap locks, so inserts of new counter rows by
            # concurrent transactions do not deadlock each other, and every
            # statement sees what other transactions have committed (the
            # completion check relies on that).
            "init_command": "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
        }
        if self.unix_socket:
            kwargs["unix_socket"] = self.unix_socket
        else:
            kwargs["host"] = self.host
            kwargs["port"] = self.port
        if with_database:
            kwargs["db"] = self.database  # aiomysql's name for it
        return kwargs


@dataclasses.dataclass
class RetryStats:
    """How often whole transactions were retried, by error number."""

    retries: int = 0
    by_errno: dict[int, int] = dataclasses.field(default_factory=dict)

    def record(self, errno: int) -> None:
        self.retries += 1
        self.by_errno[errno] = self.by_errno.get(errno, 0) + 1


class Database:
    """A connection pool with retrying transactions and procedure calls."""

    def __init__(self, pool: aiomysql.Pool, config: DatabaseConfig, max_attempts: int = 20,
                 statement_time_limit_s: float | None = None):
        self._pool = pool
        self.config = config
        self.max_attempts = max_attempts
        self.retry_stats = RetryStats()
        self.statement_time_limit_s = statement_time_limit_s
        """Longest a `fetchall`/`fetchone` statement may run (None: no limit); see `time_limited`."""

    @classmethod
    async def connect(cls, config: DatabaseConfig) -> Database:
        """Open a pool to `config`'s database."""
        pool = await aiomysql.create_pool(
            minsize=1, maxsize=config.pool_size, **config.connect_kwargs()
        )
        return cls(pool, config)

    def time_limited(self, statement_time_limit_s: float) -> Database:
        """The same pool, with every `fetchall`/`fetchone` statement run under MariaDB's
        max_statement_time (`SET STATEMENT max_statement_time=… FOR SELECT …`): a read
        that runs longer is aborted by the server and raises StatementTimeout. For the
        reads a user's request drives; procedure calls and `execute` are not limited.
        Close the pool through the original."""
        limited = Database(self._pool, self.config, self.max_attempts, statement_time_limit_s)
        limited.retry_stats = self.retry_stats
        return limited

    async def close(self) -> None:
        """Close every pooled connection and wait for them to go."""
        self._pool.close()
        await self._pool.wait_closed()

    async def retrying(self, name: str, body: Callable[[aiomysql.Cursor], Awaitable[T]]) -> T:
        """Run `body` on one connection, retrying it whole on deadlock.

        `body` must be safe to run again from the start: it either runs a
        self-contained procedure or does its own START TRANSACTION/COMMIT.
        """
        for attempt in range(1, self.max_attempts + 1):
            async with self._pool.acquire() as conn:
                try:
                    async with conn.cursor(aiomysql.DictCursor) as cursor:
                        return await body(cursor)
                except pymysql.err.OperationalError as e:
                    errno = e.args[0] if e.args else None
                    if errno not in RETRYABLE_ERRORS or attempt == self.max_attempts:
                        conn.close()
                        if errno == STATEMENT_TIMEOUT and self.statement_time_limit_s is not None:
                            raise StatementTimeout(name, self.statement_time_limit_s) from e
                        raise
                    await conn.rollback()
                    self.retry_stats.record(errno)
                    DB_RETRIES.labels(name, str(errno)).inc()
                    log.info("retrying %s after MySQL error %s (attempt %d)", name, errno, attempt)
                except BaseException:
                    # Any other failure (an SQL error, a cancelled task) may
                    # leave the session in a state the next caller must not
                    # inherit: MariaDB 10.11 runs no handler for a CHECK that
                    # fails inside a multi-table UPDATE, so the procedure's
                    # transaction stays open with its session variables set,
                    # and the pool learns of open transactions only from OK
                    # packets. A closed connection is dropped, not pooled.
                    conn.close()
                    raise
            await asyncio.sleep(min(0.5, 0.005 * 2**attempt) * random.random())
        raise AssertionError("unreachable")

    async def call(self, procedure: str, *args: Any) -> tuple[dict[str, Any], list[list[dict[str, Any]]]]:
        """Call a stored procedure; return its status row and earlier result sets.

        dict/list arguments are passed as JSON. Raises the `ProcedureError`
        subclass for a non-zero `rc`.
        """
        params = tuple(JsonText(json.dumps(a)) if isinstance(a, (dict, list)) else a for a in args)

        async def body(cursor: aiomysql.Cursor) -> list[list[dict[str, Any]]]:
            await cursor.execute(f"CALL {procedure}({', '.join(sql_literal(cursor.connection, p) for p in params)})")
            result_sets = []
            while True:
                rows = await cursor.fetchall()
                if cursor.description is not None:
                    result_sets.append(list(rows))
                if not await cursor.nextset():
                    break
            return result_sets

        result_sets = await self.retrying(procedure, body)
        if not result_sets or "rc" not in result_sets[-1][0]:
            raise ProcedureError(f"{procedure} returned no status row", procedure=procedure)
        status = result_sets[-1][0]
        raise_for_status(procedure, status)
        return status, result_sets[:-1]

    async def fetchall(self, sql: str, params: tuple[Any, ...] = (), name: str = "query") -> list[dict[str, Any]]:
        """Run a read query and return its rows as dicts (under the statement time limit, if any)."""
        if self.statement_time_limit_s is not None:
            sql = f"SET STATEMENT max_statement_time={self.statement_time_limit_s:.6f} FOR {sql}"

        async def body(cursor: aiomysql.Cursor) -> list[dict[str, Any]]:
            await cursor.execute(sql, params)
            return list(await cursor.fetchall())

        return await self.retrying(name, body)

    async def fetchone(self, sql: str, params: tuple[Any, ...] = (), name: str = "query") -> dict[str, Any] | None:
        """Run a read query and return its first row, or None."""
        rows = await self.fetchall(sql, params, name)
        return rows[0] if rows else None

    async def execute(self, sql: str, params: tuple[Any, ...] = (), name: str = "statement") -> int:
        """Run one statement in autocommit; return the affected row count."""

        async def body(cursor: aiomysql.Cursor) -> int:
            return await cursor.execute(sql, params)

        return await self.retrying(name, body)
