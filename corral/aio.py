"""The asyncio client: `corral.aio.Client`, where every call is written (the
blocking `corral.Client` runs these same calls on an event loop thread).

    async with Client("localhost:7443", token, ca_cert="~/.corral/ca.pem") as client:
        batch = await client.submit(builder)
        print(await client.get_batch(batch.batch_id))
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from corral.batch.v1 import batch_event_pb2, batch_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from corral.builder import BatchBuilder
from corral.calls import AsyncCalls
from corral.cli_config import connection
from corral.errors import CorralError, Unavailable, from_rpc_error, retry_after_s
from corral.progress import BatchProgress, ProgressLine
from corral.retries import channel_options

T = TypeVar("T")

SMALL_BATCH = 1_000
"""Up to this many jobs go in one SubmitBatch call; more go up in bunches."""
BUNCH_SIZE = 1_000
BUNCH_BYTES = 2 * 1024 * 1024
"""At most this many bytes of specs go in one request (SubmitBatch or a bunch of AddJobs), whatever their count:
half the 4 MiB a service receives by default (services/common/call_limits.py), the rest for the request's
other fields and headroom. Larger specs (a job's may be 256 KiB) make a small batch go up in bunches too."""
PARALLEL_BUNCHES = 4

REFUSED_CODES = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
                           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND,
                           grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.OUT_OF_RANGE})
"""A bunch or commit failing with these was refused by the server: `submit` deletes the batch it made. Any
other failure (UNAVAILABLE, a deadline) keeps it, for a retry with the same builder to finish."""

RESUMABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED})
"""A watch that fails with these is resumed from the next event (the server or the network went away)."""
MAX_RECONNECTS = 10
"""Consecutive failed reconnections after which `watch` gives up."""
HEALTHY_STREAM_S = 30.0
"""A watch that stayed open this long counts as a success: the reconnection count starts again."""


RATE_LIMIT_RETRIES = 5
"""Times a call refused by one of the user's rates (RESOURCE_EXHAUSTED with a google.rpc.RetryInfo) is sent
again, each after the wait the server asked for."""
MAX_RATE_LIMIT_WAIT_S = 30.0
"""A refusal that asks for a longer wait is raised at once (`corral.errors.ResourceExhausted.retry_after_s`)."""


def rate_limit_wait_s(error: grpc.RpcError, retries_so_far: int) -> float | None:
    """How long to wait before sending a refused call again, or None to raise its error. Only a refusal
    with a RetryInfo is retried: the server sends one for a user's rates and counts, which it checks before
    the call does anything, so sending any call again is safe. The wait is the one asked for, never less,
    with up to a tenth more at random so that a client's parallel calls do not all come back at once."""
    wait_s = retry_after_s(error)
    if wait_s is None or wait_s > MAX_RATE_LIMIT_WAIT_S or retries_so_far >= RATE_LIMIT_RETRIES:
        return None
    return wait_s * (1 + random.random() / 10)


def reconnect_delay_s(failures: int) -> float:
    """Back-off before reconnection number `failures` (1, 2, ...): 0.1 s doubling, at most 5 s."""
    return min(5.0, 0.1 * 2 ** (failures - 1))


WATCH_EVENTS_PER_MESSAGE = 500
"""Events the client asks for in one WatchBatch response: per message, not per event, is what a stream
costs both sides."""


class WatchResume:
    """Where a watch of one batch resumes, and when it gives up: the policy
    `watch` follows around its stream calls."""

    def __init__(self, batch_id: int, from_event_id: int, max_reconnects: int):
        self.batch_id = batch_id
        self.next_id = max(1, from_event_id)
        self.max_reconnects = max_reconnects
        self._failures = 0
        self._started_s = 0.0

    def request(self, query: str, include_cost_events: bool) -> pb.WatchBatchRequest:
        """The request of the next stream, from the next event on."""
        self._started_s = time.monotonic()
        return pb.WatchBatchRequest(batch_id=self.batch_id, from_event_id=self.next_id, query=query,
                                    include_cost_events=include_cost_events,
                                    max_events_per_message=WATCH_EVENTS_PER_MESSAGE)

    def is_new(self, event: batch_event_pb2.BatchEvent) -> bool:
        """Whether to hand `event` out: never twice."""
        if event.event_id < self.next_id:
            return False
        self.next_id, self._failures = event.event_id + 1, 0
        return True

    def after_drop(self, error: grpc.RpcError | None) -> float:
        """The stream ended (`error` None) or failed: seconds to wait before
        resuming, or the error to raise when it is not resumable or the
        reconnections ran out."""
        limited_s = None if error is None else retry_after_s(error)
        if error is not None and limited_s is None and error.code() not in RESUMABLE_CODES:  # type: ignore
            raise from_rpc_error(error) from None
        # The server never ends a watch by itself: an end is a drop too.
        if time.monotonic() - self._started_s > HEALTHY_STREAM_S:
            self._failures = 0
        self._failures += 1
        if self._failures > self.max_reconnects:
            raise (from_rpc_error(error) if error is not None
                   else Unavailable(f"the watch of batch {self.batch_id} keeps ending"))
        # A refusal for one of the user's rates (too many streams opened a second) says when to come back.
        return max(reconnect_delay_s(self._failures), limited_s or 0.0)


def refused_submission(error: CorralError, batch: batch_pb2.Batch) -> bool:
    """Whether `submit` must take back `batch` (as CreateBatch answered it) after `error`: the server refused
    a bunch or the commit, and the batch had never been committed (one that was is the answer of an earlier
    submission of this builder, and stays)."""
    return error.code in REFUSED_CODES and batch.state == batch_pb2.BATCH_STATE_OPEN


def channel_credentials(ca_cert: str | Path | None) -> grpc.ChannelCredentials:
    """TLS trusting `ca_cert` (the corral CA), or the system roots when None."""
    root = Path(ca_cert).expanduser().read_bytes() if ca_cert else None
    return grpc.ssl_channel_credentials(root_certificates=root)


def profile_connection(profile: str | None) -> tuple[str, str, str | None, str]:
    """The address, token, CA certificate and auth address that `from_profile` of both clients connects with."""
    found = connection(profile)
    assert found.token is not None  # connection() raises Unauthenticated otherwise
    return found.frontend, found.token, found.ca_cert, found.auth


class Client(AsyncCalls):
    """Batches, jobs, logs, billing projects (and, with `auth_address`, users) over
    gRPC, authenticated with a bearer token."""

    def __init__(self, address: str, token: str, ca_cert: str | Path | None = None,
                 auth_address: str | None = None):
        self._channel = grpc.aio.secure_channel(address, channel_credentials(ca_cert), channel_options())
        self._auth_channel = (grpc.aio.secure_channel(auth_address, channel_credentials(ca_cert), channel_options())
                              if auth_address else None)
        self._open_stubs(self._channel, self._auth_channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    @classmethod
    def from_profile(cls, profile: str | None = None) -> Client:
        """A client as the `corral` CLI would connect: the configuration file's profile `profile`, else its
        current one (`corral up` writes `admin`, `corral login` one per user), with `$CORRAL_TOKEN` in
        place of its token when set."""
        return cls(*profile_connection(profile))

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()
        if self._auth_channel is not None:
            await self._auth_channel.close()

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        for retry in range(RATE_LIMIT_RETRIES + 1):
            try:
                return await method(request, metadata=self._metadata)
            except grpc.aio.AioRpcError as e:
                wait_s = rate_limit_wait_s(e, retry)
                if wait_s is None:
                    raise from_rpc_error(e) from None
            await asyncio.sleep(wait_s)
        raise AssertionError("unreachable")

    async def submit(self, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
                     parallelism: int = PARALLEL_BUNCHES) -> batch_pb2.Batch:
        """Create and commit the batch and its job groups: one call when small, parallel bunches when large.

        Safe to retry with the same builder: its idempotency token makes the
        server return the same batch, and re-sent bunches are recognised.
        Nothing half-written: a refused submission leaves no batch behind (the
        server takes back what SubmitBatch or CreateBatch made; when a bunch or
        the commit is refused, this deletes the batch it made and gives the
        builder a new token)."""
        settings = builder.batch_fields()
        groups = builder.job_group_specs()
        if len(builder) <= SMALL_BATCH and len(groups) <= SMALL_BATCH and builder.spec_bytes() <= BUNCH_BYTES:
            response = await self._call(self._batches.SubmitBatch,
                                        pb.SubmitBatchRequest(jobs=builder.specs(), job_groups=groups, **settings))
            return response.batch
        created = await self._call(self._batches.CreateBatch, pb.CreateBatchRequest(
            n_jobs=len(builder), n_job_groups=len(groups), **settings))
        batch_id, update_id = created.batch.batch_id, created.update.update_id
        try:
            committed = await self._send_update(batch_id, update_id, builder, bunch_size, parallelism)
        except CorralError as e:
            if refused_submission(e, created.batch):
                try:
                    await self._call(self._batches.DeleteBatch, pb.DeleteBatchRequest(batch_id=batch_id))
                except CorralError as delete_error:
                    e.add_note(f"batch {batch_id} was left open: deleting it failed ({delete_error})")
                else:  # submitting the builder again starts afresh, not at the deleted batch
                    builder.idempotency_token = uuid.uuid4().hex
            raise
        return committed.batch

    async def estimate(self, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
                       parallelism: int = PARALLEL_BUNCHES) -> pb.EstimateBatchResponse:
        """What the builder's batch would cost, without submitting it (EstimateBatch; the server writes
        nothing): `worst_case_micro_usd`, what a spending limit reserves for its jobs' attempts, and
        `expected_micro_usd`, from the history of each job's `name` in the billing project or else from its
        timeout, with how many jobs were priced each way. The jobs are checked as `submit` would have them
        checked, and refused alike. A batch too large for one request is priced in bunches, whose figures add
        up to the batch's."""
        groups = builder.job_group_specs()
        settings = dict(billing_project=builder.billing_project, n_jobs=len(builder), n_job_groups=len(groups))
        limit = asyncio.Semaphore(parallelism)

        async def price(first_index: int, end_index: int) -> pb.EstimateBatchResponse:
            async with limit:
                # The groups go with the first bunch, checked there, when one request may hold them.
                request = pb.EstimateBatchRequest(first_index=first_index, **settings, job_groups=(
                    groups if first_index == 0 and len(groups) <= SMALL_BATCH else []))
                request.MergeFromString(_repeated_field(_ESTIMATE_JOBS, builder.serialized_specs(first_index,
                                                                                                 end_index)))
                try:
                    return await self._call(self._batches.EstimateBatch, request)
                except CorralError as e:
                    e.offsets["jobs"] = first_index
                    raise

        spans = builder.bunches(bunch_size, BUNCH_BYTES) or [(0, 0)]  # no jobs: the server says what is wrong
        parts = await asyncio.gather(*(price(first, end) for first, end in spans))
        total = pb.EstimateBatchResponse(limited=any(part.limited for part in parts))
        for part in parts:
            total.worst_case_micro_usd += part.worst_case_micro_usd
            total.expected_micro_usd += part.expected_micro_usd
            total.n_jobs += part.n_jobs
            total.n_jobs_from_history += part.n_jobs_from_history
            total.n_jobs_from_timeout += part.n_jobs_from_timeout
        return total

    async def update(self, batch_id: int, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
                     parallelism: int = PARALLEL_BUNCHES) -> pb.CommitUpdateResponse:
        """Add the builder's jobs and job groups to the existing batch `batch_id` (an update: CreateUpdate,
        bunches, CommitUpdate); the builder's batch settings are not used. Its `int` parents are ids of the
        batch's jobs; the new jobs' ids start at the answer's `update.start_job_id`. Safe to retry with the same
        builder (its idempotency token names the update)."""
        created = await self._call(self._batches.CreateUpdate, pb.CreateUpdateRequest(
            batch_id=batch_id, n_jobs=len(builder), n_job_groups=len(builder.job_group_specs()),
            idempotency_token=builder.idempotency_token))
        return await self._send_update(batch_id, created.update.update_id, builder, bunch_size, parallelism)

    async def _send_update(self, batch_id: int, update_id: int, builder: BatchBuilder, bunch_size: int,
                           parallelism: int) -> pb.CommitUpdateResponse:
        """Send an open update's job groups, then its jobs in parallel bunches, and commit it."""
        groups = builder.job_group_specs()
        limit = asyncio.Semaphore(parallelism)

        async def send(number: int, first_index: int, end_index: int) -> None:
            async with limit:  # the bunch's message is made only now: a few in memory at a time
                request = pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, bunch_index=number,
                                            first_index=first_index)
                request.MergeFromString(_repeated_field(_ADD_JOBS_JOBS, builder.serialized_specs(first_index,
                                                                                                 end_index)))
                try:
                    await self._call(self._batches.AddJobs, request)
                except CorralError as e:
                    e.offsets["jobs"] = first_index  # its jobs[i] is the builder's job first_index + i
                    raise

        for first in range(0, len(groups), bunch_size):
            try:
                await self._call(self._batches.CreateJobGroups, pb.CreateJobGroupsRequest(
                    batch_id=batch_id, update_id=update_id, first_index=first,
                    job_groups=groups[first:first + bunch_size]))
            except CorralError as e:
                e.offsets["job_groups"] = first
                raise
        sends = [asyncio.ensure_future(send(n, first, end))
                 for n, (first, end) in enumerate(builder.bunches(bunch_size, BUNCH_BYTES))]
        try:
            await asyncio.gather(*sends)
        finally:  # no bunch still in flight once this fails (nor when the batch is deleted)
            for task in sends:
                task.cancel()
            await asyncio.gather(*sends, return_exceptions=True)
        return await self._call(self._batches.CommitUpdate,
                                pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id))

    async def get_batch(self, batch_id: int) -> batch_pb2.Batch:
        """One batch, with its state and job counts."""
        return (await self._call(self._batches.GetBatch, pb.GetBatchRequest(batch_id=batch_id))).batch

    def list_batches(self, query: str = "", page_size: int = 100) -> AsyncIterator[batch_pb2.Batch]:
        """Every batch matching `query`, newest first, fetched page by page."""
        return self._pages(self._batches.ListBatches, pb.ListBatchesRequest(query=query, page_size=page_size),
                           "batches")

    async def regions(self) -> pb.ListRegionsResponse:
        """The regions the deployment runs jobs in (`regions`, the preferred first) and `default_region`, where a
        job that names none is placed first."""
        return await self._call(self._batches.ListRegions, pb.ListRegionsRequest())

    async def cancel_batch(self, batch_id: int, reason: str = "") -> batch_pb2.Batch:
        """Cancel the batch: its jobs that are not `always_run` drain in the background. Cancelling again,
        or a finished batch, changes nothing (the batch returned then has no `cancellation`)."""
        return (await self._call(self._batches.CancelBatch,
                                 pb.CancelBatchRequest(batch_id=batch_id, reason=reason))).batch

    async def watch(self, batch_id: int, from_event_id: int = 1, query: str = "",
                    include_cost_events: bool = False, max_reconnects: int = MAX_RECONNECTS
                    ) -> AsyncIterator[batch_event_pb2.BatchEvent]:
        """The batch's events from `from_event_id` on, in order, until you stop iterating.

        A dropped stream (the frontend restarting, the network) is resumed from
        the last event id + 1, so no event is lost or repeated; after
        `max_reconnects` failed attempts in a row the last error is raised.
        `query` filters job events (the query language); batch-level events
        always come through."""
        resume = WatchResume(batch_id, from_event_id, max_reconnects)
        while True:
            call = self._batches.WatchBatch(resume.request(query, include_cost_events), metadata=self._metadata)
            error: grpc.aio.AioRpcError | None = None
            try:
                async for response in call:
                    for event in response.events if response.events else [response.event]:
                        if resume.is_new(event):
                            yield event
            except grpc.aio.AioRpcError as e:
                error = e
            finally:
                call.cancel()
            await asyncio.sleep(resume.after_drop(error))

    async def wait(self, batch_id: int, progress: bool = False) -> batch_pb2.Batch:
        """Return the batch once it is complete (at once if it already is).

        Waits on WatchBatch, never by polling. With `progress`, shows a
        progress line on stderr while waiting."""
        batch = await self.get_batch(batch_id)
        if batch.state == batch_pb2.BATCH_STATE_COMPLETE:
            return batch
        counts = BatchProgress.from_batch(batch)
        line = ProgressLine() if progress else None
        try:
            if line is not None:
                line.show(counts)
            # aclosing: leaving the loop closes the stream at once, not at garbage collection.
            async with contextlib.aclosing(self.watch(batch_id, from_event_id=batch.last_event_id + 1)) as events:
                async for event in events:
                    counts.apply(event)
                    if line is not None:
                        line.show(counts)
                    if event.HasField("batch_completed"):
                        break
        finally:
            if line is not None:
                line.close()
        return await self.get_batch(batch_id)


_ADD_JOBS_JOBS = pb.AddJobsRequest.DESCRIPTOR.fields_by_name["jobs"].number
_ESTIMATE_JOBS = pb.EstimateBatchRequest.DESCRIPTOR.fields_by_name["jobs"].number


def _repeated_field(number: int, messages: list[bytes]) -> bytes:
    """Serialized messages as the wire form of a repeated message field `number`: merged into a request, they
    append to it without being parsed into messages first."""
    tag = _varint(number << 3 | 2)  # wire type 2: length-delimited
    return b"".join(tag + _varint(len(message)) + message for message in messages)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
