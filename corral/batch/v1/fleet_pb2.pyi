import datetime

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

class Pool(_message.Message):
    __slots__ = ("name", "shared", "provider", "machine_type", "cores_mcpu", "memory_bytes", "storage_bytes", "spot", "max_instances", "enabled", "n_pending", "n_active", "n_inactive", "paused", "paused_by", "paused_at")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_FIELD_NUMBER: _ClassVar[int]
    MACHINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STORAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    MAX_INSTANCES_FIELD_NUMBER: _ClassVar[int]
    ENABLED_FIELD_NUMBER: _ClassVar[int]
    N_PENDING_FIELD_NUMBER: _ClassVar[int]
    N_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    N_INACTIVE_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    PAUSED_BY_FIELD_NUMBER: _ClassVar[int]
    PAUSED_AT_FIELD_NUMBER: _ClassVar[int]
    name: str
    shared: bool
    provider: str
    machine_type: str
    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int
    spot: bool
    max_instances: int
    enabled: bool
    n_pending: int
    n_active: int
    n_inactive: int
    paused: bool
    paused_by: str
    paused_at: _timestamp_pb2.Timestamp
    def __init__(self, name: _Optional[str] = ..., shared: _Optional[bool] = ..., provider: _Optional[str] = ..., machine_type: _Optional[str] = ..., cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., storage_bytes: _Optional[int] = ..., spot: _Optional[bool] = ..., max_instances: _Optional[int] = ..., enabled: _Optional[bool] = ..., n_pending: _Optional[int] = ..., n_active: _Optional[int] = ..., n_inactive: _Optional[int] = ..., paused: _Optional[bool] = ..., paused_by: _Optional[str] = ..., paused_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Instance(_message.Message):
    __slots__ = ("name", "pool", "state", "region", "machine_type", "spot", "cores_mcpu", "free_cores_mcpu", "memory_bytes", "n_running_attempts", "created_at", "activated_at", "last_heartbeat_at", "deactivated_at", "deactivation_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    MACHINE_TYPE_FIELD_NUMBER: _ClassVar[int]
    SPOT_FIELD_NUMBER: _ClassVar[int]
    CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    FREE_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    N_RUNNING_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ACTIVATED_AT_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    DEACTIVATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEACTIVATION_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    pool: str
    state: InstanceState
    region: str
    machine_type: str
    spot: bool
    cores_mcpu: int
    free_cores_mcpu: int
    memory_bytes: int
    n_running_attempts: int
    created_at: _timestamp_pb2.Timestamp
    activated_at: _timestamp_pb2.Timestamp
    last_heartbeat_at: _timestamp_pb2.Timestamp
    deactivated_at: _timestamp_pb2.Timestamp
    deactivation_reason: str
    def __init__(self, name: _Optional[str] = ..., pool: _Optional[str] = ..., state: _Optional[_Union[InstanceState, str]] = ..., region: _Optional[str] = ..., machine_type: _Optional[str] = ..., spot: _Optional[bool] = ..., cores_mcpu: _Optional[int] = ..., free_cores_mcpu: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., n_running_attempts: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., activated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., last_heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deactivated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deactivation_reason: _Optional[str] = ...) -> None: ...
