"""The worker's usage sampler over a fake runtime (services/worker/usage_sampler.py), and what a heartbeat's
rollup says of the latest sample."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.driver.v1 import worker_session_pb2 as ws
from services.common.usage_series import UsageReading, UsageSample, UsageSeries
from services.worker.agent import Worker
from services.worker.attempts import Attempt, AttemptTable, timestamp
from services.worker.logs import LogSink
from services.worker.usage_sampler import UsageSampler


class FakeRuntime:
    """Counters by attempt id; an id in `failing` raises as a cgroup removed under the reader does."""

    name = "fake"
    usage_note = ""

    def __init__(self) -> None:
        self.readings: dict[str, UsageReading] = {}
        self.failing: set[str] = set()

    def sample(self, attempt_id: str) -> UsageReading | None:
        if attempt_id in self.failing:
            raise FileNotFoundError(attempt_id)
        return self.readings.get(attempt_id)


def attempt(tmp_path: Path, attempt_id: str, started: bool = True) -> Attempt:
    ref = ws.AttemptRef(batch_id=1, job_id=2, attempt_id=attempt_id)
    return Attempt(ref=ref, run=ws.RunJob(attempt=ref), log=LogSink(tmp_path / attempt_id / "main.log"), log_url="",
                   started_ms=1 if started else None, usage=UsageSeries(cap=4))


async def test_each_started_running_attempt_gets_a_sample_per_cycle(tmp_path: Path) -> None:
    runtime, table, now = FakeRuntime(), AttemptTable(), [1000]
    running, waiting, broken, unread, ended = (attempt(tmp_path, "a"), attempt(tmp_path, "b", started=False),
                                               attempt(tmp_path, "c"), attempt(tmp_path, "d"), attempt(tmp_path, "e"))
    for a in (running, waiting, broken, unread, ended):
        table.add(a)
        runtime.readings[a.ref.attempt_id] = UsageReading(cpu_time_ms=5)
    del runtime.readings["d"]  # the runtime cannot read it (the process runtime, say)
    runtime.failing.add("c")
    table.end(ended, None)
    sampler = UsageSampler(table, runtime, interval_s=0.1, clock_ms=lambda: now[0])  # type: ignore[arg-type]
    await sampler.sample_once()
    now[0] = 2000
    runtime.readings["a"] = UsageReading(cpu_time_ms=9)
    await sampler.sample_once()
    assert [(s.at_ms, s.reading.cpu_time_ms) for s in running.usage.samples] == [(1000, 5), (2000, 9)]
    assert (waiting.usage.samples, broken.usage.samples, unread.usage.samples, ended.usage.samples) == ([], [], [], [])


async def test_the_loop_survives_a_failing_cycle_and_says_when_it_cycled(tmp_path: Path) -> None:
    table = AttemptTable()
    table.add(attempt(tmp_path, "a"))
    cycles = asyncio.Event()

    class Broken(FakeRuntime):
        def sample(self, attempt_id: str) -> UsageReading | None:
            raise RuntimeError("a bug")

    sampler = UsageSampler(table, Broken(), interval_s=0.01, on_cycle=cycles.set)  # type: ignore[arg-type]
    task = asyncio.create_task(sampler.run())
    try:
        for _ in range(2):
            await asyncio.wait_for(cycles.wait(), 5)
            cycles.clear()
        assert not task.done()
    finally:
        task.cancel()


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError):
        UsageSampler(AttemptTable(), FakeRuntime(), interval_s=0)  # type: ignore[arg-type]


def test_a_rollup_carries_the_latest_sample_even_one_the_series_did_not_keep(tmp_path: Path) -> None:
    a = attempt(tmp_path, "a")
    now = timestamp(5000)
    assert not Worker._rollup(a, now).HasField("usage")
    for cpu in range(6):  # a cap of 4 keeps every other sample by now
        a.usage.add(UsageSample(cpu, UsageReading(cpu_time_ms=1000 * cpu, peak_memory_bytes=cpu)))
    rollup = Worker._rollup(a, now)
    assert (rollup.rollup_time.ToMilliseconds(), rollup.usage.cpu_time.ToMilliseconds(),
            rollup.usage.peak_memory_bytes) == (5000, 5000, 5)
