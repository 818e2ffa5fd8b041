"""A simulated worker for `bench e2e --fleet N`: the real worker (`python -m services.worker`, the same
command line, its session stream over mutual TLS, its attempt table, log upload and usage reports) with
one part replaced, the runtime: each attempt succeeds the moment it starts, running nothing.

So a fleet of them loads the control plane (database, drivers, frontend) as real workers would, without
paying for a process per job, and the control plane's capacity is measured apart from process start-up.
Never deployed: only the benchmark starts it.
"""

from __future__ import annotations

import functools
import runpy
import time
from collections.abc import Awaitable, Callable

from corral.batch.v1 import job_spec_pb2
from services.common.usage_series import UsageReading
from services.worker import app
from services.worker.logs import LogSink
from services.worker.runtime_api import EXITED, JobOutcome, JobRun


class InstantRuntime:
    """Every attempt exits 0 at once; nothing runs, nothing is isolated."""

    name = "instant"
    isolates = False
    usage_note = "a benchmark's simulated worker: nothing ran"

    def check(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        return []

    def isolation(self, job: JobRun) -> str:
        return "none: a benchmark's simulated worker ran nothing"

    def image_digest(self, job: JobRun) -> str:
        return ""

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        started_ms = int(time.time() * 1000)
        await on_started(0)
        log.close()
        return JobOutcome(state="Success", exit_code=0, error_message="", start_time_ms=started_ms,
                          end_time_ms=int(time.time() * 1000), end_reason=EXITED, isolation=self.isolation(job))

    def sample(self, attempt_id: str) -> UsageReading | None:
        return None

    async def cancel(self, attempt_id: str) -> None:
        return None

    async def close(self) -> None:
        return None


if __name__ == "__main__":
    app.run = functools.partial(app.run, runtime=InstantRuntime())  # what services.worker's main calls
    runpy.run_module("services.worker", run_name="__main__", alter_sys=True)
