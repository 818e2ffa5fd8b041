import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_STATE_UNSPECIFIED: _ClassVar[BatchState]
    BATCH_STATE_OPEN: _ClassVar[BatchState]
    BATCH_STATE_RUNNING: _ClassVar[BatchState]
    BATCH_STATE_COMPLETE: _ClassVar[BatchState]

class CancellationCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CANCELLATION_CAUSE_UNSPECIFIED: _ClassVar[CancellationCause]
    CANCELLATION_CAUSE_USER_REQUEST: _ClassVar[CancellationCause]
    CANCELLATION_CAUSE_FAILURE_LIMIT: _ClassVar[CancellationCause]
    CANCELLATION_CAUSE_BILLING_LIMIT: _ClassVar[CancellationCause]
    CANCELLATION_CAUSE_DELETED: _ClassVar[CancellationCause]
BATCH_STATE_UNSPECIFIED: BatchState
BATCH_STATE_OPEN: BatchState
BATCH_STATE_RUNNING: BatchState
BATCH_STATE_COMPLETE: BatchState
CANCELLATION_CAUSE_UNSPECIFIED: CancellationCause
CANCELLATION_CAUSE_USER_REQUEST: CancellationCause
CANCELLATION_CAUSE_FAILURE_LIMIT: CancellationCause
CANCELLATION_CAUSE_BILLING_LIMIT: CancellationCause
CANCELLATION_CAUSE_DELETED: CancellationCause

class Batch(_message.Message):
    __slots__ = ("batch_id", "user", "billing_project", "attributes", "state", "cancellation", "counts", "cost_micro_usd", "created_at", "completed_at", "callback_url", "cancel_after_n_failures", "last_event_id", "hold")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_AFTER_N_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    user: str
    billing_project: str
    attributes: _containers.ScalarMap[str, str]
    state: BatchState
    cancellation: CancellationInfo
    counts: JobCounts
    cost_micro_usd: int
    created_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    callback_url: str
    cancel_after_n_failures: int
    last_event_id: int
    hold: HoldInfo
    def __init__(self, batch_id: _Optional[int] = ..., user: _Optional[str] = ..., billing_project: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., state: _Optional[_Union[BatchState, str]] = ..., cancellation: _Optional[_Union[CancellationInfo, _Mapping]] = ..., counts: _Optional[_Union[JobCounts, _Mapping]] = ..., cost_micro_usd: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., callback_url: _Optional[str] = ..., cancel_after_n_failures: _Optional[int] = ..., last_event_id: _Optional[int] = ..., hold: _Optional[_Union[HoldInfo, _Mapping]] = ...) -> None: ...

class HoldInfo(_message.Message):
    __slots__ = ("held_by", "held_at")
    HELD_BY_FIELD_NUMBER: _ClassVar[int]
    HELD_AT_FIELD_NUMBER: _ClassVar[int]
    held_by: str
    held_at: _timestamp_pb2.Timestamp
    def __init__(self, held_by: _Optional[str] = ..., held_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CancellationInfo(_message.Message):
    __slots__ = ("cancelled_by", "cancelled_at", "reason", "cause")
    CANCELLED_BY_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    cancelled_by: str
    cancelled_at: _timestamp_pb2.Timestamp
    reason: str
    cause: CancellationCause
    def __init__(self, cancelled_by: _Optional[str] = ..., cancelled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., reason: _Optional[str] = ..., cause: _Optional[_Union[CancellationCause, str]] = ...) -> None: ...

class JobCounts(_message.Message):
    __slots__ = ("n_jobs", "n_pending", "n_ready", "n_running", "n_succeeded", "n_failed", "n_errored", "n_cancelled")
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    N_PENDING_FIELD_NUMBER: _ClassVar[int]
    N_READY_FIELD_NUMBER: _ClassVar[int]
    N_RUNNING_FIELD_NUMBER: _ClassVar[int]
    N_SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    N_FAILED_FIELD_NUMBER: _ClassVar[int]
    N_ERRORED_FIELD_NUMBER: _ClassVar[int]
    N_CANCELLED_FIELD_NUMBER: _ClassVar[int]
    n_jobs: int
    n_pending: int
    n_ready: int
    n_running: int
    n_succeeded: int
    n_failed: int
    n_errored: int
    n_cancelled: int
    def __init__(self, n_jobs: _Optional[int] = ..., n_pending: _Optional[int] = ..., n_ready: _Optional[int] = ..., n_running: _Optional[int] = ..., n_succeeded: _Optional[int] = ..., n_failed: _Optional[int] = ..., n_errored: _Optional[int] = ..., n_cancelled: _Optional[int] = ...) -> None: ...
