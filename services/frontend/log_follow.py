"""StreamJobLog without an attempt id: a job's log followed from before it starts until it is final.

The stream starts at the job's latest attempt, or, for a job that has not
run yet, sends an empty message (neither attempt nor data) and waits for
its first. Each attempt it follows begins with a message without data
naming the attempt (its number and worker), then carries the attempt's
log: from its worker while it runs there, from storage once it ended
(`services.frontend.logs`; never before, when an upload could be under
way). A worker that does not have the attempt yet (it is still starting
it) or cannot be reached is asked again when the job changes or every
`retry_s`. A worker's stream that goes on `end_grace_s` after the
attempt's end is recorded (its machine vanished without closing the
connection) is left for storage; an attempt that ended without a stored
log (its worker was lost) has nothing more to send. Then the stream goes
on with each later attempt (a retry) and, once the job is succeeded,
failed, error or cancelled, ends with a message carrying that state
(without an attempt id for a job that never ran).

Waiting reads nothing of its own: `services.frontend.job_changes` reads
every waiting job once a period. Every `recheck_access_s` of waiting the
caller's right to read the batch is checked again, as WatchBatch does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from corral.batch.v1 import job_service_pb2 as pb
from corral.batch.v1 import job_state_pb2
from services.common.identity import Principal
from services.frontend.access import readable_batch
from services.frontend.batch_store import BatchStore
from services.frontend.job_changes import FINAL_STATES, JobChanges, Snapshot, live_address
from services.frontend.job_store import JobReadStore
from services.frontend.logs import LogChunk, LogUnavailable, StoredLogs, WorkerLogs

DEFAULT_RETRY_S = 1.0
"""How often a worker that does not have a running attempt's log yet is asked again."""
END_GRACE_S = 5.0
"""How long a worker's log stream may go on after its attempt's end is recorded before the rest of the log is
read from storage. The stream normally ends first: the worker closes the log, uploads it, then reports."""
RECHECK_ACCESS_S = 5.0
"""How often a waiting stream re-checks that the caller may still see the batch."""
# A worker that does not have the attempt (not yet, or no longer) or cannot be reached: it may have it
# soon, or storage once the attempt ended.
TRY_AGAIN = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)

FINAL_PROTO_STATES = {
    "Success": job_state_pb2.JOB_STATE_SUCCEEDED, "Failed": job_state_pb2.JOB_STATE_FAILED,
    "Error": job_state_pb2.JOB_STATE_ERROR, "Cancelled": job_state_pb2.JOB_STATE_CANCELLED,
}


class JobLogFollower:
    """Serves StreamJobLog without an attempt id for the JobServicer."""

    def __init__(self, batches: BatchStore, jobs: JobReadStore, stored_logs: StoredLogs, worker_logs: WorkerLogs,
                 changes: JobChanges, retry_s: float = DEFAULT_RETRY_S, recheck_access_s: float = RECHECK_ACCESS_S,
                 end_grace_s: float = END_GRACE_S, clock_s: Callable[[], float] = time.monotonic):
        self.batches = batches
        self.jobs = jobs
        self.stored_logs = stored_logs
        self.worker_logs = worker_logs
        self.changes = changes
        self.retry_s = retry_s
        self.recheck_access_s = recheck_access_s
        self.end_grace_s = end_grace_s
        self._clock_s = clock_s

    async def follow(self, batch_id: int, job_id: int, step: int, start_byte: int, principal: Principal
                     ) -> AsyncIterator[pb.StreamJobLogResponse]:
        """The job's log, attempt after attempt, until the job is final (see the module docstring)."""
        access = _Access(self.batches, self.changes, batch_id, principal, self.recheck_access_s, self._clock_s)
        snapshot = await self.changes.now(batch_id, job_id)
        followed: str | None = None
        offset = start_byte
        said_waiting = False
        while snapshot is not None:
            attempts = await self.jobs.attempts(batch_id, job_id)  # oldest first, the job's current one last
            ids = [a["attempt_id"] for a in attempts]
            # The latest attempt at first; afterwards every attempt after the one followed, so that one that
            # began and ended while the last one was being sent is not skipped.
            first = max(len(attempts) - 1, 0) if followed is None else ids.index(followed) + 1
            for number, attempt in enumerate(attempts[first:], start=first + 1):
                yield pb.StreamJobLogResponse(attempt_id=attempt["attempt_id"], attempt_number=number,
                                              instance_name=attempt["instance_name"] or "")
                async for message in self._attempt_log(attempt, number, step, offset, snapshot, access):
                    yield message
                followed, offset = attempt["attempt_id"], 0
            if attempts[first:]:
                snapshot = await self.changes.now(batch_id, job_id)  # a retry may have begun meanwhile
                continue
            if snapshot["state"] in FINAL_STATES:
                yield pb.StreamJobLogResponse(attempt_id=followed or "",
                                              job_state=FINAL_PROTO_STATES[snapshot["state"]])
                return
            if followed is None and not said_waiting:
                # Neither an attempt nor data: the job has not run yet, and the stream waits for it.
                yield pb.StreamJobLogResponse()
                said_waiting = True
            snapshot = await access.wait(job_id, snapshot, self.recheck_access_s)

    async def _attempt_log(self, attempt: dict[str, Any], number: int, step: int, offset: int, job: Snapshot,
                           access: _Access) -> AsyncIterator[pb.StreamJobLogResponse]:
        """One attempt's log from `offset` until it is complete, or until the attempt ended without one.
        `job` is the job as last seen, for waiting on its changes."""
        key = (attempt["batch_id"], attempt["job_id"], attempt["attempt_id"], step)
        where: dict[str, Any] = attempt
        while True:
            address = live_address(where)
            if address is not None:
                try:
                    async for chunk in self._worker_chunks(address, key, offset, attempt, job, access):
                        if chunk is None:  # the worker's stream outlived the attempt: the rest is in storage
                            where = await self._attempt_now(attempt, None)
                            break
                        yield self._message(attempt, number, chunk.data, chunk.start_byte)
                        offset = chunk.start_byte + len(chunk.data)
                    else:
                        return  # the worker's stream ends with the step's log
                except grpc.aio.AioRpcError as e:
                    if e.code() not in TRY_AGAIN:
                        raise LogUnavailable(f"worker {attempt['instance_name']}: {e.details()}") from None
            if where["end_time_ms"] is not None:
                # Storage only once the attempt ended: its worker uploads the whole log before it reports the
                # end (a log read before could be half uploaded); a lost worker's attempt has none.
                async for chunk in self.stored_logs.chunks(*key, offset):
                    yield self._message(attempt, number, chunk.data, chunk.start_byte)
                    offset = chunk.start_byte + len(chunk.data)
                return
            job = await access.wait(attempt["job_id"], job, self.retry_s)
            where = await self._attempt_now(attempt, job)

    async def _worker_chunks(self, address: str, key: tuple[int, int, str, int], offset: int,
                             attempt: dict[str, Any], job: Snapshot, access: _Access
                             ) -> AsyncIterator[LogChunk | None]:
        """The live log from its worker until the worker ends it (raising the worker's AioRpcError if it
        fails), or, if the stream goes on `end_grace_s` past the attempt's recorded end (a worker gone
        without closing its connection: a preempted machine sends nothing more), until then, with None
        last."""
        chunks = aiter(self.worker_logs.follow(address, *key, offset))
        ended = asyncio.ensure_future(self._ended(attempt, job, access))
        next_chunk: asyncio.Future[LogChunk] | None = None
        try:
            while True:
                next_chunk = asyncio.ensure_future(anext(chunks))
                await asyncio.wait({next_chunk, ended}, return_when=asyncio.FIRST_COMPLETED)
                if not next_chunk.done():
                    ended.result()  # the caller's right to the batch was checked there: raise if it is gone
                    yield None
                    return
                try:
                    chunk = next_chunk.result()
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            for task in (ended, next_chunk):
                if task is not None:
                    task.cancel()
            await asyncio.gather(*(t for t in (ended, next_chunk) if t is not None), return_exceptions=True)
            await chunks.aclose()  # type: ignore[attr-defined]

    async def _ended(self, attempt: dict[str, Any], job: Snapshot, access: _Access) -> None:
        """Return `end_grace_s` after the attempt's end is recorded."""
        while (await self._attempt_now(attempt, job))["end_time_ms"] is None:
            job = await access.wait(attempt["job_id"], job, self.recheck_access_s)
        await asyncio.sleep(self.end_grace_s)

    async def _attempt_now(self, attempt: dict[str, Any], job: Snapshot | None) -> dict[str, Any]:
        """Where the attempt is now: the job's snapshot while it is the job's current attempt, else its row."""
        if job is not None and job["attempt_id"] == attempt["attempt_id"]:
            return job
        row = await self.jobs.attempt(attempt["batch_id"], attempt["job_id"], attempt["attempt_id"])
        return row if row is not None else {**attempt, "end_time_ms": 0}

    @staticmethod
    def _message(attempt: dict[str, Any], number: int, data: bytes, start_byte: int) -> pb.StreamJobLogResponse:
        return pb.StreamJobLogResponse(attempt_id=attempt["attempt_id"], data=data, start_byte=start_byte,
                                       attempt_number=number, instance_name=attempt["instance_name"] or "")


class _Access:
    """Waiting on one batch's job for one caller, whose right to read the batch is checked again every
    `recheck_s` of it."""

    def __init__(self, batches: BatchStore, changes: JobChanges, batch_id: int, principal: Principal,
                 recheck_s: float, clock_s: Callable[[], float]):
        self._batches = batches
        self._changes = changes
        self._batch_id = batch_id
        self._principal = principal
        self._recheck_s = recheck_s
        self._clock_s = clock_s
        self._checked_s = clock_s()

    async def wait(self, job_id: int, seen: Snapshot, timeout_s: float) -> Snapshot:
        """The job once it changed from `seen`, or after `timeout_s` as it was."""
        snapshot = await self._changes.changed(self._batch_id, job_id, seen, timeout_s)
        if self._clock_s() - self._checked_s >= self._recheck_s:
            # A member removed from the billing project stops seeing the batch.
            await readable_batch(self._batches, self._batch_id, self._principal)
            self._checked_s = self._clock_s()
        return snapshot
