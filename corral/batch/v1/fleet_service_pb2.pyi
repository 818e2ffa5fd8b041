from corral.batch.v1 import fleet_pb2 as _fleet_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListPoolsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.Pool]
    def __init__(self, pools: _Optional[_Iterable[_Union[_fleet_pb2.Pool, _Mapping]]] = ...) -> None: ...

class PausePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class PausePoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _fleet_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_fleet_pb2.Pool, _Mapping]] = ...) -> None: ...

class ResumePoolRequest(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class ResumePoolResponse(_message.Message):
    __slots__ = ("pool",)
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: _fleet_pb2.Pool
    def __init__(self, pool: _Optional[_Union[_fleet_pb2.Pool, _Mapping]] = ...) -> None: ...

class ListInstancesRequest(_message.Message):
    __slots__ = ("pool", "state", "page_size", "page_token")
    POOL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    pool: str
    state: _fleet_pb2.InstanceState
    page_size: int
    page_token: str
    def __init__(self, pool: _Optional[str] = ..., state: _Optional[_Union[_fleet_pb2.InstanceState, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListInstancesResponse(_message.Message):
    __slots__ = ("instances", "next_page_token")
    INSTANCES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    instances: _containers.RepeatedCompositeFieldContainer[_fleet_pb2.Instance]
    next_page_token: str
    def __init__(self, instances: _Optional[_Iterable[_Union[_fleet_pb2.Instance, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
