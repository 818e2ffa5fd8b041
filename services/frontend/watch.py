"""WatchBatch: a batch's event log as a resumable server stream.

The driver's publisher numbers each batch's events 1, 2, ... without gaps
(`batch_events`, docs/driver.md "Events"); this module streams them.
A stream checks the request and the caller's right to read the batch (the
rule of GetBatch, `services.frontend.access`), then, every `poll_period_s`, reads the batch's last
published id and sends the events after the last one sent, a page at a
time, in id order, with a primary-key range read. Ids at or below the last
published id are all committed, so a range is read once and never revisited:
no event is sent twice and none is skipped. The stream stays open until the
client cancels it (the client stops at BatchCompleted).

`query` filters job events with the query language over jobs. A term is
read from the event where the event has the answer: `state` is the state
the job entered, `exit_code` the event's exit code, and `instance`,
`start_time`, `end_time`, `duration` are those of the event's attempt; the
rest (attributes, `job_group`, `cost`, ...) from the job as it is now.
Batch-level events (commits, cancellations, completion) always pass; cost
events only when asked for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from google.protobuf import timestamp_pb2

from corral.batch.v1 import batch_event_pb2, batch_pb2, job_state_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from services.common.errors import FieldViolation, InvalidRequest
from services.common.identity import Principal
from services.db.database import Database
from services.frontend import query as query_language
from services.frontend.access import readable_batch
from services.frontend.batch_store import BatchStore
from services.frontend.limits import Limits

DEFAULT_POLL_PERIOD_S = 0.15
"""How often an idle stream looks for new events."""
PAGE_SIZE = 500
"""Event ids read per query."""
MAX_EVENTS_PER_MESSAGE = 1000
"""What a watch may ask for in one response (`max_events_per_message`)."""
RECHECK_ACCESS_S = 5.0
"""How often a long stream re-checks that the caller may still see the batch."""

Row = dict[str, Any]

# The events as rows over the alias `j`, with the job columns the query
# language reads (state, exit_code, attempt_id, job_group_id) taken from the
# event. MariaDB merges the derived table, so the batch_id/event_id bounds
# stay a primary-key range read.
_PAGE = """
SELECT j.* FROM (
  SELECT e.batch_id, e.event_id, e.kind, e.job_id, e.job_group_id, e.attempt_id, e.old_state,
         e.new_state AS state, e.exit_code, e.update_id, e.start_job_id, e.n_jobs, e.n_succeeded, e.n_failed,
         e.n_errored, e.n_cancelled, e.cancelled, e.cancelled_by, e.reason, e.cost_micro_usd, e.delta_micro_usd,
         e.time_ms
  FROM batch_events e) j
WHERE j.batch_id = %s AND j.event_id BETWEEN %s AND %s
  AND (j.kind <> 'job_state_changed' OR ({where}))
  AND (%s OR j.kind <> 'cost_accrued')
ORDER BY j.event_id
"""

_JOB_STATES = {
    "Pending": job_state_pb2.JOB_STATE_PENDING, "Ready": job_state_pb2.JOB_STATE_READY,
    "Creating": job_state_pb2.JOB_STATE_CREATING, "Running": job_state_pb2.JOB_STATE_RUNNING,
    "Success": job_state_pb2.JOB_STATE_SUCCEEDED, "Failed": job_state_pb2.JOB_STATE_FAILED,
    "Error": job_state_pb2.JOB_STATE_ERROR, "Cancelled": job_state_pb2.JOB_STATE_CANCELLED,
}


class EventLog:
    """Reads of the published batch events."""

    def __init__(self, db: Database):
        self.db = db

    async def last_event_id(self, batch_id: int) -> int:
        """The highest published id of the batch; 0 before its first event."""
        row = await self.db.fetchone("SELECT last_event_id FROM batch_event_sequences WHERE batch_id = %s",
                                     (batch_id,), name="batch_last_event_id")
        return 0 if row is None else int(row["last_event_id"])

    async def page(self, batch_id: int, first_id: int, last_id: int, where_sql: str, params: list[Any],
                   include_cost_events: bool) -> list[Row]:
        """Events first_id..last_id that pass the filter (`where_sql` from the query language), by id."""
        return await self.db.fetchall(
            _PAGE.format(where=where_sql), (batch_id, first_id, last_id, *params, include_cost_events),
            name="batch_events_page")


def _timestamp(ms: int) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def _cause(cancelled_by: str, reason: str) -> batch_pb2.CancellationCause.ValueType:
    # The system cancels as 'corral' and says why in the reason's first words.
    if cancelled_by == "corral" and reason.startswith("cancel_after"):
        return batch_pb2.CANCELLATION_CAUSE_FAILURE_LIMIT
    if cancelled_by == "corral" and reason.startswith("billing limit"):
        return batch_pb2.CANCELLATION_CAUSE_BILLING_LIMIT
    return batch_pb2.CANCELLATION_CAUSE_USER_REQUEST


def event_proto(row: Row) -> batch_event_pb2.BatchEvent:
    """One row of `_PAGE` as the contract's BatchEvent."""
    event = batch_event_pb2.BatchEvent(batch_id=row["batch_id"], event_id=row["event_id"],
                                       at=_timestamp(row["time_ms"]))
    kind = row["kind"]
    if kind == "job_state_changed":
        event.job_state_changed.CopyFrom(batch_event_pb2.JobStateChanged(
            job_id=row["job_id"], job_group_id=row["job_group_id"], attempt_id=row["attempt_id"] or "",
            old_state=_JOB_STATES[row["old_state"]], new_state=_JOB_STATES[row["state"]],
            exit_code=row["exit_code"], reason=row["reason"] or ""))
    elif kind == "update_committed":
        event.update_committed.CopyFrom(batch_event_pb2.UpdateCommitted(
            update_id=row["update_id"], start_job_id=row["start_job_id"], n_jobs=row["n_jobs"]))
    elif kind == "cancelled":
        event.cancelled.CopyFrom(batch_event_pb2.Cancelled(
            job_group_id=row["job_group_id"], cancellation=batch_pb2.CancellationInfo(
                cancelled_by=row["cancelled_by"], cancelled_at=_timestamp(row["time_ms"]), reason=row["reason"],
                cause=_cause(row["cancelled_by"], row["reason"]))))
    elif kind == "batch_completed":
        event.batch_completed.CopyFrom(batch_event_pb2.BatchCompleted(
            counts=batch_pb2.JobCounts(n_jobs=row["n_jobs"], n_succeeded=row["n_succeeded"], n_failed=row["n_failed"],
                                       n_errored=row["n_errored"], n_cancelled=row["n_cancelled"]),
            cancelled=bool(row["cancelled"]), cost_micro_usd=row["cost_micro_usd"]))
    elif kind == "cost_accrued":
        event.cost_accrued.CopyFrom(batch_event_pb2.CostAccrued(
            cost_micro_usd=row["cost_micro_usd"], delta_micro_usd=row["delta_micro_usd"]))
    else:
        raise ValueError(f"unknown event kind {kind!r}")
    return event


class BatchWatcher:
    """Serves WatchBatch for the BatchServicer."""

    def __init__(self, batches: BatchStore, poll_period_s: float = DEFAULT_POLL_PERIOD_S, page_size: int = PAGE_SIZE,
                 recheck_access_s: float = RECHECK_ACCESS_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 clock_s: Callable[[], float] = time.monotonic, limits: Limits = Limits()):
        self.batches = batches
        self.limits = limits
        self.log = EventLog(batches.db)
        self.poll_period_s = poll_period_s
        self.page_size = page_size
        self.recheck_access_s = recheck_access_s
        self._sleep = sleep
        self._clock_s = clock_s
        self.active_watches = 0
        """Streams being served (a gauge; tests check that streams end)."""

    async def _check_visible(self, batch_id: int, principal: Principal) -> None:
        await readable_batch(self.batches, batch_id, principal)  # GetBatch's rule

    async def watch(self, request: pb.WatchBatchRequest, principal: Principal) -> AsyncIterator[pb.WatchBatchResponse]:
        """Events of the batch from `request.from_event_id` on, until the caller cancels (or, with
        `until_complete`, until the first batch_completed event is sent)."""
        violations = []
        if request.from_event_id < 0:
            violations.append(FieldViolation("from_event_id", "must not be negative"))
        if not 0 <= request.max_events_per_message <= MAX_EVENTS_PER_MESSAGE:
            violations.append(FieldViolation("max_events_per_message",
                                             f"must be between 0 and {MAX_EVENTS_PER_MESSAGE}"))
        per_message = max(1, request.max_events_per_message)
        where_sql, params = "TRUE", []
        try:
            where_sql, params = query_language.to_sql(query_language.parse(
                request.query, "jobs", self.limits.max_query_bytes, self.limits.max_query_terms))
        except query_language.QuerySyntaxError as e:
            violations.append(FieldViolation("query", e.description))
        if violations:
            raise InvalidRequest(violations)
        batch_id = request.batch_id
        await self._check_visible(batch_id, principal)
        next_id = max(1, request.from_event_id)
        checked_s = self._clock_s()
        self.active_watches += 1
        try:
            while True:
                last_id = await self.log.last_event_id(batch_id)
                while next_id <= last_id:
                    upto = min(last_id, next_id + self.page_size - 1)
                    events = [event_proto(row) for row in await self.log.page(
                        batch_id, next_id, upto, where_sql, params, request.include_cost_events)]
                    # With until_complete, the stream ends with the first batch_completed.
                    last = (next((i for i, e in enumerate(events) if e.HasField("batch_completed")), None)
                            if request.until_complete else None)
                    if last is not None:
                        events = events[:last + 1]
                    for start in range(0, len(events), per_message):
                        yield (pb.WatchBatchResponse(event=events[start]) if per_message == 1 else
                               pb.WatchBatchResponse(events=events[start:start + per_message]))
                    if last is not None:
                        return
                    next_id = upto + 1
                await self._sleep(self.poll_period_s)
                if self._clock_s() - checked_s >= self.recheck_access_s:
                    # A member removed from the billing project stops seeing the batch.
                    await self._check_visible(batch_id, principal)
                    checked_s = self._clock_s()
        finally:
            self.active_watches -= 1
