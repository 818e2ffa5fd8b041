"""The asyncio client: `corral.aio.Client`.

    async with Client("localhost:7443", token, ca_cert="~/.corral/ca.pem") as client:
        batch = await client.submit(builder)
        print(await client.get_batch(batch.batch_id))
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from corral.batch.v1 import batch_pb2, batch_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as pb
from corral.builder import BatchBuilder
from corral.errors import from_rpc_error

T = TypeVar("T")

SMALL_BATCH = 1_000
"""Up to this many jobs go in one SubmitBatch call; more go up in bunches."""
BUNCH_SIZE = 1_000
PARALLEL_BUNCHES = 4


def channel_credentials(ca_cert: str | Path | None) -> grpc.ChannelCredentials:
    """TLS trusting `ca_cert` (the corral CA), or the system roots when None."""
    root = Path(ca_cert).expanduser().read_bytes() if ca_cert else None
    return grpc.ssl_channel_credentials(root_certificates=root)


class Client:
    """Batches over gRPC, authenticated with a bearer token."""

    def __init__(self, address: str, token: str, ca_cert: str | Path | None = None):
        self._channel = grpc.aio.secure_channel(address, channel_credentials(ca_cert))
        self._batches = batch_service_pb2_grpc.BatchServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def submit(self, builder: BatchBuilder, bunch_size: int = BUNCH_SIZE,
                     parallelism: int = PARALLEL_BUNCHES) -> batch_pb2.Batch:
        """Create and commit the batch: one call when small, parallel bunches when large.

        Safe to retry with the same builder: its idempotency token makes the
        server return the same batch, and re-sent bunches are recognised."""
        settings = builder.batch_fields()
        if len(builder) <= SMALL_BATCH:
            response = await self._call(self._batches.SubmitBatch,
                                        pb.SubmitBatchRequest(jobs=builder.specs(), **settings))
            return response.batch
        created = await self._call(self._batches.CreateBatch, pb.CreateBatchRequest(n_jobs=len(builder), **settings))
        batch_id, update_id = created.batch.batch_id, created.update.update_id
        limit = asyncio.Semaphore(parallelism)

        async def send(number: int, first_index: int, specs: list) -> None:
            async with limit:
                await self._call(self._batches.AddJobs, pb.AddJobsRequest(
                    batch_id=batch_id, update_id=update_id, bunch_index=number, first_index=first_index, jobs=specs))

        await asyncio.gather(*(send(n, first, specs) for n, (first, specs) in enumerate(builder.bunches(bunch_size))))
        committed = await self._call(self._batches.CommitUpdate,
                                     pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id))
        return committed.batch

    async def get_batch(self, batch_id: int) -> batch_pb2.Batch:
        return (await self._call(self._batches.GetBatch, pb.GetBatchRequest(batch_id=batch_id))).batch

    async def list_batches(self, query: str = "", page_size: int = 100) -> AsyncIterator[batch_pb2.Batch]:
        """Every batch matching `query`, newest first, fetched page by page."""
        token = ""
        while True:
            page = await self._call(self._batches.ListBatches,
                                    pb.ListBatchesRequest(query=query, page_size=page_size, page_token=token))
            for batch in page.batches:
                yield batch
            token = page.next_page_token
            if not token:
                return

    async def cancel_batch(self, batch_id: int, reason: str = "") -> batch_pb2.Batch:
        return (await self._call(self._batches.CancelBatch,
                                 pb.CancelBatchRequest(batch_id=batch_id, reason=reason))).batch
