from corral.batch.v1 import batch_pb2 as _batch_pb2
from corral.batch.v1 import batch_event_pb2 as _batch_event_pb2
from corral.batch.v1 import job_group_pb2 as _job_group_pb2
from corral.batch.v1 import job_spec_pb2 as _job_spec_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from corral.batch.v1 import update_pb2 as _update_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HoldChange(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOLD_CHANGE_UNSPECIFIED: _ClassVar[HoldChange]
    HOLD_CHANGE_HELD: _ClassVar[HoldChange]
    HOLD_CHANGE_ALREADY_HELD: _ClassVar[HoldChange]
    HOLD_CHANGE_COMPLETE: _ClassVar[HoldChange]
    HOLD_CHANGE_RELEASED: _ClassVar[HoldChange]
    HOLD_CHANGE_NOT_HELD: _ClassVar[HoldChange]
HOLD_CHANGE_UNSPECIFIED: HoldChange
HOLD_CHANGE_HELD: HoldChange
HOLD_CHANGE_ALREADY_HELD: HoldChange
HOLD_CHANGE_COMPLETE: HoldChange
HOLD_CHANGE_RELEASED: HoldChange
HOLD_CHANGE_NOT_HELD: HoldChange

class CreateBatchRequest(_message.Message):
    __slots__ = ("billing_project", "attributes", "callback_url", "cancel_after_n_failures", "idempotency_token", "n_jobs", "n_job_groups")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_AFTER_N_FAILURES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    N_JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    attributes: _containers.ScalarMap[str, str]
    callback_url: str
    cancel_after_n_failures: int
    idempotency_token: str
    n_jobs: int
    n_job_groups: int
    def __init__(self, billing_project: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., callback_url: _Optional[str] = ..., cancel_after_n_failures: _Optional[int] = ..., idempotency_token: _Optional[str] = ..., n_jobs: _Optional[int] = ..., n_job_groups: _Optional[int] = ...) -> None: ...

class CreateBatchResponse(_message.Message):
    __slots__ = ("batch", "update")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    batch: _batch_pb2.Batch
    update: _update_pb2.Update
    def __init__(self, batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ..., update: _Optional[_Union[_update_pb2.Update, _Mapping]] = ...) -> None: ...

class GetBatchRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    def __init__(self, batch_id: _Optional[int] = ...) -> None: ...

class GetBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _batch_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ...) -> None: ...

class ListBatchesRequest(_message.Message):
    __slots__ = ("query", "page_size", "page_token")
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    query: str
    page_size: int
    page_token: str
    def __init__(self, query: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListBatchesResponse(_message.Message):
    __slots__ = ("batches", "next_page_token")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[_batch_pb2.Batch]
    next_page_token: str
    def __init__(self, batches: _Optional[_Iterable[_Union[_batch_pb2.Batch, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelBatchRequest(_message.Message):
    __slots__ = ("batch_id", "reason")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    reason: str
    def __init__(self, batch_id: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelBatchResponse(_message.Message):
    __slots__ = ("batch",)
    BATCH_FIELD_NUMBER: _ClassVar[int]
    batch: _batch_pb2.Batch
    def __init__(self, batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ...) -> None: ...

class HoldJobsRequest(_message.Message):
    __slots__ = ("batch_id", "job_group_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_group_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...

class HoldJobsResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: HoldChange
    def __init__(self, change: _Optional[_Union[HoldChange, str]] = ...) -> None: ...

class ReleaseJobsRequest(_message.Message):
    __slots__ = ("batch_id", "job_group_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_group_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_group_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...

class ReleaseJobsResponse(_message.Message):
    __slots__ = ("change",)
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    change: HoldChange
    def __init__(self, change: _Optional[_Union[HoldChange, str]] = ...) -> None: ...

class DeleteBatchRequest(_message.Message):
    __slots__ = ("batch_id",)
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    def __init__(self, batch_id: _Optional[int] = ...) -> None: ...

class DeleteBatchResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WatchBatchRequest(_message.Message):
    __slots__ = ("batch_id", "from_event_id", "query", "include_cost_events", "until_complete", "max_events_per_message")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_COST_EVENTS_FIELD_NUMBER: _ClassVar[int]
    UNTIL_COMPLETE_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_PER_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    from_event_id: int
    query: str
    include_cost_events: bool
    until_complete: bool
    max_events_per_message: int
    def __init__(self, batch_id: _Optional[int] = ..., from_event_id: _Optional[int] = ..., query: _Optional[str] = ..., include_cost_events: _Optional[bool] = ..., until_complete: _Optional[bool] = ..., max_events_per_message: _Optional[int] = ...) -> None: ...

class WatchBatchResponse(_message.Message):
    __slots__ = ("event", "events")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    event: _batch_event_pb2.BatchEvent
    events: _containers.RepeatedCompositeFieldContainer[_batch_event_pb2.BatchEvent]
    def __init__(self, event: _Optional[_Union[_batch_event_pb2.BatchEvent, _Mapping]] = ..., events: _Optional[_Iterable[_Union[_batch_event_pb2.BatchEvent, _Mapping]]] = ...) -> None: ...

class CreateUpdateRequest(_message.Message):
    __slots__ = ("batch_id", "n_jobs", "n_job_groups", "idempotency_token")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    N_JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    n_jobs: int
    n_job_groups: int
    idempotency_token: str
    def __init__(self, batch_id: _Optional[int] = ..., n_jobs: _Optional[int] = ..., n_job_groups: _Optional[int] = ..., idempotency_token: _Optional[str] = ...) -> None: ...

class CreateUpdateResponse(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: _update_pb2.Update
    def __init__(self, update: _Optional[_Union[_update_pb2.Update, _Mapping]] = ...) -> None: ...

class CreateJobGroupsRequest(_message.Message):
    __slots__ = ("batch_id", "update_id", "first_index", "job_groups")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    update_id: int
    first_index: int
    job_groups: _containers.RepeatedCompositeFieldContainer[_job_group_pb2.JobGroupSpec]
    def __init__(self, batch_id: _Optional[int] = ..., update_id: _Optional[int] = ..., first_index: _Optional[int] = ..., job_groups: _Optional[_Iterable[_Union[_job_group_pb2.JobGroupSpec, _Mapping]]] = ...) -> None: ...

class CreateJobGroupsResponse(_message.Message):
    __slots__ = ("first_job_group_id",)
    FIRST_JOB_GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    first_job_group_id: int
    def __init__(self, first_job_group_id: _Optional[int] = ...) -> None: ...

class AddJobsRequest(_message.Message):
    __slots__ = ("batch_id", "update_id", "bunch_index", "first_index", "jobs")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    BUNCH_INDEX_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    update_id: int
    bunch_index: int
    first_index: int
    jobs: _containers.RepeatedCompositeFieldContainer[_job_spec_pb2.JobSpec]
    def __init__(self, batch_id: _Optional[int] = ..., update_id: _Optional[int] = ..., bunch_index: _Optional[int] = ..., first_index: _Optional[int] = ..., jobs: _Optional[_Iterable[_Union[_job_spec_pb2.JobSpec, _Mapping]]] = ...) -> None: ...

class AddJobsResponse(_message.Message):
    __slots__ = ("first_job_id", "already_received")
    FIRST_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ALREADY_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    first_job_id: int
    already_received: bool
    def __init__(self, first_job_id: _Optional[int] = ..., already_received: _Optional[bool] = ...) -> None: ...

class CommitUpdateRequest(_message.Message):
    __slots__ = ("batch_id", "update_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    UPDATE_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    update_id: int
    def __init__(self, batch_id: _Optional[int] = ..., update_id: _Optional[int] = ...) -> None: ...

class CommitUpdateResponse(_message.Message):
    __slots__ = ("update", "batch")
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    update: _update_pb2.Update
    batch: _batch_pb2.Batch
    def __init__(self, update: _Optional[_Union[_update_pb2.Update, _Mapping]] = ..., batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("billing_project", "attributes", "callback_url", "cancel_after_n_failures", "idempotency_token", "job_groups", "jobs")
    class AttributesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTES_FIELD_NUMBER: _ClassVar[int]
    CALLBACK_URL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_AFTER_N_FAILURES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    attributes: _containers.ScalarMap[str, str]
    callback_url: str
    cancel_after_n_failures: int
    idempotency_token: str
    job_groups: _containers.RepeatedCompositeFieldContainer[_job_group_pb2.JobGroupSpec]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_spec_pb2.JobSpec]
    def __init__(self, billing_project: _Optional[str] = ..., attributes: _Optional[_Mapping[str, str]] = ..., callback_url: _Optional[str] = ..., cancel_after_n_failures: _Optional[int] = ..., idempotency_token: _Optional[str] = ..., job_groups: _Optional[_Iterable[_Union[_job_group_pb2.JobGroupSpec, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[_job_spec_pb2.JobSpec, _Mapping]]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("batch", "update")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    batch: _batch_pb2.Batch
    update: _update_pb2.Update
    def __init__(self, batch: _Optional[_Union[_batch_pb2.Batch, _Mapping]] = ..., update: _Optional[_Union[_update_pb2.Update, _Mapping]] = ...) -> None: ...

class EstimateBatchRequest(_message.Message):
    __slots__ = ("billing_project", "job_groups", "jobs", "first_index", "n_jobs", "n_job_groups")
    BILLING_PROJECT_FIELD_NUMBER: _ClassVar[int]
    JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    FIRST_INDEX_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    N_JOB_GROUPS_FIELD_NUMBER: _ClassVar[int]
    billing_project: str
    job_groups: _containers.RepeatedCompositeFieldContainer[_job_group_pb2.JobGroupSpec]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_spec_pb2.JobSpec]
    first_index: int
    n_jobs: int
    n_job_groups: int
    def __init__(self, billing_project: _Optional[str] = ..., job_groups: _Optional[_Iterable[_Union[_job_group_pb2.JobGroupSpec, _Mapping]]] = ..., jobs: _Optional[_Iterable[_Union[_job_spec_pb2.JobSpec, _Mapping]]] = ..., first_index: _Optional[int] = ..., n_jobs: _Optional[int] = ..., n_job_groups: _Optional[int] = ...) -> None: ...

class EstimateBatchResponse(_message.Message):
    __slots__ = ("worst_case_micro_usd", "expected_micro_usd", "n_jobs", "n_jobs_from_history", "n_jobs_from_timeout", "limited")
    WORST_CASE_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_MICRO_USD_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FROM_HISTORY_FIELD_NUMBER: _ClassVar[int]
    N_JOBS_FROM_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LIMITED_FIELD_NUMBER: _ClassVar[int]
    worst_case_micro_usd: int
    expected_micro_usd: int
    n_jobs: int
    n_jobs_from_history: int
    n_jobs_from_timeout: int
    limited: bool
    def __init__(self, worst_case_micro_usd: _Optional[int] = ..., expected_micro_usd: _Optional[int] = ..., n_jobs: _Optional[int] = ..., n_jobs_from_history: _Optional[int] = ..., n_jobs_from_timeout: _Optional[int] = ..., limited: _Optional[bool] = ...) -> None: ...

class RerunFailedJobsRequest(_message.Message):
    __slots__ = ("batch_id", "states", "idempotency_token")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_TOKEN_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    states: _containers.RepeatedScalarFieldContainer[_job_state_pb2.JobState]
    idempotency_token: str
    def __init__(self, batch_id: _Optional[int] = ..., states: _Optional[_Iterable[_Union[_job_state_pb2.JobState, str]]] = ..., idempotency_token: _Optional[str] = ...) -> None: ...

class RerunFailedJobsResponse(_message.Message):
    __slots__ = ("update",)
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    update: _update_pb2.Update
    def __init__(self, update: _Optional[_Union[_update_pb2.Update, _Mapping]] = ...) -> None: ...

class ListRegionsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRegionsResponse(_message.Message):
    __slots__ = ("regions", "default_region")
    REGIONS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_REGION_FIELD_NUMBER: _ClassVar[int]
    regions: _containers.RepeatedScalarFieldContainer[str]
    default_region: str
    def __init__(self, regions: _Optional[_Iterable[str]] = ..., default_region: _Optional[str] = ...) -> None: ...
