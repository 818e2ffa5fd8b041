"""Progress of a batch while a client waits for it.

`BatchProgress` keeps job counts current from WatchBatch events, starting
from a Batch read; `ProgressLine` shows them on a terminal (redrawn in
place) or, when the stream is not a terminal, as a line at most every few
seconds. The counts are approximate while the batch runs (the Batch read
may already show a change whose event comes after it) and exact at
completion, which carries the final counts. Pure: no network, no clock but
the one given.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from typing import TextIO

from corral.batch.v1 import batch_event_pb2, batch_pb2, job_state_pb2

_BUCKETS = {
    job_state_pb2.JOB_STATE_PENDING: "n_pending", job_state_pb2.JOB_STATE_READY: "n_ready",
    job_state_pb2.JOB_STATE_CREATING: "n_running", job_state_pb2.JOB_STATE_RUNNING: "n_running",
    job_state_pb2.JOB_STATE_SUCCEEDED: "n_succeeded", job_state_pb2.JOB_STATE_FAILED: "n_failed",
    job_state_pb2.JOB_STATE_ERROR: "n_errored", job_state_pb2.JOB_STATE_CANCELLED: "n_cancelled",
}


@dataclasses.dataclass
class BatchProgress:
    """Job counts of one batch by state."""

    batch_id: int
    n_jobs: int = 0
    n_pending: int = 0
    n_ready: int = 0
    n_running: int = 0
    n_succeeded: int = 0
    n_failed: int = 0
    n_errored: int = 0
    n_cancelled: int = 0
    complete: bool = False

    @classmethod
    def from_batch(cls, batch: batch_pb2.Batch) -> BatchProgress:
        c = batch.counts
        return cls(batch.batch_id, c.n_jobs, c.n_pending, c.n_ready, c.n_running, c.n_succeeded, c.n_failed,
                   c.n_errored, c.n_cancelled, batch.state == batch_pb2.BATCH_STATE_COMPLETE)

    @property
    def n_done(self) -> int:
        """Jobs in a final state."""
        return self.n_succeeded + self.n_failed + self.n_errored + self.n_cancelled

    def apply(self, event: batch_event_pb2.BatchEvent) -> None:
        """Account for one event."""
        kind = event.WhichOneof("event")
        if kind == "job_state_changed":
            change = event.job_state_changed
            old, new = _BUCKETS.get(change.old_state), _BUCKETS.get(change.new_state)
            if old is not None:
                setattr(self, old, max(0, getattr(self, old) - 1))
            if new is not None:
                setattr(self, new, getattr(self, new) + 1)
        elif kind == "update_committed":
            # Its jobs join without events of their own (pending or ready);
            # the line shows them as waiting: neither done nor running.
            # The Batch read may already count them (it reads the jobs, and
            # the event is published after): job ids are given out in
            # order, so an update whose last job is within those counted
            # was in the read. (One committed after a later one, which
            # concurrent updates allow, is missed until completion.)
            update = event.update_committed
            self.n_jobs = max(self.n_jobs, update.start_job_id + update.n_jobs - 1)
            self.complete = False
        elif kind == "batch_completed":
            c = event.batch_completed.counts
            self.n_jobs, self.n_succeeded, self.n_failed = c.n_jobs, c.n_succeeded, c.n_failed
            self.n_errored, self.n_cancelled = c.n_errored, c.n_cancelled
            self.n_pending = self.n_ready = self.n_running = 0
            self.complete = True

    def line(self, width: int = 20) -> str:
        """One line: a bar, the share done, and the counts."""
        done = min(self.n_done, self.n_jobs)
        filled = width * done // self.n_jobs if self.n_jobs else (width if self.complete else 0)
        percent = 100 * done // self.n_jobs if self.n_jobs else (100 if self.complete else 0)
        waiting = max(0, self.n_jobs - done - self.n_running)
        text = (f"batch {self.batch_id} [{'#' * filled}{'-' * (width - filled)}] {percent:3d}% "
                f"{done}/{self.n_jobs} done: {self.n_succeeded} succeeded, {self.n_failed} failed, "
                f"{self.n_errored} errored, {self.n_cancelled} cancelled; {self.n_running} running, "
                f"{waiting} waiting")
        return text + (" - complete" if self.complete else "")


class ProgressLine:
    """Writes a BatchProgress to `stream` as it changes."""

    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 5.0,
                 clock_s: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.min_interval_s = min_interval_s
        """Least time between two lines when the stream is not a terminal."""
        self._clock_s = clock_s
        self._tty = self.stream.isatty()
        self._last: str | None = None
        self._last_s: float | None = None

    def show(self, progress: BatchProgress) -> None:
        """Redraw on a terminal; elsewhere print a new line when due (or at completion)."""
        text = progress.line()
        if text == self._last:
            return
        now_s = self._clock_s()
        if self._tty:
            self.stream.write(f"\r{text}\x1b[K")
        elif progress.complete or self._last_s is None or now_s - self._last_s >= self.min_interval_s:
            self.stream.write(text + "\n")
        else:
            return
        self.stream.flush()
        self._last, self._last_s = text, now_s

    def close(self) -> None:
        """End the redrawn line on a terminal."""
        if self._tty and self._last is not None:
            self.stream.write("\n")
            self.stream.flush()
