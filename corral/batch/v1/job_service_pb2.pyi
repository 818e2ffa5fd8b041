import datetime

from corral.batch.v1 import job_pb2 as _job_pb2
from corral.batch.v1 import job_explanation_pb2 as _job_explanation_pb2
from corral.batch.v1 import job_state_pb2 as _job_state_pb2
from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetJobRequest(_message.Message):
    __slots__ = ("batch_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...

class GetJobResponse(_message.Message):
    __slots__ = ("job",)
    JOB_FIELD_NUMBER: _ClassVar[int]
    job: _job_pb2.Job
    def __init__(self, job: _Optional[_Union[_job_pb2.Job, _Mapping]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ("batch_id", "query", "page_size", "page_token", "with_parents", "with_attempts")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WITH_PARENTS_FIELD_NUMBER: _ClassVar[int]
    WITH_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    query: str
    page_size: int
    page_token: str
    with_parents: bool
    with_attempts: bool
    def __init__(self, batch_id: _Optional[int] = ..., query: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., with_parents: _Optional[bool] = ..., with_attempts: _Optional[bool] = ...) -> None: ...

class ListJobsResponse(_message.Message):
    __slots__ = ("jobs", "next_page_token")
    JOBS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[_job_pb2.Job]
    next_page_token: str
    def __init__(self, jobs: _Optional[_Iterable[_Union[_job_pb2.Job, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetJobAttemptsRequest(_message.Message):
    __slots__ = ("batch_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...

class GetJobAttemptsResponse(_message.Message):
    __slots__ = ("attempts",)
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    attempts: _containers.RepeatedCompositeFieldContainer[_job_pb2.Attempt]
    def __init__(self, attempts: _Optional[_Iterable[_Union[_job_pb2.Attempt, _Mapping]]] = ...) -> None: ...

class GetJobLogRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id", "step", "start_byte", "max_bytes")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    step: _job_pb2.JobStep
    start_byte: int
    max_bytes: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step: _Optional[_Union[_job_pb2.JobStep, str]] = ..., start_byte: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class GetJobLogResponse(_message.Message):
    __slots__ = ("attempt_id", "data", "start_byte", "total_bytes", "complete")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    data: bytes
    start_byte: int
    total_bytes: int
    complete: bool
    def __init__(self, attempt_id: _Optional[str] = ..., data: _Optional[bytes] = ..., start_byte: _Optional[int] = ..., total_bytes: _Optional[int] = ..., complete: _Optional[bool] = ...) -> None: ...

class StreamJobLogRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id", "step", "start_byte")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    step: _job_pb2.JobStep
    start_byte: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ..., step: _Optional[_Union[_job_pb2.JobStep, str]] = ..., start_byte: _Optional[int] = ...) -> None: ...

class StreamJobLogResponse(_message.Message):
    __slots__ = ("attempt_id", "data", "start_byte", "attempt_number", "instance_name", "job_state")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    START_BYTE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_NUMBER_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_NAME_FIELD_NUMBER: _ClassVar[int]
    JOB_STATE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    data: bytes
    start_byte: int
    attempt_number: int
    instance_name: str
    job_state: _job_state_pb2.JobState
    def __init__(self, attempt_id: _Optional[str] = ..., data: _Optional[bytes] = ..., start_byte: _Optional[int] = ..., attempt_number: _Optional[int] = ..., instance_name: _Optional[str] = ..., job_state: _Optional[_Union[_job_state_pb2.JobState, str]] = ...) -> None: ...

class GetAttemptUsageRequest(_message.Message):
    __slots__ = ("batch_id", "job_id", "attempt_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    attempt_id: str
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ..., attempt_id: _Optional[str] = ...) -> None: ...

class GetAttemptUsageResponse(_message.Message):
    __slots__ = ("attempt_id", "samples", "summary", "complete", "interval", "runtime", "note")
    ATTEMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    attempt_id: str
    samples: _containers.RepeatedCompositeFieldContainer[_job_pb2.UsageSample]
    summary: _job_pb2.ResourceUsage
    complete: bool
    interval: _duration_pb2.Duration
    runtime: str
    note: str
    def __init__(self, attempt_id: _Optional[str] = ..., samples: _Optional[_Iterable[_Union[_job_pb2.UsageSample, _Mapping]]] = ..., summary: _Optional[_Union[_job_pb2.ResourceUsage, _Mapping]] = ..., complete: _Optional[bool] = ..., interval: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., runtime: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ExplainJobRequest(_message.Message):
    __slots__ = ("batch_id", "job_id")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    batch_id: int
    job_id: int
    def __init__(self, batch_id: _Optional[int] = ..., job_id: _Optional[int] = ...) -> None: ...

class ExplainJobResponse(_message.Message):
    __slots__ = ("explanation",)
    EXPLANATION_FIELD_NUMBER: _ClassVar[int]
    explanation: _job_explanation_pb2.JobExplanation
    def __init__(self, explanation: _Optional[_Union[_job_explanation_pb2.JobExplanation, _Mapping]] = ...) -> None: ...
