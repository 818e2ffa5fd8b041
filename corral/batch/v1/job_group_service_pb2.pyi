from corral.batch.v1 import job_group_pb2 as _job_group_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetJobGroupRequest(_message.Message):
    __slots__ = ("batch_id", "job_group_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_group_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ...) -> None: ...

class GetJobGroupResponse(_message.Message):
    __slots__ = ("job_group",)
    JOB_GROUP_FIELD_NUMBER: _ClassVar[int]
    job_group: _job_group_pb2.JobGroup
    def __init__(self, job_group: _Optional[_Union[_job_group_pb2.JobGroup, _Mapping]] = ...) -> None: ...

class ListJobGroupsRequest(_message.Message):
    __slots__ = ("batch_id", "parent_job_group_id", "page_size", "page_token")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    parent_job_group_id: int
    page_size: int
    page_token: str
    def __init__(self, batch_id: _Optional[int] = ..., parent_job_group_id: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListJobGroupsResponse(_message.Message):
    __slots__ = ("job_groups", "next_page_token")
    JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    job_groups: _containers.RepeatedCompositeFieldContainer[_job_group_pb2.JobGroup]
    next_page_token: str
    def __init__(self, job_groups: _Optional[_Iterable[_Union[_job_group_pb2.JobGroup, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelJobGroupRequest(_message.Message):
    __slots__ = ("batch_id", "job_group_id", "reason")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_group_id: int
    reason: str
    def __init__(self, batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelJobGroupResponse(_message.Message):
    __slots__ = ("job_group",)
    JOB_GROUP_FIELD_NUMBER: _ClassVar[int]
    job_group: _job_group_pb2.JobGroup
    def __init__(self, job_group: _Optional[_Union[_job_group_pb2.JobGroup, _Mapping]] = ...) -> None: ...
