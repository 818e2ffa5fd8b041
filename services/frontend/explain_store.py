"""The facts behind ExplainJob, read from the database.

Each read is bounded: parents of one job, its nearest cancelled group, its
hold (its own, or its nearest held group's), and
for a Ready job the planner's snapshot of its pool, read as the scheduler
reads it (`services.db.plan_snapshot`: each user's queue only as deep as the
planner looks, locks only at the candidates' levels), then `plan` on it. A
job deeper in its user's queue than the planner looks waits behind the
user's own jobs; how many come first is counted up to MAX_JOBS_AHEAD. Only
the reads a job's state calls for are made: a final or running job needs
none of them.

The differences from the scheduler: the frontend cannot tell which
workers hold a session with the leader, so every active worker of the pool
counts as live; it first asks whether the deployment can ever run the job
(`services.policy.runnable.never_runs`: a job accepted before a pool was
disabled or made smaller, or one naming a machine type), and it reads the
pool's machines so that a job without room is told what it waits for.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from services.db.database import Database
from services.db.plan_snapshot import (
    read_demand, read_deployment, read_pool_machines, read_snapshot, read_workers,
)
from services.frontend.explain import Cancelled, Held, JobFacts, LockConflict, Parent, Scheduling
from services.policy import planner
from services.policy.lock_contention import locks_from_rows
from services.policy.runnable import Needs, never_runs

MAX_JOBS_AHEAD = 1_000
MAX_HOLDERS_NAMED = 10
"""Running jobs named per lock that blocks a job."""

_CANCELLED = """
SELECT c.job_group_id, c.cancelled_by, c.reason
FROM job_group_self_and_ancestors a
JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id
WHERE a.batch_id = %s AND a.job_group_id = %s
ORDER BY c.job_group_id = 0 DESC, a.level
LIMIT 1
"""

# The job's own hold, else its nearest held group's (the batch's first), as for a cancellation.
_HELD = """
SELECT job_group_id, held_by, time_held_ms FROM (
  SELECT 0 AS k, NULL AS job_group_id, held_by, time_held_ms FROM jobs_held WHERE batch_id = %s AND job_id = %s
  UNION ALL
  (SELECT 1 AS k, h.job_group_id, h.held_by, h.time_held_ms
   FROM job_group_self_and_ancestors a
   JOIN job_groups_held h ON h.batch_id = a.batch_id AND h.job_group_id = a.ancestor_id
   WHERE a.batch_id = %s AND a.job_group_id = %s
   ORDER BY h.job_group_id = 0 DESC, a.level
   LIMIT 1)) holds
ORDER BY k
LIMIT 1
"""

# The queue's order: priority, then batch, then job; only jobs the scheduler may run (not held).
_AHEAD = """
SELECT COUNT(*) AS n FROM (
  SELECT 1 FROM batches ob
  JOIN jobs oj ON oj.batch_id = ob.batch_id AND oj.state = 'Ready' AND oj.inst_coll = %s
  WHERE ob.user = %s AND ob.state = 'running'
    AND (oj.priority > %s OR (oj.priority = %s AND (oj.batch_id < %s OR (oj.batch_id = %s AND oj.job_id < %s))))
    AND (oj.always_run OR (NOT oj.dependency_failed AND NOT EXISTS (
          SELECT 1 FROM job_group_self_and_ancestors oa
          JOIN job_groups_cancelled oc ON oc.batch_id = oa.batch_id AND oc.job_group_id = oa.ancestor_id
          WHERE oa.batch_id = oj.batch_id AND oa.job_group_id = oj.job_group_id)))
    AND NOT EXISTS (SELECT 1 FROM job_groups_held_self_or_ancestor y
                    WHERE y.batch_id = oj.batch_id AND y.job_group_id = oj.job_group_id)
    AND NOT EXISTS (SELECT 1 FROM jobs_held hj WHERE hj.batch_id = oj.batch_id AND hj.job_id = oj.job_id)
  LIMIT %s) ahead
"""


# The running jobs of a billing project that hold one lock.
_HOLDERS = """
SELECT l.batch_id, l.job_id FROM job_locks l
JOIN jobs j ON j.batch_id = l.batch_id AND j.job_id = l.job_id AND j.state IN ('Creating', 'Running')
JOIN batches b ON b.batch_id = l.batch_id
WHERE l.level = %s AND l.lock_name = %s AND l.mode = %s AND b.billing_project = %s
ORDER BY l.batch_id, l.job_id
LIMIT %s
"""


class ExplainStore:
    """Reads the facts `services.frontend.explain.explain` needs."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.db = db
        self._clock = clock_ms

    async def facts(self, job: dict[str, Any], parents: list[dict[str, Any]], locks: list[dict[str, Any]]
                    ) -> JobFacts:
        """The facts of a job row of JobReadStore (with its parents and its own locks)."""
        batch_id, job_id, state = job["batch_id"], job["job_id"], job["state"]
        facts = JobFacts(
            batch_id=batch_id, job_id=job_id, state=state, user=job["user"], always_run=bool(job["always_run"]),
            dependency_failed=bool(job["dependency_failed"]), cores_mcpu=job["cores_mcpu"],
            regions=await self._regions(job["regions_bits"]), exit_code=job["exit_code"],
            end_reason=job.get("end_reason"))
        if state in ("Running", "Creating"):
            row = await self.db.fetchone(
                "SELECT instance_name FROM attempts WHERE batch_id = %s AND job_id = %s AND attempt_id = %s",
                (batch_id, job_id, job["attempt_id"]), name="explain_instance")
            return dataclasses.replace(facts, instance=row["instance_name"] if row else None)
        if state not in ("Pending", "Ready"):
            return facts
        cancelled = await self.db.fetchone(_CANCELLED, (batch_id, job["job_group_id"]), name="explain_cancelled")
        held = await self.db.fetchone(_HELD, (batch_id, job_id, batch_id, job["job_group_id"]), name="explain_held")
        facts = dataclasses.replace(
            facts, parents=tuple(Parent(p["parent_id"], p["state"], p["accepted_states"]) for p in parents),
            cancelled=Cancelled(cancelled["job_group_id"], cancelled["cancelled_by"], cancelled["reason"])
            if cancelled else None,
            held=Held(held["job_group_id"], held["held_by"], int(held["time_held_ms"])) if held else None)
        stopped = (cancelled is not None or facts.dependency_failed) and not facts.always_run
        if state != "Ready" or stopped or held is not None:  # the planner's reason would not be shown
            return facts
        return dataclasses.replace(facts, scheduling=await self.scheduling(job, locks))

    async def _holders(self, project: str, holders: tuple[planner.Holder, ...]) -> list[planner.JobKey]:
        """The jobs behind the snapshot's counted holders (`planner.HeldLock`): up to MAX_HOLDERS_NAMED of
        each lock's running jobs."""
        jobs: list[planner.JobKey] = []
        for holder in holders:
            if isinstance(holder, tuple):
                jobs.append(holder)
                continue
            rows = await self.db.fetchall(_HOLDERS, (holder.level, holder.name, holder.mode, project,
                                                     MAX_HOLDERS_NAMED), name="explain_lock_holders")
            jobs += [(r["batch_id"], r["job_id"]) for r in rows if (r["batch_id"], r["job_id"]) not in jobs]
        return jobs

    async def _regions(self, regions_bits: int | None) -> tuple[str, ...]:
        if regions_bits is None:
            return ()
        rows = await self.db.fetchall("SELECT region_id, name FROM regions ORDER BY region_id", name="regions")
        return tuple(r["name"] for r in rows if (int(regions_bits) >> r["region_id"]) & 1)

    async def scheduling(self, job: dict[str, Any], locks: list[dict[str, Any]]) -> Scheduling:
        """What the planner decides for the Ready job now (module docstring)."""
        pool = job["inst_coll"]
        deployment = await read_deployment(self.db)
        never = never_runs(Needs(pool, int(job["cores_mcpu"]), int(job.get("memory_bytes") or 0),
                                 int(job.get("storage_bytes") or 0)), deployment)
        collection = deployment.get(pool)
        if never is not None or collection is None:
            return Scheduling(never=never)
        key = (job["batch_id"], job["job_id"])
        if collection.paused_by is not None:  # the planner's first rule, whatever else holds: nothing starts there
            alone = planner.Candidate(key, job["user"], job["billing_project"], int(job["cores_mcpu"]))
            paused = planner.plan(planner.Snapshot(pool, (), (), {job["user"]: [alone]},
                                                   paused_by=collection.paused_by))
            return Scheduling(paused.waits[key])
        workers = [w for w in (await read_workers(self.db, pool)).get(pool, []) if w.free_cores_mcpu > 0]
        demands = (await read_demand(self.db)).get(pool, [])
        snapshot = dataclasses.replace(
            await read_snapshot(self.db, pool, workers, demands, planner.JOBS_PER_CYCLE, self._clock() / 1000),
            machines=await read_pool_machines(self.db, collection))
        result = planner.plan(snapshot)
        if any(p.key == key for p in result.placements):
            return Scheduling()
        wait = result.waits.get(key)
        if wait is None:  # deeper in the user's queue than the planner looks
            ahead = await self.db.fetchone(
                _AHEAD, (pool, job["user"], job["priority"], job["priority"], job["batch_id"], job["batch_id"],
                         job["job_id"], MAX_JOBS_AHEAD), name="explain_jobs_ahead")
            n = int(ahead["n"]) if ahead else 0
            count = f"at least {n}" if n >= MAX_JOBS_AHEAD else str(n)
            wait = planner.Wait(planner.QUEUED_BEHIND_OWN_JOBS, f"{count} of {job['user']}'s ready jobs in pool "
                                                                f"{pool} come first (higher priority or older)")
        lock = None
        if wait.code == planner.BLOCKED_BY_LOCK:
            stored = [r for r in locks if r["level"] == wait.level]
            mine = locks_from_rows((r["level"], r["mode"], r["lock_name"]) for r in stored).get(wait.level)
            names = tuple(sorted(mine.names)) if mine is not None else ()
            holders = await self._holders(job["billing_project"], wait.holders)
            if mine is not None:
                wait = planner.blocked_by_lock(wait.level, mine, holders)
            lock = LockConflict(wait.level, stored[0]["mode"] if stored else "", names, tuple(holders))
        return Scheduling(wait, lock)
