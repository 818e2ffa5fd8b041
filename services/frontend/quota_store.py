"""Quotas and fair-share weights of billing projects and users in the database (migration 0031): SetQuota
writes them through the set_quota procedure, ListQuotas reads them.

Who sees what: administrators and developers (who see every project) see every quota; anyone else sees the
quotas of the projects they are a member of and their own. Only administrators set them (the servicer,
services.frontend.billing, checks that before anything is read).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from services.db.database import Database
from services.db.store import wall_clock_ms

KINDS = ("project", "user")
"""The kinds in their list order."""
MAX_CAP = 1_000_000_000
"""The largest cap of any kind (set_quota checks it too)."""
MAX_WEIGHT = 1000


@dataclasses.dataclass(frozen=True)
class QuotaRow:
    """One quota as stored; a cap None is none."""

    kind: str
    name: str
    max_running_cores_mcpu: int | None = None
    max_running_jobs: int | None = None
    max_ready_jobs: int | None = None
    weight: int = 1
    set_by: str = ""
    time_set_ms: int | None = None


def _row(r: dict) -> QuotaRow:
    return QuotaRow(r["kind"], r["name"], r["max_running_cores_mcpu"], r["max_running_jobs"], r["max_ready_jobs"],
                    int(r["weight"]), r["set_by"], int(r["time_set_ms"]))


class QuotaStore:
    """The quotas table and its procedure."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = wall_clock_ms):
        self.db = db
        self.clock_ms = clock_ms

    async def set_quota(self, quota: QuotaRow, user: str) -> QuotaRow:
        """Set (or, with no cap and weight 1, clear) a quota (set_quota); the quota now. NotFoundError for
        no such project or user, InvalidArgumentError for a value out of range."""
        await self.db.call("set_quota", quota.kind, quota.name, quota.max_running_cores_mcpu,
                           quota.max_running_jobs, quota.max_ready_jobs, quota.weight, user, self.clock_ms())
        return await self.get(quota.kind, quota.name) or QuotaRow(quota.kind, quota.name)

    async def get(self, kind: str, name: str) -> QuotaRow | None:
        row = await self.db.fetchone("SELECT * FROM quotas WHERE kind = %s AND name = %s", (kind, name),
                                     name="get_quota")
        return _row(row) if row else None

    async def list_quotas(self, kinds: tuple[str, ...], reader: str | None, after: tuple[str, str] | None,
                          limit: int) -> list[QuotaRow]:
        """Quotas of `kinds` by kind (projects first) then name, after `after`; `reader` None: every quota,
        else those of the projects `reader` is a member of (not deleted) and `reader`'s own."""
        where, params = [f"q.kind IN ({', '.join(['%s'] * len(kinds))})"], list(kinds)
        if after is not None:
            where.append("(q.kind > %s OR (q.kind = %s AND q.name > %s))")
            params += [after[0], after[0], after[1]]
        if reader is not None:
            where.append("((q.kind = 'user' AND q.name = %s) OR (q.kind = 'project' AND EXISTS ("
                         "SELECT 1 FROM billing_project_members m "
                         "JOIN billing_projects p ON p.name = m.billing_project "
                         "WHERE m.billing_project = q.name AND m.user = %s AND p.state <> 'deleted')))")
            params += [reader, reader]
        rows = await self.db.fetchall(f"SELECT q.* FROM quotas q WHERE {' AND '.join(where)} "
                                      "ORDER BY q.kind, q.name LIMIT %s", (*params, limit), name="list_quotas")
        return [_row(r) for r in rows]
