"""What the data layer's errors mean to a caller, as services.common.errors' request errors.

A stored procedure's status (services.db.database: `rc` 1-7), a read killed at the statement time limit and
a connection the server cannot give are the database's own; the gRPC status each becomes is decided here,
beside them, and registered with services.common.errors when this package is imported (its `__init__`), so
that the interceptor of every service maps them without the lower package knowing of this one.
"""

from __future__ import annotations

import pymysql

from services.common.errors import (
    Aborted,
    FailedPrecondition,
    Internal,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    RequestError,
    ResourceExhausted,
    Unavailable,
)
from services.common.fields import FieldViolation
from services.db.database import (
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProcedureError,
    ResourceExhaustedError,
    StaleEpochError,
    StatementTimeout,
)

_PROCEDURE_ERRORS: dict[type[ProcedureError], type[RequestError]] = {
    NotFoundError: NotFound,
    FailedPreconditionError: FailedPrecondition,
    # The caller's leader epoch is stale: another driver leads now.
    StaleEpochError: Unavailable,
    ConflictError: Aborted,
    PermissionDeniedError: PermissionDenied,
    ResourceExhaustedError: QuotaExceeded,
}

# MySQL client errors that mean the database cannot be reached now, not that the request was wrong:
#   2002/2003 CR_CONNECTION_ERROR/CR_CONN_HOST_ERROR - no server on the socket/port;
#   2006 CR_SERVER_GONE_ERROR, 2013 CR_SERVER_LOST  - the server went away during the call;
#   1040 ER_CON_COUNT_ERROR                          - no connection slot left;
#   1927 ER_CONNECTION_KILLED                        - the server killed the connection (e.g. shutting down).
UNAVAILABLE_DATABASE_ERRORS = frozenset({2002, 2003, 2006, 2013, 1040, 1927})


def request_error(error: Exception) -> RequestError | None:
    """The request error a database error means to the caller; None if `error` is no database error."""
    if isinstance(error, StatementTimeout):
        # RESOURCE_EXHAUSTED, not DEADLINE_EXCEEDED: the same request would be
        # killed again (it asks for more work than one statement may do), so it
        # is a limit to stay under, not a transient timeout that clients retry.
        return ResourceExhausted(f"the request's read ran longer than the statement time limit of "
                                 f"{error.limit_s:g} s (max_statement_time_s); narrow it, e.g. with a more "
                                 "selective query")
    if isinstance(error, InvalidArgumentError):
        # The procedure names no field: one violation of the whole request, its message.
        return InvalidRequest(FieldViolation("", error.message), error.message)
    if isinstance(error, ProcedureError):
        kind = next((kind for cls, kind in _PROCEDURE_ERRORS.items() if isinstance(error, cls)), Internal)
        return kind(error.message)
    if (isinstance(error, pymysql.err.OperationalError) and error.args
            and error.args[0] in UNAVAILABLE_DATABASE_ERRORS):
        return Unavailable("the database is unreachable now; try again shortly")
    return None
