import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPDATE_STATE_UNSPECIFIED: _ClassVar[UpdateState]
    UPDATE_STATE_OPEN: _ClassVar[UpdateState]
    UPDATE_STATE_COMMITTED: _ClassVar[UpdateState]
UPDATE_STATE_UNSPECIFIED: UpdateState
UPDATE_STATE_OPEN: UpdateState
UPDATE_STATE_COMMITTED: UpdateState

class Update(_message.Message):
    __slots__ = ("batch_id", "update_id", "start_job_id", "n_jobs", "start_job_group_id", "n_job_groups", "state", "created_at", "committed_at")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    START_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    START_JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    N_JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    update_id: int
    start_job_id: int
    n_jobs: int
    start_job_group_id: int
    n_job_groups: int
    state: UpdateState
    created_at: _timestamp_pb2.Timestamp
    committed_at: _timestamp_pb2.Timestamp
    def __init__(self, batch_id: _Optional[int] = ..., update_id: _Optional[int] = ..., start_job_id: _Optional[int] = ..., n_jobs: _Optional[int] = ..., start_job_group_id: _Optional[int] = ..., n_job_groups: _Optional[int] = ..., state: _Optional[_Union[UpdateState, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., committed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...
