"""What the data layer's errors become for a caller (services.db.request_errors), mapped by
services.common.errors, which imports nothing of services.db: the db package registers its translation when
it is imported."""

from __future__ import annotations

import grpc
import pymysql
import pytest
from google.rpc import error_details_pb2

from services.common.errors import to_status
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


@pytest.mark.parametrize(("error", "code"), [
    (NotFoundError("batch 7 does not exist", rc=1), grpc.StatusCode.NOT_FOUND),
    (FailedPreconditionError("batch 7 is cancelled", rc=2), grpc.StatusCode.FAILED_PRECONDITION),
    (InvalidArgumentError("job 3 names itself as parent", rc=3), grpc.StatusCode.INVALID_ARGUMENT),
    (StaleEpochError("epoch 4 is not current", rc=4), grpc.StatusCode.UNAVAILABLE),  # another driver leads
    (ConflictError("update 2 was committed meanwhile", rc=5), grpc.StatusCode.ABORTED),
    (PermissionDeniedError("not a member of proj", rc=6), grpc.StatusCode.PERMISSION_DENIED),
    (ResourceExhaustedError("user alice has 9 open jobs", rc=7), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ProcedureError("rc 42 is new", rc=42), grpc.StatusCode.INTERNAL),
])
def test_each_procedure_status_has_its_code_and_message(error: ProcedureError, code: grpc.StatusCode) -> None:
    status = to_status(error)
    assert status is not None
    assert (status.code, status.message) == (code.value[0], error.message)


def test_a_procedures_invalid_argument_is_one_violation_of_the_whole_request() -> None:
    status = to_status(InvalidArgumentError("job 3 names itself as parent", rc=3))
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    assert [(v.field, v.description) for v in bad.field_violations] == [("", "job 3 names itself as parent")]


def test_a_failed_precondition_says_so_in_its_details() -> None:
    status = to_status(FailedPreconditionError("batch 7 is cancelled", rc=2))
    assert status is not None
    failure = error_details_pb2.PreconditionFailure()
    assert status.details[0].Unpack(failure)
    assert (failure.violations[0].type, failure.violations[0].description) == ("STATE", "batch 7 is cancelled")


def test_a_read_past_the_statement_limit_is_a_limit_not_a_timeout() -> None:
    status = to_status(StatementTimeout("list_jobs", 2.5))
    assert status is not None
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert "statement time limit of 2.5 s" in status.message


@pytest.mark.parametrize("errno", [2002, 2003, 2006, 2013, 1040, 1927])
def test_a_database_out_of_reach_is_unavailable(errno: int) -> None:
    status = to_status(pymysql.err.OperationalError(errno, "gone"))
    assert status is not None
    assert status.code == grpc.StatusCode.UNAVAILABLE.value[0]


def test_other_database_errors_are_unexpected() -> None:
    """A deadlock that outlived its retries, a syntax error: the interceptor logs them and answers INTERNAL."""
    assert to_status(pymysql.err.OperationalError(1213, "Deadlock found")) is None
    assert to_status(pymysql.err.ProgrammingError(1064, "syntax")) is None
