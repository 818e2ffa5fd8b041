"""Turning domain errors into gRPC statuses with google.rpc details.

Servicers raise; they never build statuses. `RequestInterceptor` catches
these exceptions and aborts the call with the code below and a
`google.rpc.Status` carrying BadRequest field violations or a
PreconditionFailure, so clients (and grpcurl) see what was wrong.
"""

from __future__ import annotations

import grpc
import pymysql
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

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


class RequestError(Exception):
    """An error a servicer raises to end the call with a given status."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InvalidRequest(RequestError):
    """The request is malformed; carries every field violation found."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, violations: list[FieldViolation] | FieldViolation, message: str = "invalid request"):
        super().__init__(message)
        self.violations = violations if isinstance(violations, list) else [violations]


class Unauthenticated(RequestError):
    """No valid credentials (missing, unknown, expired or revoked token)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(RequestError):
    """Authenticated, but not allowed to do this."""

    code = grpc.StatusCode.PERMISSION_DENIED


class NotFound(RequestError):
    """The named resource does not exist (or is invisible to the caller)."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(RequestError):
    """A resource with this name exists."""

    code = grpc.StatusCode.ALREADY_EXISTS


class RateLimited(RequestError):
    """Too many attempts: refused until `retry_after_s` has passed (carried as a
    google.rpc.RetryInfo). RESOURCE_EXHAUSTED rather than UNAVAILABLE: clients and
    gRPC retry policies retry UNAVAILABLE on their own, which is the opposite of what
    a rate limit asks for. With `quota` (the limit's name) and `subject` (whose quota,
    e.g. "user:alice") it also carries a google.rpc.QuotaFailure saying which."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after_s: float, quota: str = "", subject: str = ""):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.quota = quota
        self.subject = subject


class FailedPrecondition(RequestError):
    """The resource's state refuses the request (closed project, cancelled batch)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(RequestError):
    """The caller asked for more than a limit allows (streams open, a read's time)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(RequestError):
    """A service this call needs cannot answer now (e.g. auth, to verify a token): retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(RequestError):
    """The call ran past the server's own deadline for a call."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


_PROCEDURE_CODES: dict[type[ProcedureError], grpc.StatusCode] = {
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    # The caller's leader epoch is stale: another driver leads now.
    StaleEpochError: grpc.StatusCode.UNAVAILABLE,
    ConflictError: grpc.StatusCode.ABORTED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


# MySQL client errors that mean the database cannot be reached now, not that the request was wrong:
#   2002/2003 CR_CONNECTION_ERROR/CR_CONN_HOST_ERROR - no server on the socket/port;
#   2006 CR_SERVER_GONE_ERROR, 2013 CR_SERVER_LOST  - the server went away during the call;
#   1040 ER_CON_COUNT_ERROR                          - no connection slot left;
#   1927 ER_CONNECTION_KILLED                        - the server killed the connection (e.g. shutting down).
UNAVAILABLE_DATABASE_ERRORS = frozenset({2002, 2003, 2006, 2013, 1040, 1927})


def _packed(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


MAX_DETAIL_BYTES = 4096
"""The most bytes of field violations a status carries. The status travels base64-encoded in a trailer, and
gRPC clients take 8 KiB of metadata by default: past it, a client sees RESOURCE_EXHAUSTED, not the answer."""


def bad_request(violations: list[FieldViolation]) -> error_details_pb2.BadRequest:
    """The violations, as many of the first ones as fit in MAX_DETAIL_BYTES, and how many more there were."""
    bad = error_details_pb2.BadRequest()
    for i, v in enumerate(violations):
        entry = error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
        if bad.ByteSize() + entry.ByteSize() + 40 > MAX_DETAIL_BYTES:  # room for the line saying so
            bad.field_violations.add(description=f"and {len(violations) - i} more violations, not shown")
            break
        bad.field_violations.append(entry)
    return bad


def to_status(error: Exception) -> status_pb2.Status | None:
    """The google.rpc.Status for a known error, or None for an unexpected one."""
    if isinstance(error, RequestError):
        code, message = error.code, error.message
    elif isinstance(error, StatementTimeout):
        # RESOURCE_EXHAUSTED, not DEADLINE_EXCEEDED: the same request would be
        # killed again (it asks for more work than one statement may do), so it
        # is a limit to stay under, not a transient timeout that clients retry.
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
        message = (f"the request's read ran longer than the statement time limit of {error.limit_s:g} s "
                   "(max_statement_time_s); narrow it, e.g. with a more selective query")
    elif isinstance(error, ProcedureError):
        code = next((c for cls, c in _PROCEDURE_CODES.items() if isinstance(error, cls)), grpc.StatusCode.INTERNAL)
        message = error.message
    elif (isinstance(error, pymysql.err.OperationalError) and error.args
          and error.args[0] in UNAVAILABLE_DATABASE_ERRORS):
        code, message = grpc.StatusCode.UNAVAILABLE, "the database is unreachable now; try again shortly"
    else:
        return None
    status = status_pb2.Status(code=code.value[0], message=message)
    if isinstance(error, InvalidRequest):
        status.details.append(_packed(bad_request(error.violations)))
    elif isinstance(error, InvalidArgumentError):
        status.details.append(_packed(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="", description=error.message)])))
    elif isinstance(error, RateLimited):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, round(error.retry_after_s * 1e9)))
        status.details.append(_packed(error_details_pb2.RetryInfo(retry_delay=delay)))
        if error.quota:
            status.details.append(_packed(error_details_pb2.QuotaFailure(violations=[
                error_details_pb2.QuotaFailure.Violation(subject=error.subject, description=error.quota)])))
    elif isinstance(error, ResourceExhaustedError):
        status.details.append(_packed(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(description=error.message)])))
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        status.details.append(_packed(error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(type="STATE", description=message)])))
    assert status.code != code_pb2.OK
    return status
