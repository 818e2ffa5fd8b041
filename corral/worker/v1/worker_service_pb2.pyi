import datetime

from corral.authz.v1 import authz_pb2 as _authz_pb2
from corral.batch.v1 import job_pb2 as _job_pb2
from corral.worker.v1 import worker_status_pb2 as _worker_status_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("instance_name", "version", "runtime_kind", "runtime_version", "isolated", "cores_mcpu", "free_cores_mcpu", "memory_bytes", "free_memory_bytes", "storage_bytes", "free_storage_bytes", "running_attempts", "draining", "connected", "started_at")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_KIND_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_VERSION_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    FREE_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    version: str
    runtime_kind: _worker_status_pb2.RuntimeKind
    runtime_version: str
    isolated: bool
    cores_mcpu: int
    free_cores_mcpu: int
    memory_bytes: int
    free_memory_bytes: int
    storage_bytes: int
    free_storage_bytes: int
    running_attempts: _containers.RepeatedCompositeFieldContainer[_worker_status_pb2.RunningAttempt]
    draining: bool
    connected: bool
    started_at: _timestamp_pb2.Timestamp
    def __init__(self, instance_name: _Optional[str] = ..., version: _Optional[str] = ..., runtime_kind: _Optional[_Union[_worker_status_pb2.RuntimeKind, str]] = ..., runtime_version: _Optional[str] = ..., isolated: _Optional[bool] = ..., cores_mcpu: _Optional[int] = ..., free_cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., free_storage_bytes: _Optional[int] = ..., running_attempts: _Optional[_Iterable[_Union[_worker_status_pb2.RunningAttempt, _Mapping]]] = ..., draining: _Optional[bool] = ..., connected: _Optional[bool] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class GetJobLogRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id", "step", "start_byte", "max_bytes")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    step: _job_pb2.JobStep
    start_byte: int
    max_bytes: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step: _Optional[_Union[_job_pb2.JobStep, str]] = ..., start_byte: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetJobLogResponse(_message.Message):
    __slots__ = ("data", "start_byte", "total_bytes", "complete")
    DATA_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    start_byte: int
    total_bytes: int
    complete: bool
    def __init__(self, data: _Optional[bytes] = ..., start_byte: _Optional[int] = ..., total_bytes: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class StreamJobLogRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id", "step", "start_byte")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    step: _job_pb2.JobStep
    start_byte: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step: _Optional[_Union[_job_pb2.JobStep, str]] = ..., start_byte: _Optional[int] = ...) -> None: ...

class StreamJobLogResponse(_message.Message):
    __slots__ = ("data", "start_byte")
    DATA_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    start_byte: int
    def __init__(self, data: _Optional[bytes] = ..., start_byte: _Optional[int] = ...) -> None: ...

class ListImagesRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListImagesResponse(_message.Message):
    __slots__ = ("images", "next_page_token")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[_worker_status_pb2.CachedImage]
    next_page_token: str
    def __init__(self, images: _Optional[_Iterable[_Union[_worker_status_pb2.CachedImage, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetAttemptUsageRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class GetAttemptUsageResponse(_message.Message):
    __slots__ = ("samples", "interval", "runtime", "note", "complete")
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    samples: _containers.RepeatedCompositeFieldContainer[_job_pb2.UsageSample]
    interval: _duration_pb2.Duration
    runtime: str
    note: str
    complete: bool
    def __init__(self, samples: _Optional[_Iterable[_Union[_job_pb2.UsageSample, _Mapping]]] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., runtime: _Optional[str] = ..., note: _Optional[str] = ..., complete: _Optional[bool] = ...) -> None: ...
