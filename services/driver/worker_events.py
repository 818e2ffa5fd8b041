"""Recording what a worker reports on its session, many events per procedure call.

A worker sends JobStarted, JobCompleted and heartbeats one message at a time.
Recording each with its own procedure calls costs several round trips and a
commit per job, which capped a whole system at a few dozen jobs a second.
The session instead reads messages as they come and records, in one pass,
everything that arrived while the previous pass ran: one bulk MJS (which also
records what each started attempt uses), one bulk MJC and one heartbeat rollup
per pass. Under load the passes grow; when idle each holds
one event and nothing waits.

Within a pass, starts are recorded before completions (MJC before MJS is
harmless, but in order is cheaper) and each event is acknowledged only after
its procedure committed, so a worker re-sends what a broken session lost and
the repeat is a no-op. Heartbeats are acknowledged as well: those acks are
how a worker knows its driver is still there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from corral.batch.v1 import job_pb2, job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from services.db.store import JobStore

_FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED: "Success", job_state_pb2.JOB_STATE_FAILED: "Failed",
          job_state_pb2.JOB_STATE_ERROR: "Error", job_state_pb2.JOB_STATE_CANCELLED: "Cancelled"}

# MJS outcomes of an attempt that must not run: its job's group (or an
# ancestor) is cancelled, or the job is already final. The worker is told at
# once, even if the RunJob was still in flight when the batch was cancelled.
STOP_AT_START = {"cancelled": "its job group or batch was cancelled",
                 "already_complete": "its job is already complete"}
"""MJS outcomes after which the attempt must not run, and what CancelJob tells the worker."""

MAX_ERROR_MESSAGE_CHARS = 8000
MAX_EVENTS_PER_PASS = 500
"""Events recorded in one pass at most (bounds one procedure call's payload)."""


@dataclasses.dataclass
class Recorded:
    """What a pass did: events to acknowledge and attempts to stop."""

    acks: list[int] = dataclasses.field(default_factory=list)
    """Event ids of JobStarted/JobCompleted/Heartbeat now durable."""
    stop: list[tuple[dict[str, Any], str]] = dataclasses.field(default_factory=list)
    """(attempt ref, reason) of starts refused by MJS: the driver sends CancelJob."""
    started: int = 0
    completed: int = 0


def _ref(attempt: Any) -> dict[str, Any]:
    return {"batch_id": attempt.batch_id, "job_id": attempt.job_id, "attempt_id": attempt.attempt_id}


def _completion_row(done: Any) -> dict[str, Any]:
    return {
        **_ref(done.attempt),
        "state": _FINAL.get(done.state, "Error"),
        "exit_code": done.exit_code if done.HasField("exit_code") else None,
        "error_message": done.error_message[:MAX_ERROR_MESSAGE_CHARS] or None,
        "cpu_time_ms": done.resources_used.cpu_time.ToMilliseconds() if done.resources_used.HasField("cpu_time")
        else None,
        "peak_memory_bytes": done.resources_used.peak_memory_bytes or None,
        "start_time_ms": done.start_time.ToMilliseconds() if done.HasField("start_time") else None,
        "end_time_ms": done.end_time.ToMilliseconds() if done.HasField("end_time") else None,
        "reason": job_pb2.AttemptEndReason.Name(done.end_reason).removeprefix("ATTEMPT_END_REASON_").lower()
        if done.end_reason else "completed",
    }


class WorkerEvents:
    """Records passes of one driver's worker events (see the module docstring)."""

    def __init__(self, store: JobStore, on_change: Callable[[str], None],
                 on_ended: Callable[[Sequence[dict[str, Any]]], None] = lambda jobs: None):
        self._store = store
        self._on_change = on_change
        self._on_ended = on_ended
        """Called with MJC's outcome rows of the jobs whose attempts just left Running for a final state
        (user, inst_coll, cores_mcpu), before on_change."""

    async def record(self, epoch: int, instance: str, messages: Sequence[pb.WorkerSessionRequest]) -> Recorded:
        """Record the job events and heartbeats among `messages` (other kinds are the caller's)."""
        out = Recorded()
        starts = [m for m in messages if m.WhichOneof("payload") == "job_started"]
        completions = [m for m in messages if m.WhichOneof("payload") == "job_completed"]
        heartbeats = [m for m in messages if m.WhichOneof("payload") == "heartbeat"]
        rollups: dict[tuple[int, int, str], dict[str, Any]] = {}
        for m in heartbeats:
            for r in m.heartbeat.rollups:
                key = (r.attempt.batch_id, r.attempt.job_id, r.attempt.attempt_id)
                row = rollups.setdefault(key, {"rollup_time_ms": 0})
                row["rollup_time_ms"] = max(row["rollup_time_ms"], r.rollup_time.ToMilliseconds())
                # The worker's latest sample, for users to read while it runs (billing stays on the reservation).
                if r.usage.HasField("cpu_time"):
                    row["cpu_time_ms"] = max(row.get("cpu_time_ms", 0), r.usage.cpu_time.ToMilliseconds())
                if r.usage.peak_memory_bytes:
                    row["peak_memory_bytes"] = max(row.get("peak_memory_bytes", 0), r.usage.peak_memory_bytes)
        if starts:
            await self._record_starts(epoch, instance, starts, out)
            self._on_change("job_started")
        if completions:
            rows = {}
            for m in completions:  # a repeat within one pass is recorded once
                row = _completion_row(m.job_completed)
                rows.setdefault((row["batch_id"], row["job_id"], row["attempt_id"]), row)
            done = await self._store.mark_jobs_complete_status(epoch, instance, list(rows.values()))
            out.acks += [m.event_id for m in completions]
            out.completed = len(completions)
            self._on_ended([o for o in done["outcomes"] if o["outcome"] == "completed" and o["user"] is not None])
            # Only their ends, or more: children made Ready or queued for the releaser, or an attempt retried.
            moved = done["n_ready_children"] or done["n_queued"] or done["n_retried"]
            self._on_change("job_completed" if moved else "job_ended")
        if heartbeats:  # even without rollups: it says the instance is alive
            await self._store.heartbeat_rollup(epoch, instance, [
                {"batch_id": b, "job_id": j, "attempt_id": a, **row} for (b, j, a), row in rollups.items()])
            # Acknowledged once recorded: the worker hears its driver at every heartbeat, and one it
            # no longer hears from (paused, cut off from the database) is left for the leader.
            out.acks += [m.event_id for m in heartbeats]
        return out

    async def _record_starts(self, epoch: int, instance: str, starts: Sequence[pb.WorkerSessionRequest],
                             out: Recorded) -> None:
        by_key = {}
        for m in starts:  # a repeat within one pass is recorded once
            # MJS also records what each started attempt uses per millisecond (the job's reservation), at
            # the prices of the instance's products in force now.
            row = {**_ref(m.job_started.attempt), "start_time_ms": m.job_started.start_time.ToMilliseconds(),
                   "isolation": m.job_started.isolation}
            by_key.setdefault((row["batch_id"], row["job_id"], row["attempt_id"]), row)
        rows = list(by_key.values())
        status = await self._store.mark_jobs_started(epoch, instance, rows, instance_products=True)
        outcomes = {(o["batch_id"], o["job_id"], o["attempt_id"]): o["outcome"] for o in status["outcomes"]}
        for row in rows:
            outcome = outcomes.get((row["batch_id"], row["job_id"], row["attempt_id"]), "not_found")
            if outcome in STOP_AT_START:
                out.stop.append(({k: row[k] for k in ("batch_id", "job_id", "attempt_id")}, STOP_AT_START[outcome]))
        out.acks += [m.event_id for m in starts]
        out.started = len(starts)
