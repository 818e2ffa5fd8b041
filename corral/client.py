"""The synchronous client: `corral.Client` (same calls as `corral.aio.Client`)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc

from corral.aio import (
    BUNCH_SIZE,
    MAX_RECONNECTS,
    PARALLEL_BUNCHES,
    SMALL_BATCH,
    WatchResume,
    channel_credentials,
    refused_submission,
)
from corral.batch.v1 import batch_event_pb2, batch_pb2, batch_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as pb
from corral.builder import BatchBuilder
from corral.calls import Calls
from corral.cli_config import connection
from corral.errors import CorralError, from_rpc_error
from corral.progress import BatchProgress, ProgressLine
from corral.retries import channel_options

T = TypeVar("T")


class Client(Calls):
    """Batches, jobs, logs, billing projects (and, with `auth_address`, users) over
    gRPC, authenticated with a bearer token; blocking calls."""

    def __init__(self, address: str, token: str, ca_cert: str | Path | None = None,
                 auth_address: str | None = None):
        self._channel = grpc.secure_channel(address, channel_credentials(ca_cert), channel_options())
        self._auth_channel = (grpc.secure_channel(auth_address, channel_credentials(ca_cert), channel_options())
                              if auth_address else None)
        self._batches = batch_service_pb2_grpc.BatchServiceStub(self._channel)
        self._open_stubs(self._channel, self._auth_channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    @classmethod
    def from_profile(cls, profile: str | None = None) -> Client:
        """A client as the `corral` CLI would connect: the configuration file's profile `profile`, else its
        current one (`corral up` writes `admin`, `corral login` one per user), with `$CORRAL_TOKEN` in
        place of its token when set."""
        found = connection(profile)
        assert found.token is not None  # connection() raises Unauthenticated otherwise
        return cls(found.frontend, found.token, found.ca_cert, auth_address=found.auth)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()
        if self._auth_channel is not None:
            self._auth_channel.close()

    def _call(self, method: Callable[..., T], request: Any) -> T:
        try:
            return method(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def submit(self, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
               parallelism: int = PARALLEL_BUNCHES) -> batch_pb2.Batch:
        """See `corral.aio.Client.submit`."""
        settings = builder.batch_fields()
        groups = builder.job_group_specs()
        if len(builder) <= SMALL_BATCH and len(groups) <= SMALL_BATCH:
            return self._call(self._batches.SubmitBatch,
                              pb.SubmitBatchRequest(jobs=builder.specs(), job_groups=groups, **settings)).batch
        created = self._call(self._batches.CreateBatch, pb.CreateBatchRequest(
            n_jobs=len(builder), n_job_groups=len(groups), **settings))
        batch_id, update_id = created.batch.batch_id, created.update.update_id
        requests = [pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, bunch_index=n, first_index=first,
                                      jobs=specs) for n, (first, specs) in enumerate(builder.bunches(bunch_size))]
        try:
            for first in range(0, len(groups), bunch_size):
                self._call(self._batches.CreateJobGroups, pb.CreateJobGroupsRequest(
                    batch_id=batch_id, update_id=update_id, first_index=first,
                    job_groups=groups[first:first + bunch_size]))
            # Leaving the pool waits for every bunch: none is in flight when the batch is deleted.
            with ThreadPoolExecutor(parallelism) as pool:
                list(pool.map(lambda r: self._call(self._batches.AddJobs, r), requests))
            return self._call(self._batches.CommitUpdate,
                              pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id)).batch
        except CorralError as e:
            if refused_submission(e, created.batch):
                try:
                    self._call(self._batches.DeleteBatch, pb.DeleteBatchRequest(batch_id=batch_id))
                except CorralError as delete_error:
                    e.add_note(f"batch {batch_id} was left open: deleting it failed ({delete_error})")
                else:  # submitting the builder again starts afresh, not at the deleted batch
                    builder.idempotency_token = uuid.uuid4().hex
            raise

    def get_batch(self, batch_id: int) -> batch_pb2.Batch:
        return self._call(self._batches.GetBatch, pb.GetBatchRequest(batch_id=batch_id)).batch

    def list_batches(self, query: str = "", page_size: int = 100) -> Iterator[batch_pb2.Batch]:
        """Every batch matching `query`, newest first, fetched page by page."""
        token = ""
        while True:
            page = self._call(self._batches.ListBatches,
                              pb.ListBatchesRequest(query=query, page_size=page_size, page_token=token))
            yield from page.batches
            token = page.next_page_token
            if not token:
                return

    def cancel_batch(self, batch_id: int, reason: str = "") -> batch_pb2.Batch:
        return self._call(self._batches.CancelBatch, pb.CancelBatchRequest(batch_id=batch_id, reason=reason)).batch

    def watch(self, batch_id: int, from_event_id: int = 1, query: str = "", include_cost_events: bool = False,
              max_reconnects: int = MAX_RECONNECTS) -> Iterator[batch_event_pb2.BatchEvent]:
        """See `corral.aio.Client.watch`: resumes by itself, never repeats or skips an event."""
        resume = WatchResume(batch_id, from_event_id, max_reconnects)
        while True:
            call = self._batches.WatchBatch(resume.request(query, include_cost_events), metadata=self._metadata)
            error: grpc.RpcError | None = None
            try:
                for response in call:
                    if resume.is_new(response.event):
                        yield response.event
            except grpc.RpcError as e:
                error = e
            finally:
                call.cancel()
            time.sleep(resume.after_drop(error))

    def wait(self, batch_id: int, progress: bool = False) -> batch_pb2.Batch:
        """See `corral.aio.Client.wait`: the batch once complete, with an optional progress line on stderr."""
        batch = self.get_batch(batch_id)
        if batch.state == batch_pb2.BATCH_STATE_COMPLETE:
            return batch
        counts = BatchProgress.from_batch(batch)
        line = ProgressLine() if progress else None
        events = self.watch(batch_id, from_event_id=batch.last_event_id + 1)
        try:
            if line is not None:
                line.show(counts)
            for event in events:
                counts.apply(event)
                if line is not None:
                    line.show(counts)
                if event.HasField("batch_completed"):
                    break
        finally:
            events.close()  # cancels the stream now
            if line is not None:
                line.close()
        return self.get_batch(batch_id)
