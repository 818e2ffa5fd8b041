"""An attempt's usage series from a real container (issue 13, resource
usage): the worker's sampler reads the attempt's cgroup while it runs, and
the series, ended by the end-of-attempt reading, is stored beside the log."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from corral.driver.v1 import worker_session_pb2 as ws
from services.common.usage_series import decode
from services.worker.attempts import Attempt, AttemptTable, log_url, run_attempt, usage_url
from services.worker.logs import LogSink
from services.worker.oci.cgroups import V1, Hierarchies
from services.worker.usage_sampler import UsageSampler
from tests.oci.host import OciHost, needs_oci, spec

pytestmark = [pytest.mark.timeout(60), needs_oci]

MIB = 2**20
HOLD_64_MIB_AND_SPIN = ("(head -c 64m /dev/zero; sleep 3) | tail > /dev/null &\n"
                        "timeout 2.5 sh -c 'while :; do :; done'\n"
                        "wait")
"""tail keeps its last line in memory, and /dev/zero has no newline: it holds 64 MiB until its input ends,
3 s on, while the shell spins a core for 2.5 s (on a shared 2-core machine it gets about 1.5 s of it, and
0.8 s when other tests run beside it: SPUN_MS is what says it was counted, not how fast the host is)."""
SPUN_MS = 400


async def test_the_stored_series_shows_memory_rising_and_cpu_time(oci_host: OciHost, tmp_path: Path) -> None:
    runtime = oci_host.runtime()
    job = oci_host.job(spec(HOLD_64_MIB_AND_SPIN), memory_bytes=256 * MIB)
    ref = ws.AttemptRef(batch_id=job.batch_id, job_id=job.job_id, attempt_id=job.attempt_id)
    attempt = Attempt(ref=ref, run=ws.RunJob(attempt=ref), log=LogSink(job.log_path),
                      log_url=log_url(f"file://{tmp_path}/storage", ref), usage_interval_ms=200)
    table = AttemptTable()
    table.add(attempt)
    sampler = asyncio.create_task(UsageSampler(table, runtime, interval_s=0.2).run())
    try:
        outcome = await run_attempt(runtime, attempt, job, lambda a: None)
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    assert outcome.state == "Success", outcome.error_message

    stored = Path(usage_url(attempt.log_url).removeprefix("file://"))
    assert stored.parent == Path(attempt.log_url.removeprefix("file://")).parent
    header, samples = decode(stored.read_bytes())
    assert (header.runtime, header.interval_ms, header.stride, header.note) == ("oci", 200, 1, "")
    assert len(samples) >= 3  # periodic ones and the final reading
    periodic, final = samples[:-1], samples[-1]
    assert final.at_ms == outcome.end_time_ms
    assert final.reading.cpu_time_ms == outcome.cpu_time_ms and final.reading.memory_bytes is None
    assert [s.at_ms for s in samples] == sorted(s.at_ms for s in samples)
    cpu = [s.reading.cpu_time_ms for s in samples]
    assert None not in cpu and cpu == sorted(cpu)  # type: ignore[type-var]
    assert final.reading.cpu_time_ms is not None and final.reading.cpu_time_ms >= SPUN_MS
    memory = [s.reading.memory_bytes for s in periodic]
    assert None not in memory
    assert memory[0] < 64 * MIB <= max(memory)  # type: ignore[operator,type-var]  # it rose while the job ran
    assert final.reading.peak_memory_bytes is not None and final.reading.peak_memory_bytes >= 64 * MIB
    # Block I/O is counted where a v1 blkio hierarchy is mounted (how much reached a disk is not predictable).
    hierarchies = Hierarchies.of_host()
    if hierarchies.version == V1 and "blkio" in hierarchies.by_controller:
        assert all(s.reading.io_read_bytes is not None and s.reading.io_write_bytes is not None for s in periodic)
