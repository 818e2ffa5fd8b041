import datetime

from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AttemptEndReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ATTEMPT_END_REASON_UNSPECIFIED: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_EXITED: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_OUT_OF_MEMORY: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_TIMED_OUT: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_CANCELLED: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_PREEMPTED: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_WORKER_LOST: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_SYSTEM_ERROR: _ClassVar[AttemptEndReason]
    ATTEMPT_END_REASON_REFUSED: _ClassVar[AttemptEndReason]

class JobStep(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STEP_UNSPECIFIED: _ClassVar[JobStep]
    JOB_STEP_INPUT: _ClassVar[JobStep]
    JOB_STEP_MAIN: _ClassVar[JobStep]
    JOB_STEP_OUTPUT: _ClassVar[JobStep]
ATTEMPT_END_REASON_UNSPECIFIED: AttemptEndReason
ATTEMPT_END_REASON_EXITED: AttemptEndReason
ATTEMPT_END_REASON_OUT_OF_MEMORY: AttemptEndReason
ATTEMPT_END_REASON_TIMED_OUT: AttemptEndReason
ATTEMPT_END_REASON_CANCELLED: AttemptEndReason
ATTEMPT_END_REASON_PREEMPTED: AttemptEndReason
ATTEMPT_END_REASON_WORKER_LOST: AttemptEndReason
ATTEMPT_END_REASON_SYSTEM_ERROR: AttemptEndReason
ATTEMPT_END_REASON_REFUSED: AttemptEndReason
JOB_STEP_UNSPECIFIED: JobStep
JOB_STEP_INPUT: JobStep
JOB_STEP_MAIN: JobStep
JOB_STEP_OUTPUT: JobStep

class Job(_message.Message):
    __slots__ = ("batch_id", "job_id", "update_id", "job_group_id", "user", "billing_project", "state", "spec", "attempts", "attributes", "exit_code", "error_message", "cost_micro_usd", "created_at", "ready_at", "started_at", "completed_at", "rerun_of_job_id", "resources", "normalized_image", "parent_job_ids")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    READY_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_AT_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_IMAGE_FIELD_NUMBER: _ClassVar[int]
    PARENT_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    update_id: int
    job_group_id: int
    user: str
    billing_project: str
    state: _job_state_pb2.JobState
    spec: _job_spec_pb2.JobSpec
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    attributes: _containers.ScalarMap[str, str]
    exit_code: int
    error_message: str
    cost_micro_usd: int
    created_at: _timestamp_pb2.Timestamp
    ready_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    completed_at: _timestamp_pb2.Timestamp
    rerun_of_job_id: int
    resources: JobResources
    normalized_image: str
    parent_job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., update_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., user: _Optional[str] = ..., billing_project: _Optional[str] = ..., state: _Optional[_Union[_job_state_pb2.JobState, str]] = ..., spec: _Optional[_Union[_job_spec_pb2.JobSpec, _Mapping]] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., attributes: _Optional[_Mapping[str, str]] = ..., exit_code: _Optional[int] = ..., error_message: _Optional[str] = ..., cost_micro_usd: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ready_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., completed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., rerun_of_job_id: _Optional[int] = ..., resources: _Optional[_Union[JobResources, _Mapping]] = ..., normalized_image: _Optional[str] = ..., parent_job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class JobResources(_message.Message):
    __slots__ = ("cores_mcpu", "memory_bytes", "storage_bytes", "pool")
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    pool: str
    def __init__(self, cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., pool: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt_id", "instance_name", "region", "spot", "cores_mcpu", "memory_bytes", "started_at", "ended_at", "end_reason", "exit_code", "error_message", "resources_used", "cost_micro_usd", "isolation", "retry_reason", "retry_delay", "image_digest")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_USED_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    RETRY_REASON_FIELD_NUMBER: _ClassVar[int]
    RETRY_DELAY_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    instance_name: str
    region: str
    spot: bool
    cores_mcpu: int
    memory_bytes: int
    started_at: _timestamp_pb2.Timestamp
    ended_at: _timestamp_pb2.Timestamp
    end_reason: AttemptEndReason
    exit_code: int
    error_message: str
    resources_used: ResourceUsage
    cost_micro_usd: int
    isolation: str
    retry_reason: str
    retry_delay: _duration_pb2.Duration
    image_digest: str
    def __init__(self, attempt_id: _Optional[str] = ..., instance_name: _Optional[str] = ..., region: _Optional[str] = ..., spot: _Optional[bool] = ..., cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., ended_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_reason: _Optional[_Union[AttemptEndReason, str]] = ..., exit_code: _Optional[int] = ..., error_message: _Optional[str] = ..., resources_used: _Optional[_Union[ResourceUsage, _Mapping]] = ..., cost_micro_usd: _Optional[int] = ..., isolation: _Optional[str] = ..., retry_reason: _Optional[str] = ..., retry_delay: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., image_digest: _Optional[str] = ...) -> None: ...

class ResourceUsage(_message.Message):
    __slots__ = ("cpu_time", "peak_memory_bytes", "peak_storage_bytes", "network_received_bytes", "network_sent_bytes")
    CPU_TIME_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_RECEIVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NETWORK_SENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    cpu_time: _duration_pb2.Duration
    peak_memory_bytes: int
    peak_storage_bytes: int
    network_received_bytes: int
    network_sent_bytes: int
    def __init__(self, cpu_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., peak_memory_bytes: _Optional[int] = ..., peak_storage_bytes: _Optional[int] = ..., network_received_bytes: _Optional[int] = ..., network_sent_bytes: _Optional[int] = ...) -> None: ...

class UsageSample(_message.Message):
    __slots__ = ("at", "cpu_time", "memory_bytes", "peak_memory_bytes", "io_read_bytes", "io_write_bytes")
    AT_FIELD_NUMBER: _ClassVar[int]
    CPU_TIME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    PEAK_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_READ_BYTES_FIELD_NUMBER: _ClassVar[int]
    IO_WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    at: _timestamp_pb2.Timestamp
    cpu_time: _duration_pb2.Duration
    memory_bytes: int
    peak_memory_bytes: int
    io_read_bytes: int
    io_write_bytes: int
    def __init__(self, at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cpu_time: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., memory_bytes: _Optional[int] = ..., peak_memory_bytes: _Optional[int] = ..., io_read_bytes: _Optional[int] = ..., io_write_bytes: _Optional[int] = ...) -> None: ...

class JobRef(_message.Message):
    __slots__ = ("batch_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...
