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
from typing import Any, Protocol

from services.db.database import Database
from services.db.plan_snapshot import CANCELLED_GROUPS
from services.db.store import JobStore, wall_clock_ms
from services.policy.fair_share import cancel_shares
from services.driver.loop import Loop
from services.driver.metrics import JOBS_CANCELLED

log = logging.getLogger(__name__)

REASON = "its job group or batch was cancelled"
"""What a CancelJob tells the worker."""

# Per running batch: its Creating and Running jobs that may be cancelled, in
# groups with a cancelled self or ancestor. The counters are per group and
# never touched by a cancellation, so this is a read of a few rows per
# cancelled group.
_DRAINABLE = f"""
SELECT r.user, r.batch_id, SUM(r.n_creating_cancellable_jobs + r.n_running_cancellable_jobs) AS n
FROM {CANCELLED_GROUPS} gc
JOIN user_inst_coll_resources_by_job_group r ON r.batch_id = gc.batch_id AND r.job_group_id = gc.job_group_id
GROUP BY r.user, r.batch_id
HAVING n > 0
ORDER BY r.user, r.batch_id
"""

# Up to N of one batch's cancellable Creating and Running jobs, after a job id.
_JOBS = """
SELECT j.batch_id, j.job_id, j.state, j.attempt_id, a.instance_name
FROM jobs j
JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id AND a.attempt_id = j.attempt_id
WHERE j.batch_id = %s AND j.state IN ('Creating', 'Running') AND NOT j.always_run AND j.job_id > %s
  AND j.job_group_id IN (SELECT s.job_group_id
                         FROM job_group_self_and_ancestors s
                         JOIN job_groups_cancelled c ON c.batch_id = s.batch_id AND c.job_group_id = s.ancestor_id
                         WHERE s.batch_id = %s)
ORDER BY j.job_id
LIMIT %s
"""


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

    def __init__(self, db: Database, store: JobStore, workers: Canceller, epoch: Callable[[], int | None],
                 period_s: float = 5.0, per_cycle: int = 300, minimum_per_user: int = 20,
                 resend_after_s: float = 60.0, clock_ms: Callable[[], int] = wall_clock_ms):
        super().__init__(period_s)
        self._db = db
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

    async def drainable(self) -> list[dict[str, Any]]:
        """(user, batch_id, n) of every running batch with Creating or Running jobs to cancel."""
        return await self._db.fetchall(_DRAINABLE, name="cancel_running_drainable")

    async def cycle(self) -> None:
        epoch = self._epoch()
        if epoch is None:
            return
        now_ms = self._clock_ms()
        # What was sent long enough ago may be sent again; the rest is skipped.
        self._sent_ms = {k: t for k, t in self._sent_ms.items() if now_ms - t < self._resend_after_ms}
        rows = await self.drainable()
        drainable = {int(r["batch_id"]) for r in rows}
        self._after_job_id = {b: j for b, j in self._after_job_id.items() if b in drainable}
        by_user: dict[str, int] = {}
        for row in rows:
            by_user[row["user"]] = by_user.get(row["user"], 0) + int(row["n"])
        shares = cancel_shares(by_user, total=self.per_cycle, minimum=self.minimum_per_user)
        live = self._workers.connected_instances()
        acted = 0
        for row in rows:
            batch_id, left = int(row["batch_id"]), shares.get(row["user"], 0)
            if left <= 0:
                continue
            jobs = await self._next_jobs(batch_id, min(left, int(row["n"])))
            shares[row["user"]] = left - len(jobs)
            acted += await self._close_creating(epoch, [j for j in jobs if j["state"] == "Creating"])
            acted += self._stop_running([j for j in jobs if j["state"] == "Running"], live, now_ms)
        JOBS_CANCELLED.labels(self.name).inc(acted)
        if acted:
            self.notify()  # more may wait beyond this cycle's shares

    async def _next_jobs(self, batch_id: int, n: int) -> list[dict[str, Any]]:
        """Up to n of the batch's jobs to cancel, after the last one read before,
        going on from the start of the batch once its end is reached."""
        after = self._after_job_id.get(batch_id, 0)
        jobs = await self._db.fetchall(_JOBS, (batch_id, after, batch_id, n), name="cancel_running_jobs")
        last = int(jobs[-1]["job_id"]) if len(jobs) == n else 0
        if len(jobs) < n and after > 0:
            wanted = n - len(jobs)
            more = [j for j in await self._db.fetchall(_JOBS, (batch_id, 0, batch_id, wanted),
                                                       name="cancel_running_jobs") if int(j["job_id"]) <= after]
            jobs += more
            last = int(more[-1]["job_id"]) if len(more) == wanted else 0
        self._after_job_id[batch_id] = last
        return jobs

    async def _close_creating(self, epoch: int, jobs: Sequence[dict[str, Any]]) -> int:
        """MJC Cancelled for jobs no worker has yet, one bulk call per instance."""
        closed = 0
        for instance in sorted({j["instance_name"] for j in jobs}):
            outcomes = await self._store.mark_jobs_complete(epoch, instance, [
                {"batch_id": j["batch_id"], "job_id": j["job_id"], "attempt_id": j["attempt_id"],
                 "state": "Cancelled", "reason": "cancelled"}
                for j in jobs if j["instance_name"] == instance])
            closed += sum(1 for o in outcomes if o["outcome"] == "completed")
        self.closed_total += closed
        return closed

    def _stop_running(self, jobs: Sequence[dict[str, Any]], live: set[str], now_ms: int) -> int:
        """A CancelJob per running attempt whose worker is connected and was not asked lately."""
        sent = 0
        for j in jobs:
            key = (int(j["batch_id"]), int(j["job_id"]), str(j["attempt_id"]))
            if key in self._sent_ms or j["instance_name"] not in live:
                continue
            if self._workers.cancel(j["instance_name"], *key, REASON):
                self._sent_ms[key] = now_ms
                sent += 1
        self.stop_requests_total += sent
        return sent
