"""Turning domain errors into gRPC statuses with google.rpc details.

Servicers raise; they never build statuses. `RequestInterceptor` catches
these exceptions and aborts the call with the code below and a
`google.rpc.Status` carrying BadRequest field violations or a
PreconditionFailure, so clients (and grpcurl) see what was wrong.
"""

from __future__ import annotations

import dataclasses

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

from services.db.database import (
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProcedureError,
    ResourceExhaustedError,
    StaleEpochError,
)


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request: its path (e.g. `jobs[3].image`) and why."""

    field: str
    description: str


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


class FailedPrecondition(RequestError):
    """The resource's state refuses the request (closed project, cancelled batch)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


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


def _packed(message: object) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)  # type: ignore[arg-type]
    return packed


def to_status(error: Exception) -> status_pb2.Status | None:
    """The google.rpc.Status for a known error, or None for an unexpected one."""
    if isinstance(error, RequestError):
        code, message = error.code, error.message
    elif isinstance(error, ProcedureError):
        code = next((c for cls, c in _PROCEDURE_CODES.items() if isinstance(error, cls)), grpc.StatusCode.INTERNAL)
        message = error.message
    else:
        return None
    status = status_pb2.Status(code=code.value[0], message=message)
    if isinstance(error, InvalidRequest):
        status.details.append(_packed(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=v.field, description=v.description)
            for v in error.violations])))
    elif isinstance(error, InvalidArgumentError):
        status.details.append(_packed(error_details_pb2.BadRequest(field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field="", description=error.message)])))
    elif isinstance(error, ResourceExhaustedError):
        status.details.append(_packed(error_details_pb2.QuotaFailure(violations=[
            error_details_pb2.QuotaFailure.Violation(description=error.message)])))
    elif code == grpc.StatusCode.FAILED_PRECONDITION:
        status.details.append(_packed(error_details_pb2.PreconditionFailure(violations=[
            error_details_pb2.PreconditionFailure.Violation(type="STATE", description=message)])))
    assert status.code != code_pb2.OK
    return status
