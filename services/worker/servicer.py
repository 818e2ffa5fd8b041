"""WorkerService: what a worker tells other corral services about itself.

Served on the worker's own mutual-TLS listener, whose host:port the driver
records in `instances.ip_address`. Its callers are corral services: the
frontend reads the logs of running attempts here (finished ones it reads
from storage), the driver and operators its status. Other workers have
certificates from the same CA but no business here, so they are refused.
Logs are those of the attempts in the worker's `AttemptTable`: running, or
ended within its retention time; anything else is NOT_FOUND.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator

import grpc

from corral.batch.v1 import job_pb2
from corral.worker.v1 import worker_service_pb2 as pb
from corral.worker.v1 import worker_service_pb2_grpc, worker_status_pb2
from services.common.errors import FieldViolation, InvalidRequest, NotFound, PermissionDenied
from services.common.identity import current_principal
from services.common.usage_protos import interval_proto, sample_proto
from services.worker.agent import Worker
from services.worker.attempts import Attempt, timestamp
from services.worker.images import ImageCache

DEFAULT_LOG_BYTES = 2**20
MAX_LOG_BYTES = 4 * 2**20
STREAM_CHUNK_BYTES = 64 * 2**10
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


class WorkerServicer(worker_service_pb2_grpc.WorkerServiceServicer):
    """See the module docstring."""

    def __init__(self, worker: Worker, images: ImageCache):
        self._worker = worker
        self._images = images

    @staticmethod
    def _authorize() -> None:
        principal = current_principal()
        principal.require_service()
        if principal.name.startswith("worker-"):
            raise PermissionDenied("workers do not read each other's status or logs")

    def _attempt(self, batch_id: int, job_id: int, attempt_id: str, step: int) -> Attempt:
        if not attempt_id:
            raise InvalidRequest(FieldViolation("attempt_id", "required: the worker may hold several attempts"))
        if step not in (job_pb2.JOB_STEP_UNSPECIFIED, job_pb2.JOB_STEP_MAIN):
            raise NotFound(f"no {job_pb2.JobStep.Name(step)} log: this worker keeps the main command's log only")
        attempt = self._worker.attempts.get((batch_id, job_id, attempt_id))
        if attempt is None:
            raise NotFound(f"attempt {attempt_id} of job {batch_id}/{job_id} is not on this worker "
                           "(never, or ended too long ago: read its log from storage)")
        return attempt

    async def GetStatus(self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
                        ) -> pb.GetStatusResponse:
        self._authorize()
        worker, config = self._worker, self._worker.config
        reserved = worker.attempts.reserved()
        running = []
        for a in worker.attempts.running():
            item = worker_status_pb2.RunningAttempt(
                batch_id=a.ref.batch_id, job_id=a.ref.job_id, attempt_id=a.ref.attempt_id,
                step=job_pb2.JOB_STEP_MAIN, cores_mcpu=a.run.cores_mcpu, memory_bytes=a.run.memory_bytes)
            if a.started_ms is not None:
                item.started_at.CopyFrom(timestamp(a.started_ms))
            running.append(item)
        return pb.GetStatusResponse(
            instance_name=config.instance_name, version=worker.version,
            runtime_kind=worker_status_pb2.RUNTIME_KIND_OCI if worker.runtime.isolates
            else worker_status_pb2.RUNTIME_KIND_PROCESS,
            isolated=worker.runtime.isolates, cores_mcpu=config.cores_mcpu,
            free_cores_mcpu=max(0, config.cores_mcpu - reserved.cores_mcpu), memory_bytes=config.memory_bytes,
            free_memory_bytes=max(0, config.memory_bytes - reserved.memory_bytes), storage_bytes=worker.storage_bytes,
            free_storage_bytes=max(0, worker.storage_bytes - reserved.storage_bytes), running_attempts=running,
            draining=worker.draining,
            connected=worker.connected, started_at=timestamp(worker.started_at_ms))

    async def GetJobLog(self, request: pb.GetJobLogRequest, context: grpc.aio.ServicerContext
                        ) -> pb.GetJobLogResponse:
        self._authorize()
        if request.max_bytes < 0:
            raise InvalidRequest(FieldViolation("max_bytes", "must not be negative"))
        attempt = self._attempt(request.batch_id, request.job_id, request.attempt_id, request.step)
        # Read `closed` first: bytes written after it are then at worst reported as not complete yet.
        complete = attempt.log.closed
        total = _size(attempt)
        start = _start(request.start_byte, total)
        data = attempt.log.read(start, min(request.max_bytes or DEFAULT_LOG_BYTES, MAX_LOG_BYTES))
        return pb.GetJobLogResponse(data=data, start_byte=start, total_bytes=max(total, start + len(data)),
                                    complete=complete)

    async def StreamJobLog(self, request: pb.StreamJobLogRequest, context: grpc.aio.ServicerContext
                           ) -> AsyncIterator[pb.StreamJobLogResponse]:
        self._authorize()
        attempt = self._attempt(request.batch_id, request.job_id, request.attempt_id, request.step)
        offset = _start(request.start_byte, _size(attempt))
        async for data in attempt.log.follow(offset, STREAM_CHUNK_BYTES):
            yield pb.StreamJobLogResponse(data=data, start_byte=offset)
            offset += len(data)

    async def GetAttemptUsage(self, request: pb.GetAttemptUsageRequest, context: grpc.aio.ServicerContext
                              ) -> pb.GetAttemptUsageResponse:
        self._authorize()
        attempt = self._attempt(request.batch_id, request.job_id, request.attempt_id, job_pb2.JOB_STEP_MAIN)
        samples = attempt.usage.samples
        if attempt.usage.latest is not None and attempt.usage.latest not in samples[-1:]:
            samples.append(attempt.usage.latest)  # what the heartbeat reported too: the freshest reading
        return pb.GetAttemptUsageResponse(
            samples=[sample_proto(s) for s in samples],
            interval=interval_proto(attempt.usage_interval_ms if attempt.usage.sampled else 0),
            runtime=self._worker.runtime.name, note=self._worker.runtime.usage_note, complete=not attempt.running)

    async def ListImages(self, request: pb.ListImagesRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListImagesResponse:
        self._authorize()
        if request.page_size < 0:
            raise InvalidRequest(FieldViolation("page_size", f"between 0 and {MAX_PAGE_SIZE}"))
        after = _page_after(request.page_token)
        page_size = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        # One entry per reference an image was pulled as, in (reference, digest) order: the page token's.
        images = {image.digest: image for image in self._images.held()}
        rows = sorted((reference, image.digest) for image in images.values() for reference in image.references)
        rows = [row for row in rows if after is None or row > after]
        page = rows[:page_size]
        cached = [worker_status_pb2.CachedImage(reference=reference, digest=digest,
                                                size_bytes=images[digest].size_bytes,
                                                pulled_at=timestamp(images[digest].pulled_at_ms),
                                                last_used_at=timestamp(images[digest].last_used_at_ms))
                  for reference, digest in page]
        token = _page_token(page[-1]) if len(rows) > page_size else ""
        return pb.ListImagesResponse(images=cached, next_page_token=token)


def _page_token(last: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(last).encode()).decode()


def _page_after(token: str) -> tuple[str, str] | None:
    """The last (reference, digest) of the previous page, from its token (None: the first page)."""
    if not token:
        return None
    try:
        reference, digest = json.loads(base64.urlsafe_b64decode(token.encode()))
        if isinstance(reference, str) and isinstance(digest, str):
            return reference, digest
    except (ValueError, TypeError):
        pass
    raise InvalidRequest(FieldViolation("page_token", "not a token this service returned"))


def _size(attempt: Attempt) -> int:
    try:
        return attempt.log.path.stat().st_size
    except FileNotFoundError:
        return 0


def _start(start_byte: int, total: int) -> int:
    """A request's start offset: negative counts from the end; clamped to the log."""
    return max(0, total + start_byte) if start_byte < 0 else start_byte
