import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class InstanceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTANCE_STATE_UNSPECIFIED: _ClassVar[InstanceState]
    INSTANCE_STATE_PENDING: _ClassVar[InstanceState]
    INSTANCE_STATE_ACTIVE: _ClassVar[InstanceState]
    INSTANCE_STATE_INACTIVE: _ClassVar[InstanceState]
    INSTANCE_STATE_DELETED: _ClassVar[InstanceState]
INSTANCE_STATE_UNSPECIFIED: InstanceState
INSTANCE_STATE_PENDING: InstanceState
INSTANCE_STATE_ACTIVE: InstanceState
INSTANCE_STATE_INACTIVE: InstanceState
INSTANCE_STATE_DELETED: InstanceState

class Instance(_message.Message):
    __slots__ = ("instance_name", "instance_id", "state", "collection", "region", "machine_type", "spot", "cores_mcpu", "free_cores_mcpu", "memory_bytes", "storage_bytes", "address", "n_running_attempts", "created_at", "activated_at", "last_heartbeat_at", "deactivated_at")
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COLLECTION_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MACHINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    FREE_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    N_RUNNING_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    DEACTIVATED_AT_FIELD_NUMBER: _ClassVar[int]
    instance_name: str
    instance_id: int
    state: InstanceState
    collection: str
    region: str
    machine_type: str
    spot: bool
    cores_mcpu: int
    free_cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    address: str
    n_running_attempts: int
    created_at: _timestamp_pb2.Timestamp
    activated_at: _timestamp_pb2.Timestamp
    last_heartbeat_at: _timestamp_pb2.Timestamp
    deactivated_at: _timestamp_pb2.Timestamp
    def __init__(self, instance_name: _Optional[str] = ..., instance_id: _Optional[int] = ..., state: _Optional[_Union[InstanceState, str]] = ..., collection: _Optional[str] = ..., region: _Optional[str] = ..., machine_type: _Optional[str] = ..., spot: _Optional[bool] = ..., cores_mcpu: _Optional[int] = ..., free_cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., address: _Optional[str] = ..., n_running_attempts: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., activated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deactivated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class SessionConfig(_message.Message):
    __slots__ = ("heartbeat_interval", "heartbeat_timeout", "idle_timeout", "event_retry_limit")
    HEARTBEAT_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    IDLE_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EVENT_RETRY_LIMIT_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval: _duration_pb2.Duration
    heartbeat_timeout: _duration_pb2.Duration
    idle_timeout: _duration_pb2.Duration
    event_retry_limit: _duration_pb2.Duration
    def __init__(self, heartbeat_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., heartbeat_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., idle_timeout: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., event_retry_limit: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
