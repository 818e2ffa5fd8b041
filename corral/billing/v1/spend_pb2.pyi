import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SpendBreakdown(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SPEND_BREAKDOWN_UNSPECIFIED: _ClassVar[SpendBreakdown]
    SPEND_BREAKDOWN_DAY: _ClassVar[SpendBreakdown]
    SPEND_BREAKDOWN_BATCH: _ClassVar[SpendBreakdown]
    SPEND_BREAKDOWN_USER: _ClassVar[SpendBreakdown]
SPEND_BREAKDOWN_UNSPECIFIED: SpendBreakdown
SPEND_BREAKDOWN_DAY: SpendBreakdown
SPEND_BREAKDOWN_BATCH: SpendBreakdown
SPEND_BREAKDOWN_USER: SpendBreakdown

class SpendLine(_message.Message):
    __slots__ = ("day", "batch_id", "username", "cost_micro_usd")
    DAY_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    COST_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    day: str
    batch_id: int
    username: str
    cost_micro_usd: int
    def __init__(self, day: _Optional[str] = ..., batch_id: _Optional[int] = ..., username: _Optional[str] = ..., cost_micro_usd: _Optional[int] = ...) -> None: ...

class SpendUpdate(_message.Message):
    __slots__ = ("billing_project", "at", "spend_micro_usd", "delta_micro_usd", "reserved_micro_usd", "limit_micro_usd", "batch_deltas")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    SPEND_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    DELTA_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    RESERVED_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    BATCH_DELTAS_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    at: _timestamp_pb2.Timestamp
    spend_micro_usd: int
    delta_micro_usd: int
    reserved_micro_usd: int
    limit_micro_usd: int
    batch_deltas: _containers.RepeatedCompositeFieldContainer[SpendLine]
    def __init__(self, billing_project: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., spend_micro_usd: _Optional[int] = ..., delta_micro_usd: _Optional[int] = ..., reserved_micro_usd: _Optional[int] = ..., limit_micro_usd: _Optional[int] = ..., batch_deltas: _Optional[_Iterable[_Union[SpendLine, _Mapping]]] = ...) -> None: ...

class Reservation(_message.Message):
    __slots__ = ("batch_id", "reserved_micro_usd", "since", "n_attempts")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVED_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    N_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    reserved_micro_usd: int
    since: _timestamp_pb2.Timestamp
    n_attempts: int
    def __init__(self, batch_id: _Optional[int] = ..., reserved_micro_usd: _Optional[int] = ..., since: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., n_attempts: _Optional[int] = ...) -> None: ...
