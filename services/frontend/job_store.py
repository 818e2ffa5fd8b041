"""Reads of committed jobs and their attempts, for JobService.

Only jobs of committed updates exist for readers: a job of an update that is
still open is NOT_FOUND. Costs come from the billing aggregates
(`aggregated_job_resources` per job, `attempt_resources` × rolled-up time per
attempt) times the resource rates, never from scanning usage. Queries use
aliases of their own (jt, jbt, jbu, lat, rr): the query language's
subqueries use attr, jb, jg, la, ajr and r over `j`.
"""

from __future__ import annotations

from typing import Any

from services.db.database import Database

_JOB_COST = """(SELECT COALESCE(SUM(x.`usage` * xr.rate_usd), 0) FROM aggregated_job_resources x
                JOIN resources xr ON xr.resource_id = x.resource_id
                WHERE x.batch_id = j.batch_id AND x.job_id = j.job_id)"""

# STRAIGHT_JOIN: jobs first, in the order of their primary key, so that a page (ORDER BY job_id LIMIT n) stops
# after n rows. Left to itself MariaDB reached jobs through batch_updates, read every job of the batch and
# its cost subqueries, then sorted: 1.0 s for a page of 50 of a 100,000-job batch, 4 ms this way (bench web).
_JOB_SELECT = f"""
SELECT STRAIGHT_JOIN j.batch_id, j.job_id, j.update_id, j.job_group_id, j.state, j.always_run, j.dependency_failed,
       j.n_pending_parents, j.cores_mcpu, j.memory_bytes, j.storage_bytes, j.inst_coll, j.regions_bits, j.priority,
       j.attempt_id, j.exit_code, j.spec_ref, jbt.user, jbt.billing_project, j.end_reason,
       jbu.time_committed_ms, lat.end_time_ms AS latest_end_time_ms,
       -- Why the control plane ended it (migration 0015), else what its latest attempt said.
       COALESCE(j.end_reason, lat.error_message) AS latest_error_message,
       (SELECT MIN(fa.start_time_ms) FROM attempts fa WHERE fa.batch_id = j.batch_id AND fa.job_id = j.job_id)
         AS first_start_time_ms,
       {_JOB_COST} AS cost_usd, rr.rerun_of_job_id
FROM jobs j
JOIN batches jbt ON jbt.batch_id = j.batch_id
JOIN batch_updates jbu ON jbu.batch_id = j.batch_id AND jbu.update_id = j.update_id AND jbu.committed
LEFT JOIN attempts lat ON lat.batch_id = j.batch_id AND lat.job_id = j.job_id AND lat.attempt_id = j.attempt_id
LEFT JOIN job_reruns rr ON rr.batch_id = j.batch_id AND rr.job_id = j.job_id
"""

_ATTEMPT_SELECT = """
SELECT a.batch_id, a.job_id, a.attempt_id, a.instance_name, a.start_time_ms, a.end_time_ms, a.rollup_time_ms,
       a.reason, a.exit_code, a.error_message, a.isolation, a.cpu_time_ms, a.peak_memory_bytes, i.region,
       a.retry_reason, a.retry_delay_ms, a.image_digest,
       i.ip_address, i.state AS instance_state, COALESCE(i.preemptible, c.preemptible, FALSE) AS preemptible,
       jt.cores_mcpu,
       -- What the attempt reserved (an out-of-memory retry grows the job's memory for the next one).
       COALESCE((SELECT ar.quantity * 1048576 FROM attempt_resources ar
                 JOIN resources ar_m ON ar_m.resource_id = ar.resource_id AND LEFT(ar_m.product, 7) = 'memory/'
                 WHERE ar.batch_id = a.batch_id AND ar.job_id = a.job_id AND ar.attempt_id = a.attempt_id),
                jt.memory_bytes) AS memory_bytes,
       (SELECT COALESCE(SUM(ar.quantity * (COALESCE(a.rollup_time_ms, a.start_time_ms) - a.start_time_ms)
                            * ar_r.rate_usd), 0)
          FROM attempt_resources ar JOIN resources ar_r ON ar_r.resource_id = ar.resource_id
          WHERE ar.batch_id = a.batch_id AND ar.job_id = a.job_id AND ar.attempt_id = a.attempt_id
            AND a.start_time_ms IS NOT NULL) AS cost_usd
FROM attempts a
JOIN jobs jt ON jt.batch_id = a.batch_id AND jt.job_id = a.job_id
LEFT JOIN instances i ON i.name = a.instance_name
LEFT JOIN instance_collections c ON c.name = i.inst_coll
"""

# Attempts carry no creation time: the job's current attempt is the newest,
# the others go by when they started (one that never started, by its end).
_ATTEMPT_ORDER = ("a.attempt_id <=> jt.attempt_id, COALESCE(a.start_time_ms, a.end_time_ms, 9223372036854775807),"
                  " a.attempt_id")


class JobReadStore:
    """SQL reads behind GetJob, ListJobs, GetJobAttempts and the log RPCs. ListJobs reads a page's
    attributes, parents and attempts with one statement each, whatever the page's size."""

    def __init__(self, db: Database):
        self.db = db

    async def get_job(self, batch_id: int, job_id: int) -> dict[str, Any] | None:
        """One committed job of the batch, or None."""
        return await self.db.fetchone(f"{_JOB_SELECT} WHERE j.batch_id = %s AND j.job_id = %s",
                                      (batch_id, job_id), name="get_job")

    async def list_jobs(self, batch_id: int, where_sql: str, params: list[Any], after_job_id: int,
                        limit: int) -> list[dict[str, Any]]:
        """Committed jobs by increasing id after `after_job_id`; `where_sql` is the
        query language's parameterized expression over `j`."""
        return await self.db.fetchall(
            f"""{_JOB_SELECT}
                WHERE j.batch_id = %s AND j.job_id > %s AND ({where_sql})
                ORDER BY j.job_id LIMIT %s""",
            (batch_id, after_job_id, *params, limit), name="list_jobs")

    async def attributes(self, batch_id: int, job_ids: list[int]) -> dict[int, dict[str, str]]:
        """Each job's attributes."""
        found: dict[int, dict[str, str]] = {i: {} for i in job_ids}
        if not job_ids:
            return found
        rows = await self.db.fetchall(
            f"SELECT job_id, `key`, `value` FROM job_attributes WHERE batch_id = %s"
            f" AND job_id IN ({', '.join(['%s'] * len(job_ids))})", (batch_id, *job_ids), name="job_attributes")
        for row in rows:
            found[row["job_id"]][row["key"]] = row["value"] or ""
        return found

    async def parent_ids(self, batch_id: int, job_ids: list[int]) -> dict[int, list[int]]:
        """Each job's parents' ids, ascending: one statement for a page of jobs."""
        found: dict[int, list[int]] = {i: [] for i in job_ids}
        if not job_ids:
            return found
        rows = await self.db.fetchall(
            f"SELECT job_id, parent_id FROM job_parents WHERE batch_id = %s"
            f" AND job_id IN ({', '.join(['%s'] * len(job_ids))}) ORDER BY job_id, parent_id",
            (batch_id, *job_ids), name="page_job_parents")
        for row in rows:
            found[row["job_id"]].append(row["parent_id"])
        return found

    async def parents(self, batch_id: int, job_id: int) -> list[dict[str, Any]]:
        """The job's edges: parent_id, accepted_states (bits) and the parent's state."""
        return await self.db.fetchall(
            """SELECT e.parent_id, e.accepted_states, p.state
               FROM job_parents e JOIN jobs p ON p.batch_id = e.batch_id AND p.job_id = e.parent_id
               WHERE e.batch_id = %s AND e.job_id = %s ORDER BY e.parent_id""",
            (batch_id, job_id), name="job_parents")

    async def locks(self, batch_id: int, job_id: int) -> list[dict[str, Any]]:
        """The job's declared locks (level, mode, lock_name)."""
        return await self.db.fetchall(
            "SELECT level, mode, lock_name FROM job_locks WHERE batch_id = %s AND job_id = %s"
            " ORDER BY level, mode, lock_name", (batch_id, job_id), name="job_locks")

    async def attempts(self, batch_id: int, job_id: int) -> list[dict[str, Any]]:
        """Every attempt of the job, oldest first, with instance, resources and cost."""
        return await self.db.fetchall(
            f"{_ATTEMPT_SELECT} WHERE a.batch_id = %s AND a.job_id = %s ORDER BY {_ATTEMPT_ORDER}",
            (batch_id, job_id), name="job_attempts")

    async def page_attempts(self, batch_id: int, job_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
        """Each job's attempts as `attempts` returns them, oldest first: one statement for a page of jobs."""
        found: dict[int, list[dict[str, Any]]] = {i: [] for i in job_ids}
        if not job_ids:
            return found
        rows = await self.db.fetchall(
            f"{_ATTEMPT_SELECT} WHERE a.batch_id = %s AND a.job_id IN ({', '.join(['%s'] * len(job_ids))})"
            f" ORDER BY a.job_id, {_ATTEMPT_ORDER}", (batch_id, *job_ids), name="page_job_attempts")
        for row in rows:
            found[row["job_id"]].append(row)
        return found

    async def attempt(self, batch_id: int, job_id: int, attempt_id: str) -> dict[str, Any] | None:
        """One attempt (with its instance's address and state), or None."""
        return await self.db.fetchone(
            f"{_ATTEMPT_SELECT} WHERE a.batch_id = %s AND a.job_id = %s AND a.attempt_id = %s",
            (batch_id, job_id, attempt_id), name="job_attempt")
