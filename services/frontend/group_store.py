"""Reads of job groups for JobGroupService.

A group exists for readers once its update is committed (the root group 0
always). Its counts cover its whole subtree: completions from the tokenized
`job_groups_n_jobs_in_complete_states` (every final transition is counted
in each ancestor's rows), live counts summed over the subtree's
`user_inst_coll_resources_by_job_group` rows through the closure table,
cost from `aggregated_job_group_resources`. Each is one grouped query per
page of groups, never a scan of the jobs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from services.db.database import Database

_GROUP_SELECT = """
SELECT g.batch_id, g.job_group_id, g.parent_id, COALESCE(g.update_id, 0) AS update_id, g.state, g.n_jobs,
       g.cancel_after_n_failures, COALESCE(u.time_committed_ms, g.time_created_ms) AS created_ms,
       g.time_completed_ms, g.retry_policy
FROM job_groups g
LEFT JOIN batch_updates u ON u.batch_id = g.batch_id AND u.update_id = g.update_id
WHERE g.batch_id = %s AND (g.update_id IS NULL OR u.committed)
"""


@dataclasses.dataclass(frozen=True)
class GroupCounts:
    """Jobs of a group's subtree by state."""

    n_jobs: int
    n_ready: int = 0
    n_running: int = 0
    n_succeeded: int = 0
    n_failed: int = 0
    n_errored: int = 0
    n_cancelled: int = 0

    @property
    def n_pending(self) -> int:
        done = self.n_succeeded + self.n_failed + self.n_errored + self.n_cancelled
        return max(0, self.n_jobs - done - self.n_ready - self.n_running)


def _in(ids: list[int]) -> str:
    return ", ".join(["%s"] * len(ids))


class GroupReadStore:
    """SQL reads behind GetJobGroup and ListJobGroups."""

    def __init__(self, db: Database):
        self.db = db

    async def get_group(self, batch_id: int, job_group_id: int) -> dict[str, Any] | None:
        """One committed group (or the root), or None."""
        return await self.db.fetchone(f"{_GROUP_SELECT} AND g.job_group_id = %s", (batch_id, job_group_id),
                                      name="get_job_group")

    async def list_groups(self, batch_id: int, parent_id: int | None, after_id: int, limit: int
                          ) -> list[dict[str, Any]]:
        """Committed groups by increasing id after `after_id` (-1 includes the root),
        all of them or the direct children of `parent_id`."""
        return await self.db.fetchall(
            f"""{_GROUP_SELECT} AND g.job_group_id > %s AND (%s IS NULL OR g.parent_id = %s)
                ORDER BY g.job_group_id LIMIT %s""",
            (batch_id, after_id, parent_id, parent_id, limit), name="list_job_groups")

    async def details(self, batch_id: int, rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
        """Per group id: attributes, counts, cost_usd and the nearest cancellation."""
        ids = [r["job_group_id"] for r in rows]
        found: dict[int, dict[str, Any]] = {
            r["job_group_id"]: {"attributes": {}, "counts": GroupCounts(int(r["n_jobs"])), "cost_usd": 0.0,
                                "cancellation": None} for r in rows}
        if not ids:
            return found
        params = (batch_id, *ids)
        for a in await self.db.fetchall(
                f"SELECT job_group_id, `key`, `value` FROM job_group_attributes WHERE batch_id = %s"
                f" AND job_group_id IN ({_in(ids)})", params, name="job_group_attributes"):
            found[a["job_group_id"]]["attributes"][a["key"]] = a["value"] or ""
        done = {r["job_group_id"]: r for r in await self.db.fetchall(
            f"""SELECT job_group_id, SUM(n_succeeded) s, SUM(n_failed) f, SUM(n_errored) e, SUM(n_cancelled) c
                FROM job_groups_n_jobs_in_complete_states WHERE batch_id = %s AND job_group_id IN ({_in(ids)})
                GROUP BY job_group_id""", params, name="job_group_completion_counts")}
        live = {r["job_group_id"]: r for r in await self.db.fetchall(
            f"""SELECT a.ancestor_id AS job_group_id,
                       SUM(r.n_ready_cancellable_jobs + r.n_ready_always_run_jobs + r.n_ready_dependency_failed_jobs)
                         AS ready,
                       SUM(r.n_running_jobs + r.n_creating_jobs) AS running
                FROM job_group_self_and_ancestors a
                JOIN user_inst_coll_resources_by_job_group r
                  ON r.batch_id = a.batch_id AND r.job_group_id = a.job_group_id
                WHERE a.batch_id = %s AND a.ancestor_id IN ({_in(ids)})
                GROUP BY a.ancestor_id""", params, name="job_group_live_counts")}
        for group_id, entry in found.items():
            d, v = done.get(group_id, {}), live.get(group_id, {})
            entry["counts"] = GroupCounts(
                entry["counts"].n_jobs, int(v.get("ready") or 0), int(v.get("running") or 0), int(d.get("s") or 0),
                int(d.get("f") or 0), int(d.get("e") or 0), int(d.get("c") or 0))
        for c in await self.db.fetchall(
                f"""SELECT x.job_group_id, SUM(x.`usage` * xr.rate_usd) AS cost_usd
                    FROM aggregated_job_group_resources x JOIN resources xr ON xr.resource_id = x.resource_id
                    WHERE x.batch_id = %s AND x.job_group_id IN ({_in(ids)}) GROUP BY x.job_group_id""",
                params, name="job_group_costs"):
            found[c["job_group_id"]]["cost_usd"] = float(c["cost_usd"] or 0)
        # The nearest cancelled group at or above each one (level 0 is the group itself).
        for c in await self.db.fetchall(
                f"""SELECT a.job_group_id, a.level, c.cancelled_by, c.reason, c.time_cancelled_ms
                    FROM job_group_self_and_ancestors a
                    JOIN job_groups_cancelled c ON c.batch_id = a.batch_id AND c.job_group_id = a.ancestor_id
                    WHERE a.batch_id = %s AND a.job_group_id IN ({_in(ids)})
                    ORDER BY a.job_group_id, a.level""", params, name="job_group_cancellations"):
            entry = found[c["job_group_id"]]
            if entry["cancellation"] is None:
                entry["cancellation"] = c
        return found
