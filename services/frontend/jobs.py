"""JobService: reading committed jobs, their attempts and logs, and why they wait.

Every RPC first resolves the batch through `services.frontend.access`
(NOT_FOUND for no such batch and for one outside the caller's billing
projects alike), then the job (NOT_FOUND unless committed). Logs come
from the worker while the attempt runs and from storage once it ended
(`services.frontend.logs`), and StreamJobLog without an attempt id follows
the job from before it starts to its end (`services.frontend.log_follow`);
an attempt's usage series from storage once it ended, from the worker while
it runs (`services.frontend.usage`).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from corral.batch.v1 import job_service_pb2_grpc
from corral.batch.v1 import job_service_pb2 as pb
from services.common.errors import FieldViolation, InvalidRequest, NotFound
from services.common.identity import current_principal
from services.db.store import wall_clock_ms
from services.frontend import query as query_language
from services.frontend.access import readable_batch
from services.frontend.batch_store import BatchStore
from services.frontend.explain import explain
from services.frontend.explain_store import ExplainStore
from services.frontend.job_protos import (
    attempt_proto,
    explanation_proto,
    job_proto,
    normalized_image,
    resolved_spec,
)
from services.frontend.job_changes import JobChanges, live_address
from services.frontend.job_store import JobReadStore
from services.frontend.limits import Limits
from services.frontend.log_follow import JobLogFollower
from services.frontend.logs import (
    DEFAULT_MAX_BYTES,
    MAX_MAX_BYTES,
    LogChunk,
    LogUnavailable,
    StoredLogs,
    WorkerLogs,
    step_name,
)
from services.common.specs import SpecStore
from services.frontend.usage import StoredUsage, check_attempt_id, live_response, usage_response

log = logging.getLogger(__name__)

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
# A worker that no longer has the attempt (it finished and was forgotten) or
# cannot be reached: the log may be in storage by now.
_TRY_STORAGE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def page_size(requested: int) -> int:
    """0 means the default; more than the cap is the cap; negative is refused."""
    if requested < 0:
        raise InvalidRequest(FieldViolation("page_size", "must not be negative"))
    return min(requested or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)


def decode_page_token(token: str) -> int:
    """The last id of the previous page (0 before the first)."""
    if not token:
        return 0
    try:
        return int(base64.urlsafe_b64decode(token.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest(FieldViolation("page_token", "not a token this service returned")) from None


def encode_page_token(last_id: int) -> str:
    return base64.urlsafe_b64encode(str(last_id).encode()).decode()


class JobServicer(job_service_pb2_grpc.JobServiceServicer):
    """See the module docstring."""

    def __init__(self, batches: BatchStore, jobs: JobReadStore, explanations: ExplainStore, specs: SpecStore,
                 stored_logs: StoredLogs, worker_logs: WorkerLogs, clock_ms: Callable[[], int] = wall_clock_ms,
                 limits: Limits = Limits(), stored_usage: StoredUsage | None = None,
                 changes: JobChanges | None = None):
        self.batches = batches
        self.limits = limits
        self.jobs = jobs
        self.explanations = explanations
        self.specs = specs
        self.stored_logs = stored_logs
        self.stored_usage = stored_usage or StoredUsage(stored_logs.root_url)
        self.worker_logs = worker_logs
        self.clock_ms = clock_ms
        # One JobChanges per frontend (the app's) serves every stream that waits on a job.
        self.follower = JobLogFollower(batches, jobs, stored_logs, worker_logs, changes or JobChanges(jobs.db))

    async def _job(self, batch_id: int, job_id: int) -> dict[str, Any]:
        await readable_batch(self.batches, batch_id, current_principal())
        row = await self.jobs.get_job(batch_id, job_id)
        if row is None:
            raise NotFound(f"no job {job_id} in batch {batch_id}")
        return row

    async def _attempt(self, job: dict[str, Any], attempt_id: str, wanted: str = "log") -> dict[str, Any]:
        attempt_id = attempt_id or job["attempt_id"] or ""
        if not attempt_id:
            raise NotFound(f"job {job['job_id']} of batch {job['batch_id']} has not run yet: no {wanted}")
        row = await self.jobs.attempt(job["batch_id"], job["job_id"], attempt_id)
        if row is None:
            raise NotFound(f"no attempt {attempt_id} of job {job['job_id']} in batch {job['batch_id']}")
        return row

    @staticmethod
    def _live_address(attempt: dict[str, Any]) -> str | None:
        """The worker to ask while the attempt runs on an active instance."""
        return live_address(attempt)

    async def GetJob(self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext) -> pb.GetJobResponse:
        row = await self._job(request.batch_id, request.job_id)
        attributes = (await self.jobs.attributes(request.batch_id, [request.job_id]))[request.job_id]
        job = job_proto(row, attributes)
        if row["spec_ref"]:
            try:
                spec = await self.specs.read(row["spec_ref"])
                job.spec.CopyFrom(resolved_spec(spec, row["job_group_id"],
                                                await self.jobs.parents(request.batch_id, request.job_id)))
                job.normalized_image = normalized_image(spec.image)
            except FileNotFoundError:
                log.warning("spec of job %d/%d is missing at %s", request.batch_id, request.job_id, row["spec_ref"])
        job.attempts.extend(attempt_proto(a) for a in await self.jobs.attempts(request.batch_id, request.job_id))
        return pb.GetJobResponse(job=job)

    async def ListJobs(self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext) -> pb.ListJobsResponse:
        limit = page_size(request.page_size)
        after = decode_page_token(request.page_token)
        try:
            where, params = query_language.to_sql(query_language.parse(
                request.query, "jobs", self.limits.max_query_bytes, self.limits.max_query_terms))
        except query_language.QuerySyntaxError as e:
            raise InvalidRequest(FieldViolation("query", e.description)) from None
        await readable_batch(self.batches, request.batch_id, current_principal())
        rows = await self.jobs.list_jobs(request.batch_id, where, params, after, limit)
        ids = [r["job_id"] for r in rows]
        attributes = await self.jobs.attributes(request.batch_id, ids)
        jobs = [job_proto(r, attributes[r["job_id"]]) for r in rows]
        if request.with_parents:
            parents = await self.jobs.parent_ids(request.batch_id, ids)
            for job in jobs:
                job.parent_job_ids.extend(parents[job.job_id])
        if request.with_attempts:
            attempts = await self.jobs.page_attempts(request.batch_id, ids)
            for job in jobs:
                job.attempts.extend(attempt_proto(a) for a in attempts[job.job_id])
        return pb.ListJobsResponse(
            jobs=jobs, next_page_token=encode_page_token(rows[-1]["job_id"]) if len(rows) == limit else "")

    async def GetJobAttempts(self, request: pb.GetJobAttemptsRequest, context: grpc.aio.ServicerContext
                             ) -> pb.GetJobAttemptsResponse:
        await self._job(request.batch_id, request.job_id)
        attempts = await self.jobs.attempts(request.batch_id, request.job_id)
        return pb.GetJobAttemptsResponse(attempts=[attempt_proto(a) for a in attempts])

    @staticmethod
    def _check_log_request(step: int, max_bytes: int | None = None) -> None:
        violations = []
        try:
            step_name(step)
        except KeyError:
            violations.append(FieldViolation("step", "unknown step"))
        if max_bytes is not None and max_bytes < 0:
            violations.append(FieldViolation("max_bytes", "must not be negative"))
        if violations:
            raise InvalidRequest(violations)

    async def GetJobLog(self, request: pb.GetJobLogRequest, context: grpc.aio.ServicerContext
                        ) -> pb.GetJobLogResponse:
        self._check_log_request(request.step, request.max_bytes)
        max_bytes = min(request.max_bytes or DEFAULT_MAX_BYTES, MAX_MAX_BYTES)
        job = await self._job(request.batch_id, request.job_id)
        attempt = await self._attempt(job, request.attempt_id)
        key = (request.batch_id, request.job_id, attempt["attempt_id"], request.step)
        chunk: LogChunk | None = None
        unreachable = False
        address = self._live_address(attempt)
        if address is not None:
            try:
                chunk = await self.worker_logs.read(address, *key, request.start_byte, max_bytes)
            except grpc.aio.AioRpcError as e:
                if e.code() not in _TRY_STORAGE:
                    raise LogUnavailable(f"worker {attempt['instance_name']}: {e.details()}") from None
                unreachable = e.code() != grpc.StatusCode.NOT_FOUND
        if chunk is None:
            chunk = await self.stored_logs.read(*key, request.start_byte, max_bytes)
        if chunk is None:
            self._no_log(attempt, request.step, unreachable)
        assert chunk is not None
        return pb.GetJobLogResponse(attempt_id=attempt["attempt_id"], data=chunk.data, start_byte=chunk.start_byte,
                                    total_bytes=chunk.total_bytes, complete=chunk.complete)

    async def StreamJobLog(self, request: pb.StreamJobLogRequest, context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[pb.StreamJobLogResponse]:
        self._check_log_request(request.step)
        job = await self._job(request.batch_id, request.job_id)
        if not request.attempt_id:  # the job's log, waiting for it to start, through every attempt to its end
            async for message in self.follower.follow(request.batch_id, request.job_id, request.step,
                                                      request.start_byte, current_principal()):
                yield message
            return
        attempt = await self._attempt(job, request.attempt_id)
        attempt_id = attempt["attempt_id"]
        ids = [a["attempt_id"] for a in await self.jobs.attempts(request.batch_id, request.job_id)]
        which = {"attempt_number": ids.index(attempt_id) + 1, "instance_name": attempt["instance_name"] or ""}
        key = (request.batch_id, request.job_id, attempt_id, request.step)
        offset, sent, unreachable = request.start_byte, False, False
        address = self._live_address(attempt)
        if address is not None:
            try:
                async for chunk in self.worker_logs.follow(address, *key, offset):
                    yield pb.StreamJobLogResponse(attempt_id=attempt_id, data=chunk.data, start_byte=chunk.start_byte,
                                                  **which)
                    offset, sent = chunk.start_byte + len(chunk.data), True
                return
            except grpc.aio.AioRpcError as e:
                # The worker went away mid-stream, or forgot the attempt: go on from storage.
                if e.code() not in _TRY_STORAGE:
                    raise LogUnavailable(f"worker {attempt['instance_name']}: {e.details()}") from None
                unreachable = e.code() != grpc.StatusCode.NOT_FOUND
        found = False
        async for chunk in self.stored_logs.chunks(*key, offset):
            found = True
            yield pb.StreamJobLogResponse(attempt_id=attempt_id, data=chunk.data, start_byte=chunk.start_byte,
                                          **which)
        if not (found or sent or await self.stored_logs.read(*key, offset, 0) is not None):
            self._no_log(attempt, request.step, unreachable)

    @staticmethod
    def _no_log(attempt: dict[str, Any], step: int, unreachable: bool) -> None:
        """Raise for a log neither the worker nor storage has."""
        if unreachable:
            raise LogUnavailable(f"the worker {attempt['instance_name']} running attempt {attempt['attempt_id']} "
                                 "cannot be reached for its log")
        raise NotFound(f"no {step_name(step)} log of attempt {attempt['attempt_id']} (job {attempt['job_id']} of "
                       f"batch {attempt['batch_id']}) yet")

    async def GetAttemptUsage(self, request: pb.GetAttemptUsageRequest, context: grpc.aio.ServicerContext
                              ) -> pb.GetAttemptUsageResponse:
        check_attempt_id(request.attempt_id)
        job = await self._job(request.batch_id, request.job_id)
        attempt = await self._attempt(job, request.attempt_id, "usage")
        key = (request.batch_id, request.job_id, attempt["attempt_id"])
        address = self._live_address(attempt)
        if address is not None:  # running: the series so far is on its worker
            try:
                return live_response(attempt, await self.worker_logs.usage(address, *key))
            except grpc.aio.AioRpcError as e:
                if e.code() not in _TRY_STORAGE:
                    raise LogUnavailable(f"worker {attempt['instance_name']}: {e.details()}") from None
        series = None
        if attempt["end_time_ms"] is not None or address is not None:  # it may have ended since we read it
            series = await self.stored_usage.read(*key)
        return usage_response(attempt, series)

    async def ExplainJob(self, request: pb.ExplainJobRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ExplainJobResponse:
        job = await self._job(request.batch_id, request.job_id)
        parents = await self.jobs.parents(request.batch_id, request.job_id)
        locks = await self.jobs.locks(request.batch_id, request.job_id)
        facts = await self.explanations.facts(job, parents, locks)
        return pb.ExplainJobResponse(explanation=explanation_proto(
            request.batch_id, request.job_id, job["state"], explain(facts), self.clock_ms()))

