import datetime

from corral.batch.v1 import job_pb2 as _job_pb2
from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LockStatus(_message.Message):
    __slots__ = ("billing_project", "level", "name", "holders", "waiters", "n_waiters")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    N_WAITERS_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    level: str
    name: str
    holders: _containers.RepeatedCompositeFieldContainer[LockHolder]
    waiters: _containers.RepeatedCompositeFieldContainer[LockWaiter]
    n_waiters: int
    def __init__(self, billing_project: _Optional[str] = ..., level: _Optional[str] = ..., name: _Optional[str] = ..., holders: _Optional[_Iterable[_Union[LockHolder, _Mapping]]] = ..., waiters: _Optional[_Iterable[_Union[LockWaiter, _Mapping]]] = ..., n_waiters: _Optional[int] = ...) -> None: ...

class LockHolder(_message.Message):
    __slots__ = ("job", "mode", "since")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    job: _job_pb2.JobRef
    mode: _job_spec_pb2.LockMode
    since: _timestamp_pb2.Timestamp
    def __init__(self, job: _Optional[_Union[_job_pb2.JobRef, _Mapping]] = ..., mode: _Optional[_Union[_job_spec_pb2.LockMode, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class LockWaiter(_message.Message):
    __slots__ = ("job", "mode", "since", "priority_weight", "blocked_by", "priority")
    JOB_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    job: _job_pb2.JobRef
    mode: _job_spec_pb2.LockMode
    since: _timestamp_pb2.Timestamp
    priority_weight: float
    blocked_by: _containers.RepeatedCompositeFieldContainer[_job_pb2.JobRef]
    priority: int
    def __init__(self, job: _Optional[_Union[_job_pb2.JobRef, _Mapping]] = ..., mode: _Optional[_Union[_job_spec_pb2.LockMode, str]] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., priority_weight: _Optional[float] = ..., blocked_by: _Optional[_Iterable[_Union[_job_pb2.JobRef, _Mapping]]] = ..., priority: _Optional[int] = ...) -> None: ...
