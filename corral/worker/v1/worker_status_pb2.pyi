import datetime

from corral.batch.v1 import job_pb2 as _job_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RuntimeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUNTIME_KIND_UNSPECIFIED: _ClassVar[RuntimeKind]
    RUNTIME_KIND_OCI: _ClassVar[RuntimeKind]
    RUNTIME_KIND_PROCESS: _ClassVar[RuntimeKind]
RUNTIME_KIND_UNSPECIFIED: RuntimeKind
RUNTIME_KIND_OCI: RuntimeKind
RUNTIME_KIND_PROCESS: RuntimeKind

class RunningAttempt(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id", "step", "cores_mcpu", "memory_bytes", "started_at", "resources_used")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_USED_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    step: _job_pb2.JobStep
    cores_mcpu: int
    memory_bytes: int
    started_at: _timestamp_pb2.Timestamp
    resources_used: _job_pb2.ResourceUsage
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step: _Optional[_Union[_job_pb2.JobStep, str]] = ..., cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources_used: _Optional[_Union[_job_pb2.ResourceUsage, _Mapping]] = ...) -> None: ...

class CachedImage(_message.Message):
    __slots__ = ("reference", "digest", "size_bytes", "pulled_at", "last_used_at")
    REFERENCE_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    PULLED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_AT_FIELD_NUMBER: _ClassVar[int]
    reference: str
    digest: str
    size_bytes: int
    pulled_at: _timestamp_pb2.Timestamp
    last_used_at: _timestamp_pb2.Timestamp
    def __init__(self, reference: _Optional[str] = ..., digest: _Optional[str] = ..., size_bytes: _Optional[int] = ..., pulled_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_used_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
