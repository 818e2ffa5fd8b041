from corral.batch.v1 import lock_pb2 as _lock_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListLocksRequest(_message.Message):
    __slots__ = ("billing_project", "level", "name", "page_size", "page_token")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    level: str
    name: str
    page_size: int
    page_token: str
    def __init__(self, billing_project: _Optional[str] = ..., level: _Optional[str] = ..., name: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListLocksResponse(_message.Message):
    __slots__ = ("locks", "next_page_token")
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[_lock_pb2.LockStatus]
    next_page_token: str
    def __init__(self, locks: _Optional[_Iterable[_Union[_lock_pb2.LockStatus, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
