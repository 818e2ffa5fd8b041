"""Starting jobs while the worker's gRPC is busy (issue 10, "no crash at job
start"): memory-limited jobs, isolated and unisolated, started through the
real process runtime in a process whose gRPC server and client streams are
hammered meanwhile, as a worker's session and WorkerService are. Not one may
die at its start (the SIGABRT of gRPC's `Check failed: next_worker->state ==
KICKED` that Python run between fork and exec used to cause), nor fail to
start. The issue's size (2,000 starts of each kind) is marked slow; the
default suite starts 100 of each."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker import runtime as runtime_module
from services.worker.logs import LogSink
from services.worker.runtime import JobOutcome, JobRun, ProcessRuntime, ProcessRuntimeConfig, can_isolate

SERVICE, METHOD = "corral.test.Echo", "Chat"
MESSAGES_PER_CALL = 50
HAMMER_THREADS = 3
CONCURRENT_STARTS = 16
MEMORY_BYTES = 1 << 30


class BusyGrpc:
    """A gRPC server in this process's event loop echoing bidi streams, hammered by client threads (each
    its own channel) and by client streams in the loop: every call a fresh object, soon garbage."""

    def __init__(self) -> None:
        self.echoed = 0
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._server: grpc.aio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        async def chat(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for request in requests:
                self.echoed += 1
                yield request

        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE, {METHOD: grpc.stream_stream_rpc_method_handler(chat)})])
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self._threads = [threading.Thread(target=self._hammer_from_a_thread, daemon=True)
                         for _ in range(HAMMER_THREADS)]
        for thread in self._threads:
            thread.start()
        self._tasks = [asyncio.create_task(self._hammer_from_the_loop())]

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for thread in self._threads:
            await asyncio.to_thread(thread.join)
        if self._server is not None:
            await self._server.stop(0)

    def _hammer_from_a_thread(self) -> None:
        try:
            with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
                chat = channel.stream_stream(f"/{SERVICE}/{METHOD}")
                while not self._stop.is_set():
                    for _ in chat(iter([b"x" * 64] * MESSAGES_PER_CALL)):
                        pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.errors.append(e)

    async def _hammer_from_the_loop(self) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            chat = channel.stream_stream(f"/{SERVICE}/{METHOD}")
            while True:
                async for _ in chat(iter([b"y" * 64] * MESSAGES_PER_CALL)):
                    pass


@pytest.fixture
async def busy_grpc() -> AsyncIterator[BusyGrpc]:
    busy = BusyGrpc()
    await busy.start()
    try:
        yield busy
    finally:
        await busy.stop()


@pytest.fixture(params=["isolated", "unisolated"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "isolated" and not can_isolate():
        pytest.skip("isolating jobs needs a worker running as root on Linux")
    if request.param == "unisolated":
        monkeypatch.setattr(runtime_module, "can_isolate", lambda: False)  # as a worker that is not root
    yield request.param


async def start_jobs(busy: BusyGrpc, scratch: Path, n_starts: int) -> Counter[str]:
    """Run `n_starts` memory-limited no-op jobs, CONCURRENT_STARTS at a time; how each ended."""
    runtime = ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True))
    endings: Counter[str] = Counter()
    numbers = iter(range(n_starts))

    async def nothing(pid: int) -> None:
        pass

    async def lane() -> None:
        for n in numbers:
            job = JobRun(batch_id=1, job_id=n, attempt_id=f"a{n}", spec=js.JobSpec(
                image="none", argv=js.Argv(args=["true"])), cores_mcpu=250, memory_bytes=MEMORY_BYTES,
                scratch=scratch)
            outcome = await runtime.run(job, LogSink(job.log_path), nothing)
            endings[ending(outcome)] += 1

    echoed_before = busy.echoed
    try:
        await asyncio.gather(*(lane() for _ in range(CONCURRENT_STARTS)))
    finally:
        await runtime.close()
    assert busy.echoed > echoed_before, "gRPC was not busy while the jobs started"
    assert not busy.errors, busy.errors
    return endings


def ending(outcome: JobOutcome) -> str:
    if outcome.state == "Success":
        return "success"
    if "SIGABRT" in outcome.error_message:
        return "aborted"
    return f"{outcome.state}: {outcome.error_message}"


@pytest.mark.timeout(300)
async def test_memory_limited_jobs_start_while_grpc_is_busy(mode: str, busy_grpc: BusyGrpc, tmp_path: Path) -> None:
    endings = await start_jobs(busy_grpc, tmp_path / "scratch", 100)
    assert endings == Counter(success=100), endings


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_two_thousand_memory_limited_jobs_start_while_grpc_is_busy(mode: str, busy_grpc: BusyGrpc,
                                                                         tmp_path: Path) -> None:
    """The issue's acceptance: 0 aborts in at least 2,000 starts of memory-limited jobs."""
    endings = await start_jobs(busy_grpc, tmp_path / "scratch", 2000)
    assert endings == Counter(success=2000), endings
