"""Typed errors of the corral client, keeping the gRPC status and its details."""

from __future__ import annotations

import dataclasses

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request, as the server reported it."""

    field: str
    description: str


class UsageError(Exception):
    """What the user gave is wrong before any call is made (a batch file, an option, a handle): the CLI prints
    it as one `error: ...` line. `location` says where, when it is in a file ("batch.yaml:3:5")."""

    def __init__(self, message: str, location: str | None = None):
        super().__init__(message)
        self.message = message
        self.location = location

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message


class CorralError(Exception):
    """A call to corral failed; `code` is the gRPC status code."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: grpc.StatusCode | None = None,
                 field_violations: tuple[FieldViolation, ...] = ()):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.field_violations = field_violations

    def __str__(self) -> str:
        if not self.field_violations:
            return self.message
        details = "; ".join(f"{v.field}: {v.description}" if v.field else v.description
                            for v in self.field_violations)
        return f"{self.message} ({details})"


class InvalidArgument(CorralError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(CorralError):
    code = grpc.StatusCode.NOT_FOUND


class PermissionDenied(CorralError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Unauthenticated(CorralError):
    code = grpc.StatusCode.UNAUTHENTICATED


class FailedPrecondition(CorralError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Unavailable(CorralError):
    code = grpc.StatusCode.UNAVAILABLE


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, PermissionDenied, Unauthenticated,
                                      FailedPrecondition, Unavailable)}


def from_rpc_error(error: grpc.RpcError) -> CorralError:
    """The typed error for a failed call, with any BadRequest field violations."""
    call = error  # grpc.aio.AioRpcError and grpc.Call both offer code() and details()
    code = call.code()  # type: ignore[attr-defined]
    violations: list[FieldViolation] = []
    status = rpc_status.from_call(call)  # type: ignore[arg-type]
    if status is not None:
        for detail in status.details:
            bad_request = error_details_pb2.BadRequest()
            if detail.Unpack(bad_request):
                violations += [FieldViolation(v.field, v.description) for v in bad_request.field_violations]
    cls = _BY_CODE.get(code, CorralError)
    return cls(call.details() or code.name, code, tuple(violations))  # type: ignore[attr-defined]
