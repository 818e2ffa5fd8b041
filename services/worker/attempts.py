"""The attempts a worker holds, and running one of them to its report.

`AttemptTable` is what the agent and WorkerService share: the agent adds an
`Attempt` when it accepts a RunJob and ends it with the runtime's outcome;
WorkerService reads the log of a running attempt, and of one that ended
within `keep_ended_s` (by then the log is in storage too, but a reader that
started here can finish here). `run_attempt` runs one attempt in the
runtime, uploads its log and its usage series (beside the log) and returns
the outcome; `completed_event` turns that into the JobCompleted the driver
records.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from google.protobuf import duration_pb2, timestamp_pb2
from opentelemetry import trace

from corral.batch.v1 import job_pb2, job_state_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.telemetry import extract
from services.common.usage_series import FILE_NAME as USAGE_FILE_NAME
from services.common.usage_series import UsageHeader, UsageReading, UsageSample, UsageSeries, encode
from services.worker.logs import LogSink, put_bytes
from services.worker.runtime import CANCELLED, REFUSED, SYSTEM_ERROR, ContainerRuntime, JobOutcome, JobRun
from services.worker.storage_check import file_url_refusals

log = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)

AttemptKey = tuple[int, int, str]
"""(batch_id, job_id, attempt_id): attempt ids are unique within a job only."""

_STATES = {"Success": job_state_pb2.JOB_STATE_SUCCEEDED, "Failed": job_state_pb2.JOB_STATE_FAILED,
           "Error": job_state_pb2.JOB_STATE_ERROR, "Cancelled": job_state_pb2.JOB_STATE_CANCELLED}

UPLOAD_TRIES = 3


def wall_ms() -> int:
    """Milliseconds since the epoch."""
    return time.time_ns() // 1_000_000


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    """A Timestamp of `ms` milliseconds since the epoch."""
    out = timestamp_pb2.Timestamp()
    out.FromMilliseconds(ms)
    return out


def log_url(root_url: str, ref: ws.AttemptRef) -> str:
    """Where an attempt's main log goes: the same layout the driver puts in RunJob.log_url."""
    return f"{root_url.rstrip('/')}/logs/{ref.batch_id}/{ref.job_id}/{ref.attempt_id}/main.log"


def usage_url(log_url: str) -> str:
    """Where an attempt's usage series goes: beside its main log."""
    return f"{log_url.rsplit('/', 1)[0]}/{USAGE_FILE_NAME}"


def resource_usage(cpu_time_ms: int | None, peak_memory_bytes: int | None) -> job_pb2.ResourceUsage:
    """A ResourceUsage of what is known (a counter not known is left unset)."""
    usage = job_pb2.ResourceUsage()
    if cpu_time_ms is not None:
        usage.cpu_time.CopyFrom(duration_pb2.Duration(seconds=cpu_time_ms // 1000,
                                                      nanos=cpu_time_ms % 1000 * 1_000_000))
    if peak_memory_bytes is not None:
        usage.peak_memory_bytes = peak_memory_bytes
    return usage


@dataclasses.dataclass
class Attempt:
    """One attempt on this worker, from RunJob until it is forgotten."""

    ref: ws.AttemptRef
    run: ws.RunJob
    log: LogSink
    log_url: str
    started_ms: int | None = None
    """When the command started (JobStarted); None before."""
    outcome: JobOutcome | None = None
    """How it ended; None while it runs."""
    ended_at_s: float | None = None
    """Monotonic time it ended, for forgetting it later."""
    cancel_requested: bool = False
    """CancelJob arrived: stop it and report Cancelled."""
    abandoned: bool = False
    """Killed because the worker is going away: report nothing, the driver runs it again."""
    uploaded: bool = False
    """Its log is in storage."""
    no_room: str = ""
    """Why it does not fit on the worker now (the scheduler's view was stale), in words: it ends at once as a
    system error, which the driver retries on another worker; it reserves nothing meanwhile."""
    secret_refusals: list[str] = dataclasses.field(default_factory=list)
    """Why the secrets it mounts cannot be (services.worker.secret_files.delivered_secrets): it ends at once,
    refused."""
    usage: UsageSeries = dataclasses.field(default_factory=UsageSeries)
    """Its resource usage over time: sampled while it runs (usage_sampler.py), the last reading at its end."""
    usage_interval_ms: int = 0
    """How often the sampler reads it, for the stored series' header."""
    task: asyncio.Task[None] | None = None

    @property
    def key(self) -> AttemptKey:
        return (self.ref.batch_id, self.ref.job_id, self.ref.attempt_id)

    @property
    def running(self) -> bool:
        return self.ended_at_s is None


class Reserved(NamedTuple):
    """What a worker's running attempts reserved."""

    cores_mcpu: int
    memory_bytes: int
    storage_bytes: int


class AttemptTable:
    """Running attempts and those that ended in the last `keep_ended_s` seconds."""

    def __init__(self, keep_ended_s: float = 600.0, clock: Callable[[], float] = time.monotonic):
        self._keep_ended_s = keep_ended_s
        self._clock = clock
        self._attempts: dict[AttemptKey, Attempt] = {}
        # Running attempts apart, and ended ones in the order they ended, so
        # neither the heartbeat's list nor forgetting scans every attempt the
        # worker ran in the last `keep_ended_s` (thousands, under load).
        self._running: dict[AttemptKey, Attempt] = {}
        self._ended: collections.deque[Attempt] = collections.deque()

    def add(self, attempt: Attempt) -> None:
        """Hold a new attempt (its key must be new)."""
        if attempt.key in self._attempts:
            raise ValueError(f"attempt {attempt.key} is already held")
        self._attempts[attempt.key] = attempt
        self._running[attempt.key] = attempt

    def get(self, key: AttemptKey) -> Attempt | None:
        """The attempt, running or recently ended; None if unknown or forgotten."""
        self._forget_old()
        return self._attempts.get(key)

    def running(self) -> list[Attempt]:
        """Attempts that have not ended, oldest first."""
        return list(self._running.values())

    def end(self, attempt: Attempt, outcome: JobOutcome | None) -> None:
        """Mark an attempt ended (outcome None: abandoned); it stays readable for a while."""
        attempt.outcome = outcome
        attempt.ended_at_s = self._clock()
        if self._running.pop(attempt.key, None) is not None:
            self._ended.append(attempt)
        self._forget_old()

    def reserved(self) -> Reserved:
        """What running attempts reserved (not those that did not fit and end at once)."""
        running = [a for a in self.running() if not a.no_room]
        return Reserved(sum(a.run.cores_mcpu for a in running), sum(a.run.memory_bytes for a in running),
                        sum(a.run.storage_bytes for a in running))

    def _forget_old(self) -> None:
        horizon = self._clock() - self._keep_ended_s
        while self._ended and (self._ended[0].ended_at_s or 0.0) < horizon:
            attempt = self._ended.popleft()
            self._attempts.pop(attempt.key, None)
            if not attempt.uploaded:
                continue  # the only copy of its log: left on disk for an operator
            path = attempt.log.path
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
                path.parent.rmdir()


async def run_attempt(runtime: ContainerRuntime, attempt: Attempt, job: JobRun,
                      on_started: Callable[[Attempt], None]) -> JobOutcome:
    """Run the attempt in the runtime, then upload its log to `attempt.log_url`.

    The log is uploaded before the caller reports the outcome, so once the
    job is final in the database its log is in storage. An upload that keeps
    failing does not change the job's outcome; it is said in the error
    message and the log stays readable on this worker for a while."""

    # The run joins the trace of the submission that created the job (the
    # driver hands its context on in RunJob.trace_context).
    with tracer.start_as_current_span(
            "job.run", context=extract(attempt.run.trace_context), kind=trace.SpanKind.CONSUMER,
            attributes={"corral.batch_id": attempt.ref.batch_id, "corral.job_id": attempt.ref.job_id,
                        "corral.attempt_id": attempt.ref.attempt_id}) as span:
        outcome = await _run_and_upload(runtime, attempt, job, on_started)
        span.set_attribute("corral.state", outcome.state)
        if outcome.exit_code is not None:
            span.set_attribute("corral.exit_code", outcome.exit_code)
        return outcome


async def _run_and_upload(runtime: ContainerRuntime, attempt: Attempt, job: JobRun,
                          on_started: Callable[[Attempt], None]) -> JobOutcome:
    async def started(pid: int) -> None:
        attempt.started_ms = wall_ms()
        on_started(attempt)

    if attempt.cancel_requested:  # CancelJob came before the task ran
        attempt.log.close()
        outcome = JobOutcome(state="Cancelled", exit_code=None, error_message="cancelled before the command started",
                             start_time_ms=None, end_time_ms=wall_ms(), end_reason=CANCELLED,
                             isolation=runtime.isolation(job))
    elif attempt.no_room:  # the system's mistake, not the job's: retried elsewhere (decide_retries)
        attempt.log.close()
        outcome = JobOutcome(state="Error", exit_code=None, error_message=attempt.no_room, start_time_ms=None,
                             end_time_ms=wall_ms(), end_reason=SYSTEM_ERROR, isolation=runtime.isolation(job))
    elif refusals := file_url_refusals(job.spec, attempt.run.storage_roots) + attempt.secret_refusals:
        # Before any runtime copies a file or mounts a secret.
        attempt.log.close()
        outcome = JobOutcome(state="Error", exit_code=None, error_message="; ".join(refusals), start_time_ms=None,
                             end_time_ms=wall_ms(), end_reason=REFUSED, isolation=runtime.isolation(job))
    else:
        outcome = await runtime.run(job, attempt.log, started)
    if not attempt.log_url:
        return outcome
    if outcome.start_time_ms is not None:  # it ran: its series ends with the end-of-attempt reading
        attempt.usage.finish(UsageSample(outcome.end_time_ms, UsageReading(
            cpu_time_ms=outcome.cpu_time_ms, peak_memory_bytes=outcome.peak_memory_bytes,
            io_read_bytes=outcome.io_read_bytes, io_write_bytes=outcome.io_write_bytes)))
        await _upload_usage(runtime, attempt)
    for attempt_no in range(1, UPLOAD_TRIES + 1):
        try:
            await attempt.log.upload(attempt.log_url)
            attempt.uploaded = True
            return outcome
        except Exception as e:  # noqa: BLE001 - any storage failure: retry, then say so
            if attempt_no == UPLOAD_TRIES:
                log.warning("could not upload the log of %s to %s: %s", attempt.key, attempt.log_url, e)
                note = f"the log could not be uploaded to {attempt.log_url}: {e}"
                return dataclasses.replace(
                    outcome, error_message=f"{outcome.error_message}; {note}" if outcome.error_message else note)
            await asyncio.sleep(0.5 * attempt_no)
    raise AssertionError("unreachable")


async def _upload_usage(runtime: ContainerRuntime, attempt: Attempt) -> None:
    """Store the series beside the log, before the outcome is reported. A series that cannot be stored
    does not change the outcome (its final reading is in the completion): it is logged, and GetAttemptUsage
    then finds none."""
    interval_ms = attempt.usage_interval_ms if attempt.usage.sampled else 0
    blob = encode(UsageHeader(runtime.name, interval_ms, attempt.usage.stride, runtime.usage_note),
                  attempt.usage.samples)
    url = usage_url(attempt.log_url)
    for attempt_no in range(1, UPLOAD_TRIES + 1):
        try:
            await asyncio.to_thread(put_bytes, blob, url)
            return
        except Exception as e:  # noqa: BLE001 - any storage failure: retry, then say so
            if attempt_no == UPLOAD_TRIES:
                log.warning("could not upload the usage series of %s to %s: %s", attempt.key, url, e)
                return
            await asyncio.sleep(0.5 * attempt_no)


def completed_event(attempt: Attempt, outcome: JobOutcome) -> ws.JobCompleted:
    """The JobCompleted the driver records for an ended attempt."""
    usage = resource_usage(outcome.cpu_time_ms, outcome.peak_memory_bytes)
    completed = ws.JobCompleted(
        attempt=attempt.ref, state=_STATES[outcome.state],
        end_reason=job_pb2.AttemptEndReason.Value("ATTEMPT_END_REASON_" + outcome.end_reason.upper()),
        error_message=outcome.error_message, end_time=timestamp(outcome.end_time_ms), resources_used=usage)
    if outcome.exit_code is not None:
        completed.exit_code = outcome.exit_code
    if outcome.start_time_ms is not None:
        completed.start_time.CopyFrom(timestamp(outcome.start_time_ms))
    return completed
