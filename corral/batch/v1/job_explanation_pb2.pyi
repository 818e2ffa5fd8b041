import datetime

from corral.batch.v1 import job_pb2 as _job_pb2
from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WaitReasonCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_REASON_CODE_UNSPECIFIED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_WAITING_ON_PARENTS: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_PARENT_FAILED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_BLOCKED_BY_LOCK: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_OVER_FAIR_SHARE: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_QUEUED_BEHIND_OWN_JOBS: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_NO_QUOTA: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_BILLING_LIMIT_REACHED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_BATCH_CANCELLED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_JOB_GROUP_CANCELLED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_STARTING: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_RUNNING: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_FINISHED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_RETRY_DELAY: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_CANNOT_RUN: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_HELD: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_POOL_PAUSED: _ClassVar[WaitReasonCode]
    WAIT_REASON_CODE_QUOTA_REACHED: _ClassVar[WaitReasonCode]
WAIT_REASON_CODE_UNSPECIFIED: WaitReasonCode
WAIT_REASON_CODE_WAITING_ON_PARENTS: WaitReasonCode
WAIT_REASON_CODE_PARENT_FAILED: WaitReasonCode
WAIT_REASON_CODE_BLOCKED_BY_LOCK: WaitReasonCode
WAIT_REASON_CODE_OVER_FAIR_SHARE: WaitReasonCode
WAIT_REASON_CODE_QUEUED_BEHIND_OWN_JOBS: WaitReasonCode
WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS: WaitReasonCode
WAIT_REASON_CODE_NO_QUOTA: WaitReasonCode
WAIT_REASON_CODE_BILLING_LIMIT_REACHED: WaitReasonCode
WAIT_REASON_CODE_BATCH_CANCELLED: WaitReasonCode
WAIT_REASON_CODE_JOB_GROUP_CANCELLED: WaitReasonCode
WAIT_REASON_CODE_STARTING: WaitReasonCode
WAIT_REASON_CODE_RUNNING: WaitReasonCode
WAIT_REASON_CODE_FINISHED: WaitReasonCode
WAIT_REASON_CODE_RETRY_DELAY: WaitReasonCode
WAIT_REASON_CODE_CANNOT_RUN: WaitReasonCode
WAIT_REASON_CODE_HELD: WaitReasonCode
WAIT_REASON_CODE_POOL_PAUSED: WaitReasonCode
WAIT_REASON_CODE_QUOTA_REACHED: WaitReasonCode

class JobExplanation(_message.Message):
    __slots__ = ("batch_id", "job_id", "state", "reasons", "explained_at")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    EXPLAINED_AT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    state: _job_state_pb2.JobState
    reasons: _containers.RepeatedCompositeFieldContainer[WaitReason]
    explained_at: _timestamp_pb2.Timestamp
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., state: _Optional[_Union[_job_state_pb2.JobState, str]] = ..., reasons: _Optional[_Iterable[_Union[WaitReason, _Mapping]]] = ..., explained_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class WaitReason(_message.Message):
    __slots__ = ("code", "detail", "jobs", "lock", "regions")
    CODE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    code: WaitReasonCode
    detail: str
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.JobRef]
    lock: _job_spec_pb2.JobLock
    regions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, code: _Optional[_Union[WaitReasonCode, str]] = ..., detail: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[_job_pb2.JobRef, _Mapping]]] = ..., lock: _Optional[_Union[_job_spec_pb2.JobLock, _Mapping]] = ..., regions: _Optional[_Iterable[str]] = ...) -> None: ...
