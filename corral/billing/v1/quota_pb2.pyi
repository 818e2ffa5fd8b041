import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class QuotaKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUOTA_KIND_UNSPECIFIED: _ClassVar[QuotaKind]
    QUOTA_KIND_PROJECT: _ClassVar[QuotaKind]
    QUOTA_KIND_USER: _ClassVar[QuotaKind]
QUOTA_KIND_UNSPECIFIED: QuotaKind
QUOTA_KIND_PROJECT: QuotaKind
QUOTA_KIND_USER: QuotaKind

class Quota(_message.Message):
    __slots__ = ("kind", "name", "max_running_cores_mcpu", "max_running_jobs", "max_ready_jobs", "weight", "set_by", "set_at")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_READY_JOBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SET_AT_FIELD_NUMBER: _ClassVar[int]
    kind: QuotaKind
    name: str
    max_running_cores_mcpu: int
    max_running_jobs: int
    max_ready_jobs: int
    weight: int
    set_by: str
    set_at: _timestamp_pb2.Timestamp
    def __init__(self, kind: _Optional[_Union[QuotaKind, str]] = ..., name: _Optional[str] = ..., max_running_cores_mcpu: _Optional[int] = ..., max_running_jobs: _Optional[int] = ..., max_ready_jobs: _Optional[int] = ..., weight: _Optional[int] = ..., set_by: _Optional[str] = ..., set_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
