"""Where the frontend reads job logs: blob storage for finished attempts, the
worker's WorkerService for running ones.

The worker writes each step's log to a local file while the attempt runs and
serves it over its mutual-TLS WorkerService (at `instances.ip_address`); at
the end it uploads it to
`{spec_root_url}/logs/{batch_id}/{job_id}/{attempt_id}/{step}.log` (`main`,
`input`, `output`) before reporting the attempt complete. Two narrow readers
here, one per source; `services.frontend.jobs` picks one per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import posixpath
from collections.abc import AsyncIterator

import fsspec
import grpc

from corral.batch.v1 import job_pb2
from corral.worker.v1 import worker_service_pb2 as worker_pb
from corral.worker.v1 import worker_service_pb2_grpc
from services.common.errors import RequestError
from services.common.tls import TlsFiles

CHUNK_BYTES = 64 * 1024
"""Most bytes per StreamJobLog message."""
DEFAULT_MAX_BYTES = 1024 * 1024
MAX_MAX_BYTES = 4 * 1024 * 1024
WORKER_DEADLINE_S = 10.0
"""A worker that does not answer a log read within this is treated as gone."""

_STEP_NAMES = {job_pb2.JOB_STEP_UNSPECIFIED: "main", job_pb2.JOB_STEP_MAIN: "main",
               job_pb2.JOB_STEP_INPUT: "input", job_pb2.JOB_STEP_OUTPUT: "output"}


class LogUnavailable(RequestError):
    """The attempt runs, but its worker cannot be reached for its log."""

    code = grpc.StatusCode.UNAVAILABLE


@dataclasses.dataclass(frozen=True)
class LogChunk:
    """A byte range of one step's log."""

    data: bytes
    start_byte: int
    """Offset of data's first byte in the log."""
    total_bytes: int
    """Size of the log so far."""
    complete: bool
    """The step ended: no more bytes will come."""


def step_name(step: int) -> str:
    """The file name stem of a JobStep; raises KeyError for an unknown step."""
    return _STEP_NAMES[step]


def _start(start_byte: int, total_bytes: int) -> int:
    """Where a read starts: a negative offset counts from the end; never past the end."""
    start = total_bytes + start_byte if start_byte < 0 else start_byte
    return min(max(start, 0), total_bytes)


class StoredLogs:
    """Logs of finished attempts under `{root_url}/logs/`."""

    def __init__(self, root_url: str):
        self.root_url = root_url
        self._fs, self._root = fsspec.core.url_to_fs(root_url)

    def path(self, batch_id: int, job_id: int, attempt_id: str, step: int) -> str:
        """Where the worker uploads one step's log."""
        return posixpath.join(self._root, "logs", str(batch_id), str(job_id), attempt_id, f"{step_name(step)}.log")

    def _read(self, path: str, start_byte: int, max_bytes: int) -> LogChunk | None:
        try:
            total = int(self._fs.size(path))
            start = _start(start_byte, total)
            with self._fs.open(path, "rb") as f:
                f.seek(start)
                data = f.read(max_bytes)
        except FileNotFoundError:
            return None
        return LogChunk(data, start, total, complete=True)

    async def read(self, batch_id: int, job_id: int, attempt_id: str, step: int, start_byte: int,
                   max_bytes: int) -> LogChunk | None:
        """A range of the stored log; None if it is not in storage (yet)."""
        return await asyncio.to_thread(self._read, self.path(batch_id, job_id, attempt_id, step), start_byte,
                                       max_bytes)

    async def chunks(self, batch_id: int, job_id: int, attempt_id: str, step: int, start_byte: int
                     ) -> AsyncIterator[LogChunk]:
        """The stored log from `start_byte` to its end, CHUNK_BYTES at a time."""
        offset = start_byte
        while True:
            chunk = await self.read(batch_id, job_id, attempt_id, step, offset, CHUNK_BYTES)
            if chunk is None or not chunk.data:
                return
            yield chunk
            offset = chunk.start_byte + len(chunk.data)


class WorkerLogs:
    """Logs of running attempts, read from their worker with the frontend's certificate.

    One channel per worker address, kept while the frontend runs (a worker's
    address is not reused by another worker while the frontend knows it)."""

    def __init__(self, tls: TlsFiles):
        self._tls = tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    def _stub(self, address: str) -> worker_service_pb2_grpc.WorkerServiceStub:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.secure_channel(address, self._tls.channel_credentials())
        return worker_service_pb2_grpc.WorkerServiceStub(channel)

    async def read(self, address: str, batch_id: int, job_id: int, attempt_id: str, step: int, start_byte: int,
                   max_bytes: int) -> LogChunk:
        """A range of the live log; raises grpc.aio.AioRpcError as the worker answers."""
        response = await self._stub(address).GetJobLog(worker_pb.GetJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, step=step, start_byte=start_byte,
            max_bytes=max_bytes), timeout=WORKER_DEADLINE_S)
        return LogChunk(response.data, response.start_byte, response.total_bytes, response.complete)

    async def usage(self, address: str, batch_id: int, job_id: int, attempt_id: str
                    ) -> worker_pb.GetAttemptUsageResponse:
        """A running attempt's usage series so far; raises grpc.aio.AioRpcError as the worker answers."""
        return await self._stub(address).GetAttemptUsage(worker_pb.GetAttemptUsageRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id), timeout=WORKER_DEADLINE_S)

    async def follow(self, address: str, batch_id: int, job_id: int, attempt_id: str, step: int, start_byte: int
                     ) -> AsyncIterator[LogChunk]:
        """The live log from `start_byte`, followed until the step ends (total_bytes is
        not known while following: it is the end of each chunk)."""
        call = self._stub(address).StreamJobLog(worker_pb.StreamJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, step=step, start_byte=start_byte))
        try:
            async for message in call:
                end = message.start_byte + len(message.data)
                yield LogChunk(message.data, message.start_byte, end, complete=False)
        finally:
            call.cancel()

    async def close(self) -> None:
        """Close every worker channel."""
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()
