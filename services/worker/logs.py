"""Where a job's combined stdout and stderr go while it runs: a local file,
readable and followable during the run, uploaded to storage once it ends;
and the pipe reader that fills it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
from collections.abc import AsyncIterator
from io import FileIO
from pathlib import Path

import fsspec

from services.worker.metrics import LOG_UPLOAD_BYTES

DEFAULT_LOG_CAP_BYTES = 64 * 2**20

RECENT_BYTES = 8192
"""How much of a job's latest output a log keeps in memory (for what the runtime reads of it)."""


class LogSink:
    """The log of one attempt's main command.

    Bytes are appended to a local file as they arrive, so `read` and `follow`
    see them while the job runs. The file is capped at `cap_bytes`: its first
    half (the head) is written as it comes; past that, only the latest half
    (the tail) is kept in memory and appended when the sink is closed, after a
    line saying how many bytes were left out. While such a job is still
    running, readers therefore see only the head.

    A sink serves one attempt: `write` until `close`, then `upload`. It is
    used from one event loop; `write` and `close` are plain calls so a
    protocol's `data_received` can call them.
    """

    def __init__(self, path: Path, cap_bytes: int = DEFAULT_LOG_CAP_BYTES):
        if cap_bytes < 2:
            raise ValueError("cap_bytes must be at least 2")
        self.path = path
        self.cap_bytes = cap_bytes
        self._head_cap = cap_bytes - cap_bytes // 2
        self._tail_cap = cap_bytes // 2
        self._head_written = 0
        self._tail = bytearray()
        self._received = 0
        self._file: FileIO | None = None
        self._closed = False
        self._recent = bytearray()
        self.write_error: OSError | None = None
        """The first error writing the log file (e.g. its disk is full): what followed was not kept there."""
        # Replaced on every change; a follower waits on the one it saw before
        # reading, so no write can slip between its read and its wait.
        self._changed = asyncio.Event()

    @property
    def closed(self) -> bool:
        """True once the job ended and the log is complete."""
        return self._closed

    @property
    def received_bytes(self) -> int:
        """Bytes the job wrote, including any left out by the cap."""
        return self._received

    @property
    def recent(self) -> bytes:
        """The last RECENT_BYTES the job wrote (kept in memory, whether or not the file could take them)."""
        return bytes(self._recent)

    def write(self, data: bytes) -> None:
        """Append output of the running job."""
        if self._closed:
            raise RuntimeError(f"log {self.path} is closed")
        if not data:
            return
        self._received += len(data)
        self._recent += data
        del self._recent[: max(0, len(self._recent) - RECENT_BYTES)]
        head = data[: max(0, self._head_cap - self._head_written)]
        if head:
            self._append(head)
            self._head_written += len(head)
        rest = data[len(head):]
        if rest:
            self._tail += rest
            del self._tail[: max(0, len(self._tail) - self._tail_cap)]
        self._notify()

    def close(self) -> None:
        """Mark the log complete: append the kept tail, wake followers."""
        if self._closed:
            return
        omitted = self._received - self._head_written - len(self._tail)
        if omitted > 0:
            self._append(f"\n[corral: {omitted} bytes of output omitted; the log keeps the first "
                         f"{self._head_cap} and the last {self._tail_cap} bytes]\n".encode())
        if self._tail:
            self._append(bytes(self._tail))
            self._tail.clear()
        if self._file is not None or self.write_error is None:
            with contextlib.suppress(OSError):
                self._open().close()
        self._file = None
        self._closed = True
        self._notify()

    def read(self, offset: int = 0, limit: int = -1) -> bytes:
        """Up to `limit` bytes (all if negative) of the log from `offset`."""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""

    async def follow(self, offset: int = 0, chunk_bytes: int = 2**16) -> AsyncIterator[bytes]:
        """Yield the log's bytes from `offset` as they arrive, until it is closed."""
        while True:
            changed = self._changed
            closed = self._closed
            data = self.read(offset, chunk_bytes)
            if data:
                offset += len(data)
                yield data
            elif closed:
                return
            else:
                await changed.wait()

    async def upload(self, url: str) -> None:
        """Copy the finished log to `url` (any fsspec URL, e.g. file:// or gs://)."""
        if not self._closed:
            raise RuntimeError(f"log {self.path} is still being written")
        LOG_UPLOAD_BYTES.inc(await asyncio.to_thread(_put_file, self.path, url))

    def _open(self) -> FileIO:
        if self._file is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # Unbuffered, so what the job wrote is on disk for readers at once; the worker's alone (0600).
            self._file = FileIO(os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600),
                                "ab")
        return self._file

    def _append(self, data: bytes) -> None:
        """Write to the file; on an error keep the first (`write_error`) and drop the data, since the job
        runs on and its status, not the file, must say what happened."""
        if self.write_error is not None:
            return
        try:
            self._open().write(data)
        except OSError as e:
            self.write_error = e

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()


class LogPipe(asyncio.Protocol):
    """Copies what a job writes to a pipe (its stdout and stderr) into its log."""

    def __init__(self, log: LogSink):
        self._log = log
        self._transport: asyncio.BaseTransport | None = None
        self._lost = asyncio.get_running_loop().create_future()

    @classmethod
    async def attach(cls, fd: int, log: LogSink) -> LogPipe:
        """Read the pipe's read end `fd` into `log`; the LogPipe owns `fd` from here on, even if this fails."""
        pipe, file = cls(log), open(fd, "rb", buffering=0)
        try:
            pipe._transport, _ = await asyncio.get_running_loop().connect_read_pipe(lambda: pipe, file)
        except BaseException:
            file.close()
            raise
        return pipe

    def data_received(self, data: bytes) -> None:
        self._log.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._lost.done():
            self._lost.set_result(None)

    async def drain(self, timeout_s: float) -> None:
        """Read until every writer has closed the pipe, or stop reading after `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._lost)
        except TimeoutError:
            self.close()

    def close(self) -> None:
        """Stop reading; nothing more reaches the log."""
        if self._transport is not None:
            self._transport.close()


def _put_file(path: Path, url: str) -> int:
    """Upload the file; its size."""
    fs, remote = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(remote.rstrip("/")) or "/", exist_ok=True)
    fs.put_file(os.fspath(path), remote)
    return path.stat().st_size


def put_bytes(data: bytes, url: str) -> None:
    """Write `data` to `url` (any fsspec URL), making its directory where the store has directories."""
    fs, remote = fsspec.core.url_to_fs(url)
    fs.makedirs(posixpath.dirname(remote.rstrip("/")) or "/", exist_ok=True)
    fs.pipe_file(remote, data)
