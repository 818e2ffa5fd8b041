"""Streams waiting on jobs to change, served by one read a period for all of them.

A stream that follows a job's log (StreamJobLog without an attempt id,
`services.frontend.log_follow`) waits on what only the driver changes: the
job's first attempt, its worker taking it, the attempt's end, a retry, the
final state. The driver tells the frontend none of these, and the batch
event log lags them by the publisher's period and stops with the driver, so
the frontend reads the job rows themselves. A waiting stream must neither
hold a database connection nor read on its own: `JobChanges` keeps the jobs
that streams wait on and reads all of them with one primary-key statement
every `period_s`, waking each stream whose job differs from what it last
saw. Nothing is read while no stream waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from services.db.database import Database

log = logging.getLogger(__name__)

FINAL_STATES = frozenset({"Success", "Failed", "Error", "Cancelled"})
"""Job states nothing leaves."""
DEFAULT_PERIOD_S = 0.25
"""How often the jobs that streams wait on are read (the longest a change waits to be seen)."""
MAX_JOBS_PER_READ = 500
"""Jobs read by one statement; more waiting jobs take several."""

Key = tuple[int, int]
"""(batch_id, job_id)."""
Snapshot = dict[str, Any]
"""A job as a follower sees it: state, attempt_id, and that attempt's start_time_ms, end_time_ms,
instance_name, instance_state and ip_address (None without an attempt), the columns `live_address` reads."""

_SELECT = """
SELECT j.batch_id, j.job_id, j.state, j.attempt_id, a.start_time_ms, a.end_time_ms, a.instance_name,
       i.state AS instance_state, i.ip_address
FROM jobs j
LEFT JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id AND a.attempt_id = j.attempt_id
LEFT JOIN instances i ON i.name = a.instance_name
WHERE {keys}
"""


def live_address(attempt: dict[str, Any]) -> str | None:
    """The worker to ask for an attempt's log while it runs on an active instance (an attempt row, or a
    Snapshot of its job); None once it ended, or before its instance is active."""
    if attempt["end_time_ms"] is None and attempt["instance_state"] == "active" and attempt["ip_address"]:
        return str(attempt["ip_address"])
    return None


_SNAPSHOT_COLUMNS = ("state", "attempt_id", "start_time_ms", "end_time_ms", "instance_name", "instance_state",
                     "ip_address")


def snapshot_of(row: dict[str, Any]) -> Snapshot:
    """A row of `_SELECT` as a Snapshot."""
    return {k: row[k] for k in _SNAPSHOT_COLUMNS}


class JobChanges:
    """See the module docstring. One per frontend process, shared by its JobServicers."""

    def __init__(self, db: Database, period_s: float = DEFAULT_PERIOD_S, max_jobs_per_read: int = MAX_JOBS_PER_READ):
        self._db = db
        self.period_s = period_s
        self._max_jobs_per_read = max_jobs_per_read
        self._waiting: dict[Key, list[tuple[Snapshot, asyncio.Future[Snapshot]]]] = {}
        self._someone_waits = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.reads = 0
        """Statements run for waiting streams (tests check it is per period, not per stream)."""

    @property
    def waiting_jobs(self) -> frozenset[Key]:
        """The jobs some stream waits on now."""
        return frozenset(self._waiting)

    async def _read(self, keys: list[Key]) -> dict[Key, Snapshot]:
        where = " OR ".join(["(j.batch_id = %s AND j.job_id = %s)"] * len(keys))
        rows = await self._db.fetchall(_SELECT.format(keys=where), tuple(v for key in keys for v in key),
                                       name="waiting_jobs")
        self.reads += 1
        return {(int(r["batch_id"]), int(r["job_id"])): snapshot_of(r) for r in rows}

    async def now(self, batch_id: int, job_id: int) -> Snapshot | None:
        """The job as it is now (one read of its own), or None if there is no such job."""
        return (await self._read([(batch_id, job_id)])).get((batch_id, job_id))

    async def changed(self, batch_id: int, job_id: int, seen: Snapshot, timeout_s: float) -> Snapshot:
        """The job once it differs from `seen`, or `seen` itself after `timeout_s` without a change."""
        key = (batch_id, job_id)
        waiter: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        entry = (seen, waiter)
        self._waiting.setdefault(key, []).append(entry)
        self._someone_waits.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="job-changes")
        try:
            done, _ = await asyncio.wait({waiter}, timeout=timeout_s)
            return waiter.result() if done else seen
        finally:
            entries = self._waiting.get(key, [])
            if entry in entries:
                entries.remove(entry)
            if not entries:
                self._waiting.pop(key, None)

    async def _run(self) -> None:
        while True:
            if not self._waiting:
                self._someone_waits.clear()
                await self._someone_waits.wait()
            await asyncio.sleep(self.period_s)
            keys = list(self._waiting)
            try:
                found: dict[Key, Snapshot] = {}
                for start in range(0, len(keys), self._max_jobs_per_read):
                    found.update(await self._read(keys[start:start + self._max_jobs_per_read]))
            except Exception:  # noqa: BLE001 - a failed read is tried again next period; never die silently
                log.warning("reading the jobs that log streams wait on failed; trying again", exc_info=True)
                continue
            for key in keys:
                now = found.get(key)
                for seen, waiter in self._waiting.get(key, []):
                    if now is not None and now != seen and not waiter.done():
                        waiter.set_result(now)

    async def close(self) -> None:
        """Stop reading (the streams still waiting are being cancelled by the server's stop)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
