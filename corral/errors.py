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
        """The server's own field paths (`jobs[0].resources.cores_mcpu`), kept for API users and `--debug`
        whatever words the CLI says them in."""
        self.offsets: dict[str, int] = {}
        """Where the request's lists start in what the caller sent as a whole: a bunch of a large submission
        (AddJobs) sets {"jobs": its first job's index in the builder}, so its `jobs[i]` is that job + i."""

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


class AlreadyExists(CorralError):
    """The name is taken: a secret's, or an idempotency token used before for a different request (the
    message names the batch or update it made; use a new token for the changed request)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unavailable(CorralError):
    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhausted(CorralError):
    """A limit refused the call. With `retry_after_s` (the server's google.rpc.RetryInfo) it was a rate
    or a count of this user's (requests a second, reads at once, submissions a minute, login attempts)
    and the same call will be taken after that long; the client has already waited and retried a few
    times (`corral.aio.RATE_LIMIT_RETRIES`). Without it the request itself is too large: narrow it."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, code: grpc.StatusCode | None = None,
                 field_violations: tuple[FieldViolation, ...] = (), retry_after_s: float | None = None,
                 quotas: tuple[str, ...] = ()):
        super().__init__(message, code, field_violations)
        self.retry_after_s = retry_after_s
        """When to try again, in seconds, if the server said (None: not by waiting)."""
        self.quotas = quotas
        """The limits the server named (its google.rpc.QuotaFailure), e.g. max_requests_per_user_per_s."""


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, PermissionDenied, Unauthenticated,
                                      FailedPrecondition, AlreadyExists, Unavailable)}


def retry_after_s(error: grpc.RpcError) -> float | None:
    """The wait a RESOURCE_EXHAUSTED refusal's google.rpc.RetryInfo asks for, in seconds (None: none)."""
    if error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:  # type: ignore[attr-defined]
        return None
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    for detail in status.details if status is not None else ():
        info = error_details_pb2.RetryInfo()
        if detail.Unpack(info):
            return max(0.0, info.retry_delay.ToNanoseconds() / 1e9)
    return None


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
    message = call.details() or code.name  # type: ignore[attr-defined]
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        quotas = []
        for detail in status.details if status is not None else ():
            failure = error_details_pb2.QuotaFailure()
            if detail.Unpack(failure):
                quotas += [v.description for v in failure.violations]
        return ResourceExhausted(message, code, tuple(violations), retry_after_s(error), tuple(quotas))
    cls = _BY_CODE.get(code, CorralError)
    return cls(message, code, tuple(violations))
