"""The canceller of Creating and Running jobs (design §3 and §4).

Cancelling a batch or group wrote one row; the Ready canceller drains the
jobs that have not started. This loop handles the ones that have a machine:
jobs of a cancelled group (self or ancestor) that are not always_run and are

- **Creating** (their job-private instance is still booting, no worker has
  them): closed at once with MJC Cancelled, which frees the cores and
  counts the completion;
- **Running**: a CancelJob goes down their worker's session; the worker
  stops the job and reports JobCompleted Cancelled, which MJC records like
  any other completion. A job whose worker has no session with this driver
  is left alone: the dead-worker detector deactivates its instance, the job
  goes back to Ready and the Ready canceller takes it.

Each cycle finds, from the tokenized counters (not by scanning jobs), how
many such jobs each user's running batches have, gives each user a share
(about 300 per cycle, at least 20 each: `cancel_shares`) and reads that many
jobs per batch in one query, resuming after the last job it read so a batch
with more running jobs than its share is covered over several cycles. A
CancelJob is not repeated for the same attempt within `resend_after_s`; a
new leader starts with no memory and sends again, which workers ignore for
an attempt they already stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from services.db.store import wall_clock_ms
from services.policy.fair_share import cancel_shares
from services.driver.loop import Loop
from services.driver.metrics import JOBS_CANCELLED
from services.driver.store import Drainable, DriverStore, StartedJob

log = logging.getLogger(__name__)

REASON = "its job group or batch was cancelled"
"""What a CancelJob tells the worker."""


class Canceller(Protocol):
    """How the loop reaches workers (the session registry in production)."""

    def connected_instances(self) -> set[str]:
        """Names of instances whose worker holds a session with this driver, draining or not
        (a draining worker still stops the jobs it runs)."""

    def cancel(self, instance: str, batch_id: int, job_id: int, attempt_id: str, reason: str) -> bool:
        """Queue a CancelJob for the attempt; False when the worker has no session."""


class RunningCanceller(Loop):
    """Stops Creating and Running jobs of cancelled groups; see the module docstring."""

    name = "cancel-running"

    def __init__(self, store: DriverStore, workers: Canceller, epoch: Callable[[], int | None],
                 period_s: float = 5.0, per_cycle: int = 300, minimum_per_user: int = 20,
                 resend_after_s: float = 60.0, clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._store = store
        self._workers = workers
        self._epoch = epoch
        self.per_cycle = per_cycle
        self.minimum_per_user = minimum_per_user
        self._resend_after_ms = int(resend_after_s * 1000)
        self._clock_ms = clock_ms
        self._sent_ms: dict[tuple[int, int, str], int] = {}
        self._after_job_id: dict[int, int] = {}
        self.closed_total = 0
        """Creating jobs this loop has closed as Cancelled since it started."""
        self.stop_requests_total = 0
        """CancelJob commands this loop has sent since it started."""

    async def drainable(self) -> list[Drainable]:
        """Every running batch with Creating or Running jobs to cancel."""
        return await self._store.running_drainable()

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        now_ms = self._clock_ms()
        # What was sent long enough ago may be sent again; the rest is skipped.
        self._sent_ms = {k: t for k, t in self._sent_ms.items() if now_ms - t < self._resend_after_ms}
        rows = await self.drainable()
        drainable = {r.batch_id for r in rows}
        self._after_job_id = {b: j for b, j in self._after_job_id.items() if b in drainable}
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row.user] = by_user.get(row.user, 0) + row.n
        shares = cancel_shares(by_user, total=self.per_cycle, minimum=self.minimum_per_user)
        live = self._workers.connected_instances()
        acted = 0
        for row in rows:
            batch_id, left = row.batch_id, shares.get(row.user, 0)
            if left <= 0:
                continue
            jobs = await self._next_jobs(batch_id, min(left, row.n))
            shares[row.user] = left - len(jobs)
            acted += await self._close_creating(epoch, [j for j in jobs if j.state == "Creating"])
            acted += self._stop_running([j for j in jobs if j.state == "Running"], live, now_ms)
        JOBS_CANCELLED.labels(self.name).inc(acted)
        if acted:
            self.notify()  # more may wait beyond this cycle's shares

    async def _next_jobs(self, batch_id: int, n: int) -> list[StartedJob]:
        """Up to n of the batch's jobs to cancel, after the last one read before,
        going on from the start of the batch once its end is reached."""
        after = self._after_job_id.get(batch_id, 0)
        jobs = await self._store.cancellable_started(batch_id, after, n)
        last = jobs[-1].job_id if len(jobs) == n else 0
        if len(jobs) < n and after > 0:
            wanted = n - len(jobs)
            more = [j for j in await self._store.cancellable_started(batch_id, 0, wanted) if j.job_id <= after]
            jobs += more
            last = more[-1].job_id if len(more) == wanted else 0
        self._after_job_id[batch_id] = last
        return jobs

    async def _close_creating(self, epoch: int, jobs: Sequence[StartedJob]) -> int:
        """MJC Cancelled for jobs no worker has yet, one bulk call per instance."""
        closed = 0
        for instance in sorted({j.instance_name for j in jobs}):
            outcomes = await self._store.mark_jobs_complete(epoch, instance, [
                {"batch_id": j.batch_id, "job_id": j.job_id, "attempt_id": j.attempt_id,
                 "state": "Cancelled", "reason": "cancelled"}
                for j in jobs if j.instance_name == instance])
            closed += sum(1 for o in outcomes if o["outcome"] == "completed")
        self.closed_total += closed
        return closed

    def _stop_running(self, jobs: Sequence[StartedJob], live: set[str], now_ms: int) -> int:
        """A CancelJob per running attempt whose worker is connected and was not asked lately."""
        sent = 0
        for j in jobs:
            key = (j.batch_id, j.job_id, j.attempt_id)
            if key in self._sent_ms or j.instance_name not in live:
                continue
            if self._workers.cancel(j.instance_name, *key, REASON):
                self._sent_ms[key] = now_ms
                sent += 1
        self.stop_requests_total += sent
        return sent
