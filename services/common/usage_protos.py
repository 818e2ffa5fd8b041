"""Usage samples (services/common/usage_series.py) as `corral.batch.v1.UsageSample` messages: the worker
serves its live series with them, the frontend its stored ones."""

from __future__ import annotations

from google.protobuf import duration_pb2, timestamp_pb2

from corral.batch.v1 import job_pb2
from services.common.usage_series import UsageSample


def sample_proto(sample: UsageSample) -> job_pb2.UsageSample:
    """One sample; a counter the runtime could not read is left unset."""
    reading = sample.reading
    at = timestamp_pb2.Timestamp()
    at.FromMilliseconds(sample.at_ms)
    out = job_pb2.UsageSample(at=at, memory_bytes=reading.memory_bytes, peak_memory_bytes=reading.peak_memory_bytes,
                              io_read_bytes=reading.io_read_bytes, io_write_bytes=reading.io_write_bytes)
    if reading.cpu_time_ms is not None:
        out.cpu_time.FromMilliseconds(reading.cpu_time_ms)
    return out


def interval_proto(interval_ms: int) -> duration_pb2.Duration | None:
    """A sampling interval; None for 0 (nothing was sampled periodically)."""
    if interval_ms <= 0:
        return None
    out = duration_pb2.Duration()
    out.FromMilliseconds(interval_ms)
    return out
