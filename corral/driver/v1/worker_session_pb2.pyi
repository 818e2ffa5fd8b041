import datetime

from corral.batch.v1 import job_pb2 as _job_pb2
from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from corral.driver.v1 import instance_pb2 as _instance_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DrainReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DRAIN_REASON_UNSPECIFIED: _ClassVar[DrainReason]
    DRAIN_REASON_IDLE: _ClassVar[DrainReason]
    DRAIN_REASON_REQUESTED: _ClassVar[DrainReason]
    DRAIN_REASON_PREEMPTION_NOTICE: _ClassVar[DrainReason]
    DRAIN_REASON_UNHEALTHY: _ClassVar[DrainReason]
DRAIN_REASON_UNSPECIFIED: DrainReason
DRAIN_REASON_IDLE: DrainReason
DRAIN_REASON_REQUESTED: DrainReason
DRAIN_REASON_PREEMPTION_NOTICE: DrainReason
DRAIN_REASON_UNHEALTHY: DrainReason

class Hello(_message.Message):
    __slots__ = ("instance_name", "instance_token", "epoch_seen", "takes_command_bunches", "protocol")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SEEN_FIELD_NUMBER: _ClassVar[int]
    TAKES_COMMAND_BUNCHES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    instance_token: str
    epoch_seen: int
    takes_command_bunches: bool
    protocol: int
    def __init__(self, instance_name: _Optional[str] = ..., instance_token: _Optional[str] = ..., epoch_seen: _Optional[int] = ..., takes_command_bunches: _Optional[bool] = ..., protocol: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("free_cores_mcpu", "free_memory_bytes", "running_attempts", "rollups")
    FREE_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    FREE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    ROLLUPS_FIELD_NUMBER: _ClassVar[int]
    free_cores_mcpu: int
    free_memory_bytes: int
    running_attempts: _containers.RepeatedCompositeFieldContainer[AttemptRef]
    rollups: _containers.RepeatedCompositeFieldContainer[BillingRollup]
    def __init__(self, free_cores_mcpu: _Optional[int] = ..., free_memory_bytes: _Optional[int] = ..., running_attempts: _Optional[_Iterable[_Union[AttemptRef, _Mapping]]] = ..., rollups: _Optional[_Iterable[_Union[BillingRollup, _Mapping]]] = ...) -> None: ...

class ImageCacheReport(_message.Message):
    __slots__ = ("images",)
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[CachedImage]
    def __init__(self, images: _Optional[_Iterable[_Union[CachedImage, _Mapping]]] = ...) -> None: ...

class CachedImage(_message.Message):
    __slots__ = ("digest", "names", "public_references")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    NAMES_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    names: _containers.RepeatedScalarFieldContainer[str]
    public_references: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digest: _Optional[str] = ..., names: _Optional[_Iterable[str]] = ..., public_references: _Optional[_Iterable[str]] = ...) -> None: ...

class AttemptRef(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class BillingRollup(_message.Message):
    __slots__ = ("attempt", "rollup_time", "usage")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ROLLUP_TIME_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptRef
    rollup_time: _timestamp_pb2.Timestamp
    usage: _job_pb2.ResourceUsage
    def __init__(self, attempt: _Optional[_Union[AttemptRef, _Mapping]] = ..., rollup_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., usage: _Optional[_Union[_job_pb2.ResourceUsage, _Mapping]] = ...) -> None: ...

class JobStarted(_message.Message):
    __slots__ = ("attempt", "start_time", "isolation", "image_digest")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    ISOLATION_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptRef
    start_time: _timestamp_pb2.Timestamp
    isolation: str
    image_digest: str
    def __init__(self, attempt: _Optional[_Union[AttemptRef, _Mapping]] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., isolation: _Optional[str] = ..., image_digest: _Optional[str] = ...) -> None: ...

class JobCompleted(_message.Message):
    __slots__ = ("attempt", "state", "end_reason", "exit_code", "error_message", "start_time", "end_time", "resources_used")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    END_REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    END_TIME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_USED_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptRef
    state: _job_state_pb2.JobState
    end_reason: _job_pb2.AttemptEndReason
    exit_code: int
    error_message: str
    start_time: _timestamp_pb2.Timestamp
    end_time: _timestamp_pb2.Timestamp
    resources_used: _job_pb2.ResourceUsage
    def __init__(self, attempt: _Optional[_Union[AttemptRef, _Mapping]] = ..., state: _Optional[_Union[_job_state_pb2.JobState, str]] = ..., end_reason: _Optional[_Union[_job_pb2.AttemptEndReason, str]] = ..., exit_code: _Optional[int] = ..., error_message: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., end_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., resources_used: _Optional[_Union[_job_pb2.ResourceUsage, _Mapping]] = ...) -> None: ...

class CommandAck(_message.Message):
    __slots__ = ("command_id", "accepted", "error_message")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    accepted: bool
    error_message: str
    def __init__(self, command_id: _Optional[int] = ..., accepted: _Optional[bool] = ..., error_message: _Optional[str] = ...) -> None: ...

class Draining(_message.Message):
    __slots__ = ("reason", "deadline")
    REASON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    reason: DrainReason
    deadline: _timestamp_pb2.Timestamp
    def __init__(self, reason: _Optional[_Union[DrainReason, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("epoch", "config", "takes_event_bunches", "protocol")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TAKES_EVENT_BUNCHES_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    config: _instance_pb2.SessionConfig
    takes_event_bunches: bool
    protocol: int
    def __init__(self, epoch: _Optional[int] = ..., config: _Optional[_Union[_instance_pb2.SessionConfig, _Mapping]] = ..., takes_event_bunches: _Optional[bool] = ..., protocol: _Optional[int] = ...) -> None: ...

class RunJob(_message.Message):
    __slots__ = ("attempt", "user", "billing_project", "spec", "cores_mcpu", "memory_bytes", "storage_bytes", "log_url", "attempt_token", "deadline", "trace_context", "storage_roots", "secrets", "image_pull_secret")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_URL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_TOKEN_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    STORAGE_ROOTS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_PULL_SECRET_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptRef
    user: str
    billing_project: str
    spec: _job_spec_pb2.JobSpec
    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    log_url: str
    attempt_token: str
    deadline: _timestamp_pb2.Timestamp
    trace_context: _containers.ScalarMap[str, str]
    storage_roots: _containers.RepeatedScalarFieldContainer[str]
    secrets: _containers.RepeatedCompositeFieldContainer[SecretFiles]
    image_pull_secret: SecretFiles
    def __init__(self, attempt: _Optional[_Union[AttemptRef, _Mapping]] = ..., user: _Optional[str] = ..., billing_project: _Optional[str] = ..., spec: _Optional[_Union[_job_spec_pb2.JobSpec, _Mapping]] = ..., cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., log_url: _Optional[str] = ..., attempt_token: _Optional[str] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., storage_roots: _Optional[_Iterable[str]] = ..., secrets: _Optional[_Iterable[_Union[SecretFiles, _Mapping]]] = ..., image_pull_secret: _Optional[_Union[SecretFiles, _Mapping]] = ...) -> None: ...

class SecretFiles(_message.Message):
    __slots__ = ("name", "mount_path", "files", "error")
    class FilesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    MOUNT_PATH_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    name: str
    mount_path: str
    files: _containers.ScalarMap[str, bytes]
    error: str
    def __init__(self, name: _Optional[str] = ..., mount_path: _Optional[str] = ..., files: _Optional[_Mapping[str, bytes]] = ..., error: _Optional[str] = ...) -> None: ...

class CancelJob(_message.Message):
    __slots__ = ("attempt", "reason")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    attempt: AttemptRef
    reason: str
    def __init__(self, attempt: _Optional[_Union[AttemptRef, _Mapping]] = ..., reason: _Optional[str] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class AckJobEvent(_message.Message):
    __slots__ = ("event_id",)
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    def __init__(self, event_id: _Optional[int] = ...) -> None: ...
