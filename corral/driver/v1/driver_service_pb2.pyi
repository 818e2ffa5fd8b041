import datetime

from corral.authz.v1 import authz_pb2 as _authz_pb2
from corral.driver.v1 import instance_pb2 as _instance_pb2
from corral.driver.v1 import worker_session_pb2 as _worker_session_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChangeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHANGE_KIND_UNSPECIFIED: _ClassVar[ChangeKind]
    CHANGE_KIND_JOBS_READY: _ClassVar[ChangeKind]
    CHANGE_KIND_BATCH_CANCELLED: _ClassVar[ChangeKind]
    CHANGE_KIND_JOB_GROUP_CANCELLED: _ClassVar[ChangeKind]
    CHANGE_KIND_BILLING_CHANGED: _ClassVar[ChangeKind]
CHANGE_KIND_UNSPECIFIED: ChangeKind
CHANGE_KIND_JOBS_READY: ChangeKind
CHANGE_KIND_BATCH_CANCELLED: ChangeKind
CHANGE_KIND_JOB_GROUP_CANCELLED: ChangeKind
CHANGE_KIND_BILLING_CHANGED: ChangeKind

class ActivateWorkerRequest(_message.Message):
    __slots__ = ("instance_name", "activation_token", "cores_mcpu", "memory_bytes", "storage_bytes", "region", "address", "version")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ACTIVATION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    activation_token: str
    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    region: str
    address: str
    version: str
    def __init__(self, instance_name: _Optional[str] = ..., activation_token: _Optional[str] = ..., cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., region: _Optional[str] = ..., address: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ActivateWorkerResponse(_message.Message):
    __slots__ = ("instance_id", "instance_token", "config", "epoch")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    instance_id: int
    instance_token: str
    config: _instance_pb2.SessionConfig
    epoch: int
    def __init__(self, instance_id: _Optional[int] = ..., instance_token: _Optional[str] = ..., config: _Optional[_Union[_instance_pb2.SessionConfig, _Mapping]] = ..., epoch: _Optional[int] = ...) -> None: ...

class DeactivateWorkerRequest(_message.Message):
    __slots__ = ("instance_name", "instance_token", "reason")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    instance_token: str
    reason: _worker_session_pb2.DrainReason
    def __init__(self, instance_name: _Optional[str] = ..., instance_token: _Optional[str] = ..., reason: _Optional[_Union[_worker_session_pb2.DrainReason, str]] = ...) -> None: ...

class DeactivateWorkerResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerSessionRequest(_message.Message):
    __slots__ = ("event_id", "sent_at", "hello", "heartbeat", "job_started", "job_completed", "command_ack", "draining", "events", "image_cache")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    JOB_STARTED_FIELD_NUMBER: _ClassVar[int]
    JOB_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    COMMAND_ACK_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    IMAGE_CACHE_FIELD_NUMBER: _ClassVar[int]
    event_id: int
    sent_at: _timestamp_pb2.Timestamp
    hello: _worker_session_pb2.Hello
    heartbeat: _worker_session_pb2.Heartbeat
    job_started: _worker_session_pb2.JobStarted
    job_completed: _worker_session_pb2.JobCompleted
    command_ack: _worker_session_pb2.CommandAck
    draining: _worker_session_pb2.Draining
    events: EventBunch
    image_cache: _worker_session_pb2.ImageCacheReport
    def __init__(self, event_id: _Optional[int] = ..., sent_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., hello: _Optional[_Union[_worker_session_pb2.Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[_worker_session_pb2.Heartbeat, _Mapping]] = ..., job_started: _Optional[_Union[_worker_session_pb2.JobStarted, _Mapping]] = ..., job_completed: _Optional[_Union[_worker_session_pb2.JobCompleted, _Mapping]] = ..., command_ack: _Optional[_Union[_worker_session_pb2.CommandAck, _Mapping]] = ..., draining: _Optional[_Union[_worker_session_pb2.Draining, _Mapping]] = ..., events: _Optional[_Union[EventBunch, _Mapping]] = ..., image_cache: _Optional[_Union[_worker_session_pb2.ImageCacheReport, _Mapping]] = ...) -> None: ...

class WorkerSessionResponse(_message.Message):
    __slots__ = ("command_id", "welcome", "run_job", "cancel_job", "drain", "shutdown", "ack_job_event", "commands")
    COMMAND_ID_FIELD_NUMBER: _ClassVar[int]
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    RUN_JOB_FIELD_NUMBER: _ClassVar[int]
    CANCEL_JOB_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    ACK_JOB_EVENT_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    command_id: int
    welcome: _worker_session_pb2.Welcome
    run_job: _worker_session_pb2.RunJob
    cancel_job: _worker_session_pb2.CancelJob
    drain: _worker_session_pb2.Drain
    shutdown: _worker_session_pb2.Shutdown
    ack_job_event: _worker_session_pb2.AckJobEvent
    commands: CommandBunch
    def __init__(self, command_id: _Optional[int] = ..., welcome: _Optional[_Union[_worker_session_pb2.Welcome, _Mapping]] = ..., run_job: _Optional[_Union[_worker_session_pb2.RunJob, _Mapping]] = ..., cancel_job: _Optional[_Union[_worker_session_pb2.CancelJob, _Mapping]] = ..., drain: _Optional[_Union[_worker_session_pb2.Drain, _Mapping]] = ..., shutdown: _Optional[_Union[_worker_session_pb2.Shutdown, _Mapping]] = ..., ack_job_event: _Optional[_Union[_worker_session_pb2.AckJobEvent, _Mapping]] = ..., commands: _Optional[_Union[CommandBunch, _Mapping]] = ...) -> None: ...

class EventBunch(_message.Message):
    __slots__ = ("events",)
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[WorkerSessionRequest]
    def __init__(self, events: _Optional[_Iterable[_Union[WorkerSessionRequest, _Mapping]]] = ...) -> None: ...

class CommandBunch(_message.Message):
    __slots__ = ("commands",)
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    commands: _containers.RepeatedCompositeFieldContainer[WorkerSessionResponse]
    def __init__(self, commands: _Optional[_Iterable[_Union[WorkerSessionResponse, _Mapping]]] = ...) -> None: ...

class NotifyChangeRequest(_message.Message):
    __slots__ = ("kind", "batch_id", "job_group_id", "billing_project")
    KIND_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    kind: ChangeKind
    batch_id: int
    job_group_id: int
    billing_project: str
    def __init__(self, kind: _Optional[_Union[ChangeKind, str]] = ..., batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., billing_project: _Optional[str] = ...) -> None: ...

class NotifyChangeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLeaderRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLeaderResponse(_message.Message):
    __slots__ = ("epoch", "leader_address", "is_leader", "elected_at")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    ELECTED_AT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_address: str
    is_leader: bool
    elected_at: _timestamp_pb2.Timestamp
    def __init__(self, epoch: _Optional[int] = ..., leader_address: _Optional[str] = ..., is_leader: _Optional[bool] = ..., elected_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("state", "collection", "page_size", "page_token")
    STATE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    state: _instance_pb2.InstanceState
    collection: str
    page_size: int
    page_token: str
    def __init__(self, state: _Optional[_Union[_instance_pb2.InstanceState, str]] = ..., collection: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "next_page_token")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_instance_pb2.Instance]
    next_page_token: str
    def __init__(self, instances: _Optional[_Iterable[_Union[_instance_pb2.Instance, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListHeldImagesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListHeldImagesResponse(_message.Message):
    __slots__ = ("images", "workers", "truncated")
    IMAGES_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    images: _containers.RepeatedCompositeFieldContainer[HeldImage]
    workers: int
    truncated: bool
    def __init__(self, images: _Optional[_Iterable[_Union[HeldImage, _Mapping]]] = ..., workers: _Optional[int] = ..., truncated: _Optional[bool] = ...) -> None: ...

class HeldImage(_message.Message):
    __slots__ = ("digest", "workers_holding", "public_references", "instances")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    WORKERS_HOLDING_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_REFERENCES_FIELD_NUMBER: _ClassVar[int]
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    digest: str
    workers_holding: int
    public_references: _containers.RepeatedScalarFieldContainer[str]
    instances: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digest: _Optional[str] = ..., workers_holding: _Optional[int] = ..., public_references: _Optional[_Iterable[str]] = ..., instances: _Optional[_Iterable[str]] = ...) -> None: ...
