"""The facts behind ExplainJob, read from the database.

Each read is bounded: parents of one job, the locks of running jobs at the
job's levels in its billing project (at most MAX_LOCK_ROWS rows), the active
instances and fair-share rows of one pool, and a count of the user's Ready
jobs ahead of this one that stops at MAX_JOBS_AHEAD. Only the reads a job's
state calls for are made: a final or running job needs none of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.db.database import Database
from services.driver.fair_share import UserDemand
from services.driver.lock_contention import BIG_LOCK_LEVEL, blocking_jobs, locks_from_rows
from services.frontend.explain import Cancelled, JobFacts, LockConflict, Parent, Pool, Project

MAX_LOCK_ROWS = 10_000
MAX_JOBS_AHEAD = 1_000

_CANCELLED = """
SELECT c.job_group_id, c.cancelled_by, c.reason
FROM job_group_self_and_ancestors a
JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id
WHERE a.batch_id = %s AND a.job_group_id = %s
ORDER BY c.job_group_id = 0 DESC, a.level
LIMIT 1
"""

_PROJECT = """
SELECT p.name, p.state, p.limit_usd,
       (SELECT COALESCE(SUM(x.`usage` * xr.rate_usd), 0) FROM aggregated_billing_project_resources x
        JOIN resources xr ON xr.resource_id = x.resource_id WHERE x.billing_project = p.name) AS spend_usd
FROM billing_projects p WHERE p.name = %s
"""

_RUNNING_LOCKS = """
SELECT l.batch_id, l.job_id, l.level, l.mode, l.lock_name
FROM job_locks l
JOIN jobs rj ON rj.batch_id = l.batch_id AND rj.job_id = l.job_id AND rj.state IN ('Running', 'Creating')
JOIN batches rb ON rb.batch_id = l.batch_id AND rb.billing_project = %s
WHERE NOT (l.batch_id = %s AND l.job_id = %s) {levels}
ORDER BY l.batch_id, l.job_id
LIMIT %s
"""

_INSTANCES = """
SELECT i.free_cores_mcpu, i.cores_mcpu, COALESCE(r.region_id, 0) AS region_id
FROM instances i LEFT JOIN regions r ON r.name = i.region
WHERE i.state = 'active' AND i.inst_coll = %s
"""

# The scheduler's order: priority, then batch, then job; only jobs it may run.
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
  LIMIT %s) ahead
"""


class ExplainStore:
    """Reads the facts `services.frontend.explain.explain` needs."""

    def __init__(self, db: Database):
        self.db = db

    async def facts(self, job: dict[str, Any], parents: list[dict[str, Any]], locks: list[dict[str, Any]]
                    ) -> JobFacts:
        """The facts of a job row of JobReadStore (with its parents and its own locks)."""
        batch_id, job_id, state = job["batch_id"], job["job_id"], job["state"]
        facts = JobFacts(
            batch_id=batch_id, job_id=job_id, state=state, user=job["user"], always_run=bool(job["always_run"]),
            dependency_failed=bool(job["dependency_failed"]), cores_mcpu=job["cores_mcpu"],
            regions=await self._regions(job["regions_bits"]), exit_code=job["exit_code"])
        if state in ("Running", "Creating"):
            row = await self.db.fetchone(
                "SELECT instance_name FROM attempts WHERE batch_id = %s AND job_id = %s AND attempt_id = %s",
                (batch_id, job_id, job["attempt_id"]), name="explain_instance")
            return dataclasses.replace(facts, instance=row["instance_name"] if row else None)
        if state not in ("Pending", "Ready"):
            return facts
        cancelled = await self.db.fetchone(_CANCELLED, (batch_id, job["job_group_id"]), name="explain_cancelled")
        facts = dataclasses.replace(
            facts, parents=tuple(Parent(p["parent_id"], p["state"], p["accepted_states"]) for p in parents),
            cancelled=Cancelled(cancelled["job_group_id"], cancelled["cancelled_by"], cancelled["reason"])
            if cancelled else None)
        if state != "Ready":
            return facts
        project = await self.db.fetchone(_PROJECT, (job["billing_project"],), name="explain_project")
        return dataclasses.replace(
            facts,
            project=Project(project["name"], project["state"], project["limit_usd"], float(project["spend_usd"]))
            if project else None,
            lock_conflicts=await self._lock_conflicts(job, locks),
            pool=await self._pool(job))

    async def _regions(self, regions_bits: int | None) -> tuple[str, ...]:
        if regions_bits is None:
            return ()
        rows = await self.db.fetchall("SELECT region_id, name FROM regions ORDER BY region_id", name="regions")
        return tuple(r["name"] for r in rows if (int(regions_bits) >> r["region_id"]) & 1)

    async def _lock_conflicts(self, job: dict[str, Any], locks: list[dict[str, Any]]) -> tuple[LockConflict, ...]:
        if not locks:
            return ()
        mine = locks_from_rows((r["level"], r["mode"], r["lock_name"]) for r in locks)
        levels = sorted(mine)
        # The big lock clashes with a lock at any level; others only with their level or the big lock.
        level_filter, params = "", []
        if BIG_LOCK_LEVEL not in mine:
            level_filter = f"AND l.level IN ({', '.join(['%s'] * (len(levels) + 1))})"
            params = [*levels, BIG_LOCK_LEVEL]
        rows = await self.db.fetchall(
            _RUNNING_LOCKS.format(levels=level_filter),
            (job["billing_project"], job["batch_id"], job["job_id"], *params, MAX_LOCK_ROWS), name="explain_locks")
        held: dict[tuple[int, int], list[tuple[str, str, str]]] = {}
        for r in rows:
            held.setdefault((r["batch_id"], r["job_id"]), []).append((r["level"], r["mode"], r["lock_name"]))
        running = {key: locks_from_rows(entries) for key, entries in held.items()}
        conflicts = []
        for level in levels:
            try:
                holders = blocking_jobs({level: mine[level]}, running)
            except ValueError:  # a big-lock level with another mode than ALL_EXCLUSIVE: no verdict
                continue
            if holders:
                stored = [r for r in locks if r["level"] == level]
                names = tuple(sorted({r["lock_name"] for r in stored if r["lock_name"]}))
                conflicts.append(LockConflict(level, stored[0]["mode"], names, tuple(holders)))
        return tuple(conflicts)

    async def _pool(self, job: dict[str, Any]) -> Pool | None:
        collection = await self.db.fetchone("SELECT name, is_pool FROM instance_collections WHERE name = %s",
                                            (job["inst_coll"],), name="explain_collection")
        if collection is None:
            return None
        instances = await self.db.fetchall(_INSTANCES, (job["inst_coll"],), name="explain_instances")
        bits = job["regions_bits"]
        room = sum(1 for i in instances if i["free_cores_mcpu"] >= job["cores_mcpu"]
                   and (bits is None or (int(bits) >> i["region_id"]) & 1))
        demand_rows = await self.db.fetchall(
            "SELECT user, running_cores_mcpu, ready_cores_mcpu FROM user_inst_coll_fair_share WHERE inst_coll = %s",
            (job["inst_coll"],), name="explain_fair_share")
        demands = tuple(UserDemand(r["user"], int(r["running_cores_mcpu"] or 0), int(r["ready_cores_mcpu"] or 0))
                        for r in demand_rows)
        ahead = await self.db.fetchone(
            _AHEAD, (job["inst_coll"], job["user"], job["priority"], job["priority"], job["batch_id"],
                     job["batch_id"], job["job_id"], MAX_JOBS_AHEAD), name="explain_jobs_ahead")
        n_ahead = int(ahead["n"]) if ahead else 0
        return Pool(job["inst_coll"], not collection["is_pool"], room,
                    sum(int(i["cores_mcpu"]) for i in instances), demands, n_ahead, n_ahead >= MAX_JOBS_AHEAD)
