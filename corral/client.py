"""The synchronous client: `corral.Client` (same calls as `corral.aio.Client`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import grpc

from corral.aio import BUNCH_SIZE, PARALLEL_BUNCHES, SMALL_BATCH, channel_credentials
from corral.batch.v1 import batch_pb2, batch_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as pb
from corral.builder import BatchBuilder
from corral.errors import from_rpc_error

T = TypeVar("T")


class Client:
    """Batches over gRPC, authenticated with a bearer token; blocking calls."""

    def __init__(self, address: str, token: str, ca_cert: str | Path | None = None):
        self._channel = grpc.secure_channel(address, channel_credentials(ca_cert))
        self._batches = batch_service_pb2_grpc.BatchServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., T], request: Any) -> T:
        try:
            return method(request, metadata=self._metadata)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def submit(self, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
               parallelism: int = PARALLEL_BUNCHES) -> batch_pb2.Batch:
        """See `corral.aio.Client.submit`."""
        settings = builder.batch_fields()
        if len(builder) <= SMALL_BATCH:
            return self._call(self._batches.SubmitBatch, pb.SubmitBatchRequest(jobs=builder.specs(), **settings)).batch
        created = self._call(self._batches.CreateBatch, pb.CreateBatchRequest(n_jobs=len(builder), **settings))
        batch_id, update_id = created.batch.batch_id, created.update.update_id
        requests = [pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, bunch_index=n, first_index=first,
                                      jobs=specs) for n, (first, specs) in enumerate(builder.bunches(bunch_size))]
        with ThreadPoolExecutor(parallelism) as pool:
            list(pool.map(lambda r: self._call(self._batches.AddJobs, r), requests))
        return self._call(self._batches.CommitUpdate,
                          pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id)).batch

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
