import datetime

from corral.batch.v1 import batch_pb2 as _batch_pb2
from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobGroup(_message.Message):
    __slots__ = ("batch_id", "job_group_id", "parent_job_group_id", "update_id", "attributes", "cancel_after_n_failures", "retry_policy", "state", "cancellation", "counts", "cost_micro_usd", "created_at", "completed_at")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CANCEL_AFTER_N_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CANCELLATION_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_group_id: int
    parent_job_group_id: int
    update_id: int
    attributes: _containers.ScalarMap[str, str]
    cancel_after_n_failures: int
    retry_policy: _job_spec_pb2.RetryPolicy
    state: _batch_pb2.BatchState
    cancellation: _batch_pb2.CancellationInfo
    counts: _batch_pb2.JobCounts
    cost_micro_usd: int
    created_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    def __init__(self, batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., parent_job_group_id: _Optional[int] = ..., update_id: _Optional[int] = ..., attributes: _Optional[_Mapping[str, str]] = ..., cancel_after_n_failures: _Optional[int] = ..., retry_policy: _Optional[_Union[_job_spec_pb2.RetryPolicy, _Mapping]] = ..., state: _Optional[_Union[_batch_pb2.BatchState, str]] = ..., cancellation: _Optional[_Union[_batch_pb2.CancellationInfo, _Mapping]] = ..., counts: _Optional[_Union[_batch_pb2.JobCounts, _Mapping]] = ..., cost_micro_usd: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class JobGroupSpec(_message.Message):
    __slots__ = ("parent", "attributes", "cancel_after_n_failures", "retry_policy")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PARENT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CANCEL_AFTER_N_FAILURES_FIELD_NUMBER: _ClassVar[int]
    RETRY_POLICY_FIELD_NUMBER: _ClassVar[int]
    parent: _job_spec_pb2.JobGroupRef
    attributes: _containers.ScalarMap[str, str]
    cancel_after_n_failures: int
    retry_policy: _job_spec_pb2.RetryPolicy
    def __init__(self, parent: _Optional[_Union[_job_spec_pb2.JobGroupRef, _Mapping]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., cancel_after_n_failures: _Optional[int] = ..., retry_policy: _Optional[_Union[_job_spec_pb2.RetryPolicy, _Mapping]] = ...) -> None: ...
