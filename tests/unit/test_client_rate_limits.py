"""How the client treats a refusal with a google.rpc.RetryInfo (docs/client.md, *Your share of a frontend*):
waits at least the delay asked for, a few times, never for a delay too long to wait; raises the typed
error with the delay and the limit; resumes a watch after it. Without a server: the errors are built as
gRPC delivers them (the status in the `grpc-status-details-bin` trailer)."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from corral import ResourceExhausted
from corral.aio import MAX_RATE_LIMIT_WAIT_S, RATE_LIMIT_RETRIES, WatchResume, rate_limit_wait_s
from corral.errors import from_rpc_error


class Refusal(grpc.RpcError):
    """A failed call as grpc raises it."""

    def __init__(self, code: grpc.StatusCode, delay_s: float | None = None, quota: str = ""):
        self._code = code
        status = status_pb2.Status(code=code.value[0], message=f"refused ({quota})")
        if delay_s is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(round(delay_s * 1e9))
            packed = any_pb2.Any()
            packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
            status.details.append(packed)
        if quota:
            packed = any_pb2.Any()
            packed.Pack(error_details_pb2.QuotaFailure(violations=[
                error_details_pb2.QuotaFailure.Violation(subject="user:alice", description=quota)]))
            status.details.append(packed)
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._status.message

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        return (("grpc-status-details-bin", self._status.SerializeToString()),)


@pytest.mark.parametrize("delay_s", [0.0, 0.02, 1.0, MAX_RATE_LIMIT_WAIT_S])
def test_a_rate_refusal_is_waited_out_never_sooner_a_few_times(delay_s: float) -> None:
    error = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, delay_s, "max_requests_per_user_per_s")
    for retries_so_far in range(RATE_LIMIT_RETRIES):
        wait_s = rate_limit_wait_s(error, retries_so_far)
        assert wait_s is not None and delay_s <= wait_s <= delay_s * 1.1
    assert rate_limit_wait_s(error, RATE_LIMIT_RETRIES) is None


def test_what_is_not_waited_for() -> None:
    too_long = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, MAX_RATE_LIMIT_WAIT_S + 1)
    without_delay = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED)  # e.g. a read past the statement limit
    other_code = Refusal(grpc.StatusCode.INVALID_ARGUMENT, 1.0)
    for error in (too_long, without_delay, other_code):
        assert rate_limit_wait_s(error, 0) is None


def test_the_typed_error_says_when_and_which_limit() -> None:
    error = from_rpc_error(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, 42.5, "max_submissions_per_user_per_minute"))
    assert isinstance(error, ResourceExhausted)
    assert error.retry_after_s == 42.5 and error.quotas == ("max_submissions_per_user_per_minute",)
    plain = from_rpc_error(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert isinstance(plain, ResourceExhausted) and plain.retry_after_s is None and plain.quotas == ()


def test_a_watch_refused_for_a_rate_resumes_after_the_delay() -> None:
    resume = WatchResume(batch_id=1, from_event_id=1, max_reconnects=3)
    assert resume.after_drop(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, 2.5)) >= 2.5
    with pytest.raises(ResourceExhausted):  # no delay: the request itself is refused
        resume.after_drop(Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED))
