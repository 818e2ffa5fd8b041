"""Live parts of the pages, as server-sent events (no polling): a batch's counts, pushed as its event stream
(WatchBatch) says something changed, and a job's log, followed (StreamJobLog) while it runs.

Each stream is the user's own gRPC stream, made with their token; it ends when the batch completes or the job
ends, when the browser goes away, or when the web stops. A quiet stream gets a comment every KEEPALIVE_S so
that no proxy takes it for dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from corral.batch.v1 import batch_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.errors import CorralError
from services.web import views
from services.web.app import BACKEND, path_id, session_of
from services.web.backend import UserCalls

KEEPALIVE_S = 15.0
COALESCE_S = 0.3
"""After an event, how long more events are gathered before the counts are read again: a batch finishing
thousands of jobs a second costs a few reads a second per open page, not one per job."""
RETRY_MS = 10_000
"""How long a browser waits before it reconnects a stream that broke."""
MAX_LOG_CHUNK_CHARS = 64 * 1024


def event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def _open(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    await response.prepare(request)
    await response.write(f"retry: {RETRY_MS}\n\n".encode())
    return response


async def _feed(source: AsyncIterator[Any], queue: asyncio.Queue[object]) -> None:
    """Put each item of `source` on `queue`, then its end (None) or its error."""
    try:
        async for item in source:
            await queue.put(item)
        await queue.put(None)
    except CorralError as e:
        await queue.put(e)


@contextlib.asynccontextmanager
async def _fed(source: AsyncIterator[Any]) -> AsyncIterator[asyncio.Queue[object]]:
    queue: asyncio.Queue[object] = asyncio.Queue(maxsize=1000)
    task = asyncio.create_task(_feed(source, queue))
    try:
        yield queue
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


async def _next(queue: asyncio.Queue[object], response: web.StreamResponse) -> object:
    """The next item of a fed stream, with a keepalive comment to the browser each KEEPALIVE_S until it comes."""
    while True:
        try:
            async with asyncio.timeout(KEEPALIVE_S):  # not wait_for: tests/unit/test_no_wait_for.py says why
                return await queue.get()
        except TimeoutError:
            await response.write(b": keepalive\n\n")


def counts_event(batch: batch_pb2.Batch) -> bytes:
    return event("counts", {"counts": views.counts(batch.counts), "state": views.batch_state(batch),
                            "cost": views.usd(batch.cost_micro_usd),
                            "complete": batch.state == batch_pb2.BATCH_STATE_COMPLETE})


async def _get_batch(calls: UserCalls, request: web.Request, batch_id: int) -> batch_pb2.Batch:
    backend = request.app[BACKEND]
    return (await calls.call(backend.batches.GetBatch, bpb.GetBatchRequest(batch_id=batch_id))).batch


async def batch_counts(request: web.Request) -> web.StreamResponse:
    """The batch's counts now, then again after each burst of its events, until it is complete."""
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = path_id(request, "batch_id")
    batch = await _get_batch(session.calls, request, batch_id)  # NotFound for another's batch: a page
    response = await _open(request)
    await response.write(counts_event(batch))
    if batch.state == batch_pb2.BATCH_STATE_COMPLETE:
        await response.write(event("end", {}))
        return response
    watch = session.calls.stream(backend.batches.WatchBatch, bpb.WatchBatchRequest(
        batch_id=batch_id, from_event_id=batch.last_event_id + 1))
    try:
        async with _fed(watch) as queue:
            while True:
                item = await _next(queue, response)
                if item is None or isinstance(item, CorralError):
                    await response.write(event("gone", {"why": str(item) if item else "the stream ended"}))
                    break
                await asyncio.sleep(COALESCE_S)
                while not queue.empty():
                    queue.get_nowait()
                batch = await _get_batch(session.calls, request, batch_id)
                await response.write(counts_event(batch))
                if batch.state == batch_pb2.BATCH_STATE_COMPLETE:
                    await response.write(event("end", {}))
                    break
    except ConnectionResetError:
        pass  # the browser went away
    return response


async def job_log(request: web.Request) -> web.StreamResponse:
    """A job's log as it is written: one attempt's (?attempt=ID) from byte ?from=N, or the job's, attempt
    after attempt, until it ends."""
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id, job_id = path_id(request, "batch_id"), path_id(request, "job_id")
    attempt_id = request.query.get("attempt", "")[:128]
    try:
        start = int(request.query.get("from", "0"))
    except ValueError:
        raise web.HTTPBadRequest(text="from: a byte offset") from None
    # Checks access first (a refused job is a page, not a stream).
    await session.calls.call(backend.jobs.GetJob, jpb.GetJobRequest(batch_id=batch_id, job_id=job_id))
    response = await _open(request)
    stream = session.calls.stream(backend.jobs.StreamJobLog, jpb.StreamJobLogRequest(
        batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, start_byte=start))
    try:
        async with _fed(stream) as queue:
            while True:
                item = await _next(queue, response)
                if item is None:
                    await response.write(event("end", {"state": ""}))
                    break
                if isinstance(item, CorralError):
                    await response.write(event("gone", {"why": item.message}))
                    break
                assert isinstance(item, jpb.StreamJobLogResponse)
                if item.data:
                    text = item.data.decode("utf-8", "replace")
                    for at in range(0, len(text), MAX_LOG_CHUNK_CHARS):
                        await response.write(event("log", {"text": text[at:at + MAX_LOG_CHUNK_CHARS],
                                                           "attempt": item.attempt_id}))
                elif item.job_state:
                    await response.write(event("end", {"state": views.job_state(item.job_state)}))
                    break
                elif item.attempt_id:
                    await response.write(event("attempt", {"attempt": item.attempt_id, "number": item.attempt_number,
                                                           "instance": item.instance_name}))
    except ConnectionResetError:
        pass
    return response


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/batches/{batch_id}/events", batch_counts)
    router.add_get("/batches/{batch_id}/jobs/{job_id}/log/live", job_log)
