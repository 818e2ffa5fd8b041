"""Where the frontend reads an attempt's usage series: from its worker
while it runs (WorkerService.GetAttemptUsage, through
`services.frontend.logs.WorkerLogs`), and once it ended from the blob the
worker stores beside the attempt's main log,
`{spec_root_url}/logs/{batch_id}/{job_id}/{attempt_id}/usage.jsonl` (the
format is services/common/usage_series.py); and how either becomes a
GetAttemptUsageResponse. A running attempt whose worker cannot be reached
gets the last sample its worker reported (the database's), and says so.
"""

from __future__ import annotations

import asyncio
import posixpath
import re
from typing import Any

import fsspec
import grpc

from corral.batch.v1 import job_service_pb2 as pb
from services.common.errors import FieldViolation, InvalidRequest, RequestError
from services.common.usage_protos import interval_proto, sample_proto
from services.common.usage_series import FILE_NAME, BadUsageBlob, UsageHeader, UsageSample, decode, thinned
from services.frontend.job_protos import attempt_proto

MAX_SAMPLES = 1000
"""Most samples in a response; a longer stored series is thinned evenly."""
MAX_BLOB_BYTES = 4 * 2**20
"""A stored series larger than this is refused: a worker caps its series far below (720 samples, ~100 KiB)."""
ATTEMPT_ID = re.compile(r"[A-Za-z0-9_-]{0,40}")


class UsageUnreadable(RequestError):
    """The stored series is there but cannot be served (too large, or not a series)."""

    code = grpc.StatusCode.DATA_LOSS


def check_attempt_id(attempt_id: str) -> None:
    """Refuse an attempt id no attempt can have (it also names a path in storage)."""
    if not ATTEMPT_ID.fullmatch(attempt_id):
        raise InvalidRequest(FieldViolation("attempt_id", "at most 40 letters, digits, '-' or '_'"))


class StoredUsage:
    """Usage series of ended attempts under `{root_url}/logs/`."""

    def __init__(self, root_url: str):
        self._fs, self._root = fsspec.core.url_to_fs(root_url)

    def path(self, batch_id: int, job_id: int, attempt_id: str) -> str:
        """Where the worker stores the attempt's series."""
        return posixpath.join(self._root, "logs", str(batch_id), str(job_id), attempt_id, FILE_NAME)

    def _read(self, path: str) -> bytes | None:
        try:
            if int(self._fs.size(path)) > MAX_BLOB_BYTES:
                raise UsageUnreadable(f"the stored usage series at {path} is over {MAX_BLOB_BYTES} bytes")
            with self._fs.open(path, "rb") as f:
                return f.read(MAX_BLOB_BYTES + 1)
        except FileNotFoundError:
            return None

    async def read(self, batch_id: int, job_id: int, attempt_id: str) -> tuple[UsageHeader, list[UsageSample]] | None:
        """The stored series; None if there is none (yet)."""
        blob = await asyncio.to_thread(self._read, self.path(batch_id, job_id, attempt_id))
        if blob is None:
            return None
        try:
            return decode(blob)
        except BadUsageBlob as e:
            raise UsageUnreadable(f"the stored usage series of attempt {attempt_id} is unreadable: {e}") from None


def live_response(attempt: dict[str, Any], live: Any) -> pb.GetAttemptUsageResponse:
    """The response for a running attempt from its worker's WorkerService GetAttemptUsageResponse."""
    samples = thinned(list(live.samples), MAX_SAMPLES)
    return pb.GetAttemptUsageResponse(attempt_id=attempt["attempt_id"], complete=live.complete,
                                      summary=attempt_proto(attempt).resources_used, samples=samples,
                                      interval=live.interval if live.HasField("interval") else None,
                                      runtime=live.runtime, note=live.note)


def usage_response(attempt: dict[str, Any], series: tuple[UsageHeader, list[UsageSample]] | None
                   ) -> pb.GetAttemptUsageResponse:
    """The response for an attempt row (JobReadStore.attempt) and its stored series, if any."""
    complete = attempt["end_time_ms"] is not None
    response = pb.GetAttemptUsageResponse(attempt_id=attempt["attempt_id"], complete=complete,
                                          summary=attempt_proto(attempt).resources_used)
    if series is not None:
        header, samples = series
        response.runtime, response.note = header.runtime, header.note
        if (interval := interval_proto(header.interval_ms)) is not None:
            response.interval.CopyFrom(interval)
        response.samples.extend(sample_proto(s) for s in thinned(samples, MAX_SAMPLES))
    elif not complete:
        response.note = ("the attempt is running and its worker cannot be reached for its series; the summary is "
                         "the last sample its worker reported")
    elif attempt["start_time_ms"] is None:
        response.note = "the attempt never started: nothing was sampled"
    else:
        response.note = ("no usage series was stored for this attempt (its worker was lost, could not store it, "
                         "or predates usage series)")
    return response
