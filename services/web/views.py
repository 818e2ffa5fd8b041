"""What the pages show, in people's units: money, durations, times, sizes and state names; each is also a
template filter (FILTERS)."""

from __future__ import annotations

import math
import time

from google.protobuf import timestamp_pb2

from corral.batch.v1 import batch_pb2, job_group_pb2, job_state_pb2
from corral.batch.v1.job_pb2 import AttemptEndReason
from corral.sizes import binary_size
from services.web.drawing.clock import utc

JOB_STATES = ("pending", "ready", "creating", "running", "succeeded", "failed", "error", "cancelled")
"""Job states in the order the pages list them (the JobState names, lower case)."""
COUNT_FIELDS = {"pending": "n_pending", "ready": "n_ready", "running": "n_running", "succeeded": "n_succeeded",
                "failed": "n_failed", "error": "n_errored", "cancelled": "n_cancelled"}
"""A batch's or group's counts (JobCounts) by state name ('creating' is counted as running)."""


def job_state(value: int) -> str:
    return job_state_pb2.JobState.Name(value).removeprefix("JOB_STATE_").lower()


def batch_state(batch: batch_pb2.Batch | job_group_pb2.JobGroup) -> str:
    """open, running, cancelled, success or failure: what the batch list says of a batch (or a job group)."""
    counts = batch.counts
    if batch.cancellation.cause:
        return "cancelled"
    if batch.state == batch_pb2.BATCH_STATE_COMPLETE:
        return "failure" if counts.n_failed or counts.n_errored else "success"
    return batch_pb2.BatchState.Name(batch.state).removeprefix("BATCH_STATE_").lower()


def counts(job_counts: batch_pb2.JobCounts) -> dict[str, int]:
    """Counts by state name, and 'total'."""
    found = {state: getattr(job_counts, field) for state, field in COUNT_FIELDS.items()}
    return {**found, "total": job_counts.n_jobs}


def end_reason(value: int) -> str:
    if not value:
        return ""
    return AttemptEndReason.Name(value).removeprefix("ATTEMPT_END_REASON_").lower().replace("_", " ")


def usd(micro_usd: int | None) -> str:
    if micro_usd is None:
        return "no limit"
    usd_value = micro_usd / 1e6
    if 0 < abs(usd_value) < 0.0001:
        return "< $0.0001"
    if 0 < abs(usd_value) < 0.01:
        return f"${usd_value:.4f}"
    return f"${usd_value:,.2f}"


def usd_axis(usd_value: float) -> str:
    """Dollars on a chart's axis: cents, or as many places as a small amount needs to show."""
    if usd_value == 0 or abs(usd_value) >= 0.01:
        return f"${usd_value:,.2f}"
    places = min(8, 1 - math.floor(math.log10(abs(usd_value))))
    return f"${usd_value:.{places}f}"


def seconds_of(stamp: timestamp_pb2.Timestamp | None) -> float | None:
    """A Timestamp in epoch seconds, None when unset (seconds and nanos both 0)."""
    if stamp is None or (stamp.seconds == 0 and stamp.nanos == 0):
        return None
    return stamp.seconds + stamp.nanos / 1e9


def when(stamp: timestamp_pb2.Timestamp | None) -> str:
    seconds = seconds_of(stamp)
    return "" if seconds is None else utc(seconds) + " UTC"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def span(start: timestamp_pb2.Timestamp | None, end: timestamp_pb2.Timestamp | None) -> str:
    """From start to end, or to now when it has not ended."""
    begun = seconds_of(start)
    if begun is None:
        return ""
    ended = seconds_of(end)
    return duration((ended if ended is not None else time.time()) - begun)


def size(n_bytes: int | None) -> str:
    """Bytes as the CLI says them ('4 GiB', '2.7 MiB')."""
    return "" if n_bytes is None else binary_size(n_bytes)


def cores(mcpu: int) -> str:
    return f"{mcpu / 1000:g}"


FILTERS = {"usd": usd, "when": when, "duration": duration, "size": size, "job_state": job_state,
           "end_reason": end_reason, "cores": cores}
