import datetime

from corral.batch.v1 import batch_pb2 as _batch_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchEvent(_message.Message):
    __slots__ = ("batch_id", "event_id", "at", "job_state_changed", "update_committed", "cancelled", "batch_completed", "cost_accrued")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_CHANGED_FIELD_NUMBER: _ClassVar[int]
    UPDATE_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    BATCH_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COST_ACCRUED_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    event_id: int
    at: _timestamp_pb2.Timestamp
    job_state_changed: JobStateChanged
    update_committed: UpdateCommitted
    cancelled: Cancelled
    batch_completed: BatchCompleted
    cost_accrued: CostAccrued
    def __init__(self, batch_id: _Optional[int] = ..., event_id: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., job_state_changed: _Optional[_Union[JobStateChanged, _Mapping]] = ..., update_committed: _Optional[_Union[UpdateCommitted, _Mapping]] = ..., cancelled: _Optional[_Union[Cancelled, _Mapping]] = ..., batch_completed: _Optional[_Union[BatchCompleted, _Mapping]] = ..., cost_accrued: _Optional[_Union[CostAccrued, _Mapping]] = ...) -> None: ...

class JobStateChanged(_message.Message):
    __slots__ = ("job_id", "job_group_id", "attempt_id", "old_state", "new_state", "exit_code", "reason")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    OLD_STATE_FIELD_NUMBER: _ClassVar[int]
    NEW_STATE_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    job_group_id: int
    attempt_id: str
    old_state: _job_state_pb2.JobState
    new_state: _job_state_pb2.JobState
    exit_code: int
    reason: str
    def __init__(self, job_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., old_state: _Optional[_Union[_job_state_pb2.JobState, str]] = ..., new_state: _Optional[_Union[_job_state_pb2.JobState, str]] = ..., exit_code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class UpdateCommitted(_message.Message):
    __slots__ = ("update_id", "start_job_id", "n_jobs")
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    START_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    update_id: int
    start_job_id: int
    n_jobs: int
    def __init__(self, update_id: _Optional[int] = ..., start_job_id: _Optional[int] = ..., n_jobs: _Optional[int] = ...) -> None: ...

class Cancelled(_message.Message):
    __slots__ = ("job_group_id", "cancellation")
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    job_group_id: int
    cancellation: _batch_pb2.CancellationInfo
    def __init__(self, job_group_id: _Optional[int] = ..., cancellation: _Optional[_Union[_batch_pb2.CancellationInfo, _Mapping]] = ...) -> None: ...

class BatchCompleted(_message.Message):
    __slots__ = ("counts", "cancelled", "cost_micro_usd")
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    counts: _batch_pb2.JobCounts
    cancelled: bool
    cost_micro_usd: int
    def __init__(self, counts: _Optional[_Union[_batch_pb2.JobCounts, _Mapping]] = ..., cancelled: _Optional[bool] = ..., cost_micro_usd: _Optional[int] = ...) -> None: ...

class CostAccrued(_message.Message):
    __slots__ = ("cost_micro_usd", "delta_micro_usd")
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    DELTA_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    cost_micro_usd: int
    delta_micro_usd: int
    def __init__(self, cost_micro_usd: _Optional[int] = ..., delta_micro_usd: _Optional[int] = ...) -> None: ...
