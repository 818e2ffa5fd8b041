"""Recording what a worker reports on its session, many events per procedure call.

A worker sends JobStarted, JobCompleted and heartbeats one message at a time.
Recording each with its own procedure calls costs several round trips and a
commit per job, which capped a whole system at a few dozen jobs a second.
The session instead reads messages as they come and records, in one pass,
everything that arrived while the previous pass ran: one bulk MJS (which also
records what each started attempt uses), one bulk MJC and one heartbeat rollup
per pass. Under load the passes grow; when idle each holds
one event and nothing waits.

The passes of all of a driver's sessions are recorded together: while one
combined pass runs, the passes that arrive wait, and the next takes them all
(up to MAX_EVENTS_PER_CALL events), with one MJS and one MJC for every
worker, each row naming its instance. Per-call cost is most of what these
procedures cost at a few events per call, so a fleet pays it once per pass
rather than once per worker. Two sessions that report the same attempt or
job (a lost worker's attempt and its retry's) go in separate calls. If a
combined pass fails, each of its sessions' passes is recorded again alone,
so that one worker's events (or a refused call) fail only its own session;
what the combined call committed repeats as a no-op. At the driver's stop the
pass under way has CLOSE_WAIT_S to finish and is then cancelled (`close`).

Within a pass, starts are recorded before completions (MJC before MJS is
harmless, but in order is cheaper) and each event is acknowledged only after
its procedure committed, so a worker re-sends what a broken session lost and
the repeat is a no-op. Heartbeats are acknowledged as well: those acks are
how a worker knows its driver is still there.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from corral.batch.v1 import job_pb2, job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from services.driver.store import DriverStore

log = logging.getLogger(__name__)

_FINAL = {job_state_pb2.JOB_STATE_SUCCEEDED: "Success", job_state_pb2.JOB_STATE_FAILED: "Failed",
          job_state_pb2.JOB_STATE_ERROR: "Error", job_state_pb2.JOB_STATE_CANCELLED: "Cancelled"}

# MJS outcomes of an attempt that must not run: its job's group (or an
# ancestor) is cancelled, or the job is already final. The worker is told at
# once, even if the RunJob was still in flight when the batch was cancelled.
STOP_AT_START = {"cancelled": "its job group or batch was cancelled",
                 "already_complete": "its job is already complete"}
"""MJS outcomes after which the attempt must not run, and what CancelJob tells the worker."""

MAX_ERROR_MESSAGE_CHARS = 8000
MAX_ISOLATION_CHARS = 512
"""attempts.isolation is a VARCHAR(512) (migration 0006), which mark_jobs_started fills with LEFT(..., 512)."""
MAX_EVENTS_PER_PASS = 500
"""Events one session's pass takes at most."""
MAX_EVENTS_PER_CALL = 2000
"""Events of several sessions' passes recorded together at most (bounds one procedure call's payload);
a single pass larger than this still goes in alone."""
CLOSE_WAIT_S = 2.0
"""How long the driver's stop waits for a combined pass under way before cancelling it."""


@dataclasses.dataclass
class Recorded:
    """What a pass did: events to acknowledge and attempts to stop."""

    acks: list[int] = dataclasses.field(default_factory=list)
    """Event ids of JobStarted/JobCompleted/Heartbeat now durable."""
    stop: list[tuple[dict[str, Any], str]] = dataclasses.field(default_factory=list)
    """(attempt ref, reason) of starts refused by MJS: the driver sends CancelJob."""
    started: int = 0
    completed: int = 0


def cut_at_word(text: str, max_chars: int) -> str:
    """`text` in at most `max_chars` characters: whole, or cut after its last whole word that fits, with " ..."
    saying so. The runtime's isolation note is longer than its column, and the database's own cut ended it
    mid-word ("ran as: ... and the rest of the host's fi")."""
    if len(text) <= max_chars:
        return text
    kept = text[:max_chars - 4]
    if not text[max_chars - 4].isspace() and " " in kept:
        kept = kept[:kept.rindex(" ")]
    return kept.rstrip(" ,;:") + " ..."


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


@dataclasses.dataclass
class _Pass:
    """One session's pass, waiting to be recorded."""

    epoch: int
    instance: str
    messages: Sequence[pb.WorkerSessionRequest]
    done: asyncio.Future[Recorded]


def _rounds(rows: Sequence[tuple[int, dict[str, Any]]], key: Callable[[dict[str, Any]], tuple]
            ) -> list[list[tuple[int, dict[str, Any]]]]:
    """`rows` split into as few calls as keep each key once per call, in order (two sessions can
    report the same job: a lost worker's attempt and its retry's)."""
    rounds: list[list[tuple[int, dict[str, Any]]]] = []
    seen: list[set[tuple]] = []
    for row in rows:
        k = key(row[1])
        n = next((n for n, keys in enumerate(seen) if k not in keys), len(rounds))
        if n == len(rounds):
            rounds.append([])
            seen.append(set())
        rounds[n].append(row)
        seen[n].add(k)
    return rounds


def _tagged_rows(parts: Sequence[_Pass], messages: Sequence[Sequence[pb.WorkerSessionRequest]],
                 row_of: Callable[[pb.WorkerSessionRequest], dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    """Each part's messages as procedure rows naming the part's instance, tagged with the part's index; a
    repeat of an attempt within one pass is recorded once."""
    rows: list[tuple[int, dict[str, Any]]] = []
    for i, (part, mine) in enumerate(zip(parts, messages)):
        by_key: dict[tuple, dict[str, Any]] = {}
        for m in mine:
            row = {**row_of(m), "instance_name": part.instance}
            by_key.setdefault(_attempt_key(row), row)
        rows += [(i, row) for row in by_key.values()]
    return rows


def _attempt_key(row: dict[str, Any]) -> tuple:
    return row["batch_id"], row["job_id"], row["attempt_id"]


def _job_key(row: dict[str, Any]) -> tuple:
    return row["batch_id"], row["job_id"]


class WorkerEvents:
    """Records passes of one driver's worker events (see the module docstring)."""

    def __init__(self, store: DriverStore, on_change: Callable[[str], None],
                 on_ended: Callable[[Sequence[dict[str, Any]]], None] = lambda jobs: None):
        self._store = store
        self._on_change = on_change
        self._on_ended = on_ended
        """Called with MJC's outcome rows of the jobs whose attempts just left Running for a final state
        (user, inst_coll, cores_mcpu), before on_change."""
        self._waiting: list[_Pass] = []
        self._recording: asyncio.Task[None] | None = None
        self.calls = 0
        """Combined passes recorded (for tests and benchmarks)."""

    async def record(self, epoch: int, instance: str, messages: Sequence[pb.WorkerSessionRequest]) -> Recorded:
        """Record the job events and heartbeats among `messages` (other kinds are the caller's), in the
        next combined pass: with the passes of every session that arrive while the one before runs."""
        part = _Pass(epoch, instance, messages, asyncio.get_running_loop().create_future())
        self._waiting.append(part)
        if self._recording is None:
            self._recording = asyncio.create_task(self._record_waiting())
        return await part.done

    async def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """At the driver's stop, once its sessions have ended: let the combined pass under way finish for up
        to `wait_s`, then cancel it. A pass not recorded fails its session; its worker sends the events
        again to the next leader, where what did commit repeats as a no-op."""
        task = self._recording
        if task is None:
            return
        _, pending = await asyncio.wait({task}, timeout=wait_s)
        if pending:
            log.warning("a combined pass of worker events was still being recorded after %.1f s; cancelled", wait_s)
            task.cancel()
            await asyncio.wait({task})

    async def _record_waiting(self) -> None:
        taken: list[_Pass] = []
        try:
            while self._waiting:
                taken, n = [], 0
                while self._waiting and (not taken or n + len(self._waiting[0].messages) <= MAX_EVENTS_PER_CALL):
                    n += len(self._waiting[0].messages)
                    taken.append(self._waiting.pop(0))
                for epoch in dict.fromkeys(p.epoch for p in taken):  # one epoch, unless it just changed
                    await self._record_alone_if_refused(epoch, [p for p in taken if p.epoch == epoch])
        finally:
            self._recording = None
            for part in taken + self._waiting:  # cancelled: the driver stops
                if not part.done.done():
                    part.done.set_exception(RuntimeError("the driver stopped before recording the events"))
            self._waiting = []

    async def _record_alone_if_refused(self, epoch: int, parts: list[_Pass]) -> None:
        try:
            results = await self._record_together(epoch, parts)
        except Exception as e:  # noqa: BLE001 - its sessions hear of it
            if len(parts) == 1:
                _settle(parts[0].done, error=e)
                return
            # One session's events can refuse a call (or the leader stepped down): each pass again alone,
            # so that only its own session fails. What the combined call did commit repeats as a no-op.
            log.warning("recording %d sessions' events together failed (%s); each alone", len(parts), e)
            for part in parts:
                try:
                    _settle(part.done, (await self._record_together(epoch, [part]))[0])
                except Exception as alone:  # noqa: BLE001 - its session hears of it
                    _settle(part.done, error=alone)
            return
        for part, result in zip(parts, results):
            _settle(part.done, result)

    async def _record_together(self, epoch: int, parts: Sequence[_Pass]) -> list[Recorded]:
        """One MJS and one MJC for the starts and completions of all `parts` (more where two name the
        same attempt or job), then each instance's heartbeat rollup."""
        self.calls += 1
        outs = [Recorded() for _ in parts]
        kinds = [[m.WhichOneof("payload") for m in part.messages] for part in parts]
        starts = [[m for m, kind in zip(part.messages, ks) if kind == "job_started"] for part, ks in zip(parts, kinds)]
        completions = [[m for m, kind in zip(part.messages, ks) if kind == "job_completed"]
                       for part, ks in zip(parts, kinds)]
        if any(starts):
            await self._record_starts(epoch, parts, starts, outs)
            self._on_change("job_started")
        if any(completions):
            await self._record_completions(epoch, parts, completions, outs)
        for part, ks, out in zip(parts, kinds, outs):
            heartbeats = [m for m, kind in zip(part.messages, ks) if kind == "heartbeat"]
            if heartbeats:  # even without rollups: it says the instance is alive
                await self._store.heartbeat_rollup(epoch, part.instance, _rollups(heartbeats))
                # Acknowledged once recorded: the worker hears its driver at every heartbeat, and one it
                # no longer hears from (paused, cut off from the database) is left for the leader.
                out.acks += [m.event_id for m in heartbeats]
        return outs

    async def _record_starts(self, epoch: int, parts: Sequence[_Pass],
                             starts: list[list[pb.WorkerSessionRequest]], outs: list[Recorded]) -> None:
        # MJS also records what each started attempt uses (the job's reservation), at the prices of the
        # instance's products in force now.
        rows = _tagged_rows(parts, starts, lambda m: {
            **_ref(m.job_started.attempt), "start_time_ms": m.job_started.start_time.ToMilliseconds(),
            "isolation": cut_at_word(m.job_started.isolation, MAX_ISOLATION_CHARS), "image_digest": m.job_started.image_digest})
        for call in _rounds(rows, _attempt_key):
            status = await self._store.mark_jobs_started(epoch, parts[call[0][0]].instance, [r for _, r in call],
                                                         instance_products=True)
            outcomes = {_attempt_key(o): o["outcome"] for o in status["outcomes"]}
            for i, row in call:
                outcome = outcomes.get(_attempt_key(row), "not_found")
                if outcome in STOP_AT_START:
                    outs[i].stop.append(({k: row[k] for k in ("batch_id", "job_id", "attempt_id")},
                                         STOP_AT_START[outcome]))
        for out, messages in zip(outs, starts):
            out.acks += [m.event_id for m in messages]
            out.started = len(messages)

    async def _record_completions(self, epoch: int, parts: Sequence[_Pass],
                                  completions: list[list[pb.WorkerSessionRequest]], outs: list[Recorded]) -> None:
        rows = _tagged_rows(parts, completions, lambda m: _completion_row(m.job_completed))
        ended, moved = [], 0
        for call in _rounds(rows, _job_key):
            done = await self._store.mark_jobs_complete_status(epoch, parts[call[0][0]].instance,
                                                               [r for _, r in call])
            ended += [o for o in done["outcomes"] if o["outcome"] == "completed" and o["user"] is not None]
            # Only their ends, or more: children made Ready or queued for the releaser, or an attempt retried.
            moved += done["n_ready_children"] or done["n_queued"] or done["n_retried"]
        for out, messages in zip(outs, completions):
            out.acks += [m.event_id for m in messages]
            out.completed = len(messages)
        self._on_ended(ended)
        self._on_change("job_completed" if moved else "job_ended")


def _rollups(heartbeats: Sequence[pb.WorkerSessionRequest]) -> list[dict[str, Any]]:
    """A pass's heartbeats as heartbeat_rollup's rows: each attempt's latest rollup and usage sample."""
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
    return [{"batch_id": b, "job_id": j, "attempt_id": a, **row} for (b, j, a), row in rollups.items()]


def _settle(done: asyncio.Future[Recorded], result: Recorded | None = None, error: Exception | None = None) -> None:
    """Give a waiting session its pass's result (unless it stopped waiting)."""
    if done.done():
        return
    if error is not None:
        done.set_exception(error)
    else:
        done.set_result(result)
