import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BillingProjectState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BILLING_PROJECT_STATE_UNSPECIFIED: _ClassVar[BillingProjectState]
    BILLING_PROJECT_STATE_OPEN: _ClassVar[BillingProjectState]
    BILLING_PROJECT_STATE_CLOSED: _ClassVar[BillingProjectState]
    BILLING_PROJECT_STATE_DELETED: _ClassVar[BillingProjectState]
BILLING_PROJECT_STATE_UNSPECIFIED: BillingProjectState
BILLING_PROJECT_STATE_OPEN: BillingProjectState
BILLING_PROJECT_STATE_CLOSED: BillingProjectState
BILLING_PROJECT_STATE_DELETED: BillingProjectState

class BillingProject(_message.Message):
    __slots__ = ("name", "state", "members", "limit_micro_usd", "spend_micro_usd", "reserved_micro_usd", "created_at", "closed_at", "max_job_duration")
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    SPEND_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    RESERVED_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CLOSED_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_DURATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: BillingProjectState
    members: _containers.RepeatedScalarFieldContainer[str]
    limit_micro_usd: int
    spend_micro_usd: int
    reserved_micro_usd: int
    created_at: _timestamp_pb2.Timestamp
    closed_at: _timestamp_pb2.Timestamp
    max_job_duration: _duration_pb2.Duration
    def __init__(self, name: _Optional[str] = ..., state: _Optional[_Union[BillingProjectState, str]] = ..., members: _Optional[_Iterable[str]] = ..., limit_micro_usd: _Optional[int] = ..., spend_micro_usd: _Optional[int] = ..., reserved_micro_usd: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., closed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., max_job_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...
