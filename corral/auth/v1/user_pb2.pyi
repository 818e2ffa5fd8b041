import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UserKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USER_KIND_UNSPECIFIED: _ClassVar[UserKind]
    USER_KIND_PERSON: _ClassVar[UserKind]
    USER_KIND_SERVICE: _ClassVar[UserKind]

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROLE_UNSPECIFIED: _ClassVar[Role]
    ROLE_USER: _ClassVar[Role]
    ROLE_DEVELOPER: _ClassVar[Role]
    ROLE_ADMIN: _ClassVar[Role]

class UserState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    USER_STATE_UNSPECIFIED: _ClassVar[UserState]
    USER_STATE_ACTIVE: _ClassVar[UserState]
    USER_STATE_DEACTIVATED: _ClassVar[UserState]
USER_KIND_UNSPECIFIED: UserKind
USER_KIND_PERSON: UserKind
USER_KIND_SERVICE: UserKind
ROLE_UNSPECIFIED: Role
ROLE_USER: Role
ROLE_DEVELOPER: Role
ROLE_ADMIN: Role
USER_STATE_UNSPECIFIED: UserState
USER_STATE_ACTIVE: UserState
USER_STATE_DEACTIVATED: UserState

class User(_message.Message):
    __slots__ = ("username", "kind", "roles", "state", "display_name", "email", "created_at", "deactivated_at")
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    EMAIL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    DEACTIVATED_AT_FIELD_NUMBER: _ClassVar[int]
    username: str
    kind: UserKind
    roles: _containers.RepeatedScalarFieldContainer[Role]
    state: UserState
    display_name: str
    email: str
    created_at: _timestamp_pb2.Timestamp
    deactivated_at: _timestamp_pb2.Timestamp
    def __init__(self, username: _Optional[str] = ..., kind: _Optional[_Union[UserKind, str]] = ..., roles: _Optional[_Iterable[_Union[Role, str]]] = ..., state: _Optional[_Union[UserState, str]] = ..., display_name: _Optional[str] = ..., email: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., deactivated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
