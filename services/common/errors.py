"""Turning domain errors into gRPC statuses with google.rpc details.

Servicers raise; they never build statuses. `RequestInterceptor` catches
these exceptions and aborts the call with the code below and a
`google.rpc.Status` carrying BadRequest field violations or a
PreconditionFailure, so clients (and grpcurl) see what was wrong.

The packages above this one say what their own errors mean to a caller by
registering a translation into these (`register_translation`): the data
layer's procedure errors, statement timeouts and lost connections are
services.db.request_errors'. This package imports none of them: it is the
lowest layer, and every other depends on it.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from services.common.fields import FieldViolation


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


class QuotaExceeded(ResourceExhausted):
    """The request would pass a quota (open jobs of a user or a billing project); carries a
    google.rpc.QuotaFailure saying which, in its message."""


class Aborted(RequestError):
    """The request conflicts with what is stored now (a concurrent change): read again, then retry."""

    code = grpc.StatusCode.ABORTED


class Internal(RequestError):
    """Something the server should not have met (a stored procedure's unknown status); the message is the
    caller's to see."""

    code = grpc.StatusCode.INTERNAL


Translation = Callable[[Exception], RequestError | None]
"""What an error of another package means to the caller, or None if it is none of that package's."""

_translations: list[Translation] = []


def register_translation(translation: Translation) -> None:
    """Let `to_status` turn another package's errors into statuses (asked in the order registered, after
    the request errors above); registering the same translation again changes nothing."""
    if translation not in _translations:
        _translations.append(translation)


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
    """The google.rpc.Status for a known error (a request error, or one a registered translation knows), or
    None for an unexpected one."""
    if not isinstance(error, RequestError):
        translated = next((found for translate in _translations if (found := translate(error)) is not None), None)
        if translated is None:
            return None
        error = translated
    code, message = error.code, error.message
    status = status_pb2.Status(code=code.value[0], message=message)
    if isinstance(error, InvalidRequest):
        status.details.append(_packed(bad_request(error.violations)))
    elif isinstance(error, RateLimited):
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, round(error.retry_after_s * 1e9)))
        status.details.append(_packed(error_details_pb2.RetryInfo(retry_delay=delay)))
        if error.quota:
            status.details.append(_packed(error_details_pb2.QuotaFailure(violations=[
                error_details_pb2.QuotaFailure.Violation(subject=error.subject, description=error.quota)])))
    elif isinstance(error, QuotaExceeded):
        status.details.append(_packed(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(description=error.message)])))
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        status.details.append(_packed(error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(type="STATE", description=message)])))
    assert status.code != code_pb2.OK
    return status
