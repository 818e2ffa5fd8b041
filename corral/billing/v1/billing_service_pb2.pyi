import datetime

from corral.billing.v1 import billing_project_pb2 as _billing_project_pb2
from corral.billing.v1 import quota_pb2 as _quota_pb2
from corral.billing.v1 import spend_pb2 as _spend_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CreateBillingProjectRequest(_message.Message):
    __slots__ = ("name", "limit_micro_usd", "members")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    limit_micro_usd: int
    members: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., limit_micro_usd: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateBillingProjectResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class GetBillingProjectRequest(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    def __init__(self, billing_project: _Optional[str] = ...) -> None: ...

class GetBillingProjectResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class ListBillingProjectsRequest(_message.Message):
    __slots__ = ("state", "member", "page_size", "page_token")
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    state: _billing_project_pb2.BillingProjectState
    member: str
    page_size: int
    page_token: str
    def __init__(self, state: _Optional[_Union[_billing_project_pb2.BillingProjectState, str]] = ..., member: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBillingProjectsResponse(_message.Message):
    __slots__ = ("billing_projects", "next_page_token")
    BILLING_PROJECTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    billing_projects: _containers.RepeatedCompositeFieldContainer[_billing_project_pb2.BillingProject]
    next_page_token: str
    def __init__(self, billing_projects: _Optional[_Iterable[_Union[_billing_project_pb2.BillingProject, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("billing_project", "username")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    username: str
    def __init__(self, billing_project: _Optional[str] = ..., username: _Optional[str] = ...) -> None: ...

class AddMemberResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("billing_project", "username")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    USERNAME_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    username: str
    def __init__(self, billing_project: _Optional[str] = ..., username: _Optional[str] = ...) -> None: ...

class RemoveMemberResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class SetLimitRequest(_message.Message):
    __slots__ = ("billing_project", "limit_micro_usd", "max_job_duration")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    MAX_JOB_DURATION_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    limit_micro_usd: int
    max_job_duration: _duration_pb2.Duration
    def __init__(self, billing_project: _Optional[str] = ..., limit_micro_usd: _Optional[int] = ..., max_job_duration: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class SetLimitResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class CloseBillingProjectRequest(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    def __init__(self, billing_project: _Optional[str] = ...) -> None: ...

class CloseBillingProjectResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class ReopenBillingProjectRequest(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    def __init__(self, billing_project: _Optional[str] = ...) -> None: ...

class ReopenBillingProjectResponse(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: _billing_project_pb2.BillingProject
    def __init__(self, billing_project: _Optional[_Union[_billing_project_pb2.BillingProject, _Mapping]] = ...) -> None: ...

class DeleteBillingProjectRequest(_message.Message):
    __slots__ = ("billing_project",)
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    def __init__(self, billing_project: _Optional[str] = ...) -> None: ...

class DeleteBillingProjectResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSpendRequest(_message.Message):
    __slots__ = ("billing_project", "first_day", "last_day", "breakdown", "page_size", "page_token")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    FIRST_DAY_FIELD_NUMBER: _ClassVar[int]
    LAST_DAY_FIELD_NUMBER: _ClassVar[int]
    BREAKDOWN_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    first_day: str
    last_day: str
    breakdown: _spend_pb2.SpendBreakdown
    page_size: int
    page_token: str
    def __init__(self, billing_project: _Optional[str] = ..., first_day: _Optional[str] = ..., last_day: _Optional[str] = ..., breakdown: _Optional[_Union[_spend_pb2.SpendBreakdown, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class GetSpendResponse(_message.Message):
    __slots__ = ("total_micro_usd", "lines", "next_page_token", "reservations")
    TOTAL_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    total_micro_usd: int
    lines: _containers.RepeatedCompositeFieldContainer[_spend_pb2.SpendLine]
    next_page_token: str
    reservations: _containers.RepeatedCompositeFieldContainer[_spend_pb2.Reservation]
    def __init__(self, total_micro_usd: _Optional[int] = ..., lines: _Optional[_Iterable[_Union[_spend_pb2.SpendLine, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., reservations: _Optional[_Iterable[_Union[_spend_pb2.Reservation, _Mapping]]] = ...) -> None: ...

class WatchSpendRequest(_message.Message):
    __slots__ = ("billing_project", "min_interval")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    min_interval: _duration_pb2.Duration
    def __init__(self, billing_project: _Optional[str] = ..., min_interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class WatchSpendResponse(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: _spend_pb2.SpendUpdate
    def __init__(self, update: _Optional[_Union[_spend_pb2.SpendUpdate, _Mapping]] = ...) -> None: ...

class SetQuotaRequest(_message.Message):
    __slots__ = ("kind", "name", "max_running_cores_mcpu", "max_running_jobs", "max_ready_jobs", "weight")
    KIND_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_CORES_MCPU_FIELD_NUMBER: _ClassVar[int]
    MAX_RUNNING_JOBS_FIELD_NUMBER: _ClassVar[int]
    MAX_READY_JOBS_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    kind: _quota_pb2.QuotaKind
    name: str
    max_running_cores_mcpu: int
    max_running_jobs: int
    max_ready_jobs: int
    weight: int
    def __init__(self, kind: _Optional[_Union[_quota_pb2.QuotaKind, str]] = ..., name: _Optional[str] = ..., max_running_cores_mcpu: _Optional[int] = ..., max_running_jobs: _Optional[int] = ..., max_ready_jobs: _Optional[int] = ..., weight: _Optional[int] = ...) -> None: ...

class SetQuotaResponse(_message.Message):
    __slots__ = ("quota",)
    QUOTA_FIELD_NUMBER: _ClassVar[int]
    quota: _quota_pb2.Quota
    def __init__(self, quota: _Optional[_Union[_quota_pb2.Quota, _Mapping]] = ...) -> None: ...

class ListQuotasRequest(_message.Message):
    __slots__ = ("kind", "page_size", "page_token")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    kind: _quota_pb2.QuotaKind
    page_size: int
    page_token: str
    def __init__(self, kind: _Optional[_Union[_quota_pb2.QuotaKind, str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListQuotasResponse(_message.Message):
    __slots__ = ("quotas", "next_page_token")
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    quotas: _containers.RepeatedCompositeFieldContainer[_quota_pb2.Quota]
    next_page_token: str
    def __init__(self, quotas: _Optional[_Iterable[_Union[_quota_pb2.Quota, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
