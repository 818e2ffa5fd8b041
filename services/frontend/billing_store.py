"""Billing projects in the database: membership, limits, state and spend.

Who may do what (the servicer enforces it with the helpers below):
- *read* a project (get, list, spend, watch): its members, administrators,
  and developers (who read every batch too, for debugging). Anybody else
  gets NOT_FOUND, the answer for a project that does not exist, and lists
  leave the project out: outsiders learn no project names (the same rule
  as for batches, services.frontend.access). Submitting to a project one
  is not a member of is NOT_FOUND too, unless one may read it.
- *change* a project (add or remove members, set the limit, close, reopen,
  delete): administrators only; a reader who is not one gets
  PERMISSION_DENIED. Exception: a member may remove themselves.
- *create* a project: administrators only. Developers may not: creating
  sets the limit and the members, so a developer who could create could
  give themselves an unlimited account without any administrator's say.

States: `open` accepts batches; `closed` refuses new batches (the
`create_batch` procedure checks) while running ones go on; `deleted` is
final, only reachable from `closed` with no running batch, hidden from
lists unless asked for, and read-only. Rows are never removed: the name
stays taken and the spend records stay. Every change is a stored procedure
(`sql/procedures/*billing_project*.sql`) that locks the project row first
(the lock order: `create_batch` share-locks the same row) and checks its
state under that lock.

Money: SQL keeps `limit_usd` as DOUBLE and costs as SUM(usage × rate_usd);
the API speaks integer micro-dollars. `micro_from_usd(usd_from_micro(m)) ==
m` for every 0 ≤ m ≤ MAX_MICRO_USD (a double holds m/1e6 to within
m·2⁻⁵³, far below half a micro-dollar there).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from services.common.identity import Principal
from services.db.database import ConflictError, Database, FailedPreconditionError, NotFoundError
from services.db.store import wall_clock_ms

MAX_MICRO_USD = 10**15
"""Largest limit accepted (1e9 USD): the DOUBLE round trip stays exact below it."""
_READ_ROLES = frozenset({"admin", "developer"})
_LISTED_STATES = ("open", "closed")
_EPOCH_DAY = datetime.date(1970, 1, 1)

# Spend of one project: tokens × resources rows, a few hundred at most.
_SPEND_COLUMNS = """(SELECT COALESCE(SUM(a.`usage` * r.rate_usd), 0)
                      FROM aggregated_billing_project_resources a
                      JOIN resources r ON r.resource_id = a.resource_id
                      WHERE a.billing_project = p.name) AS spend_usd,
                     (SELECT COALESCE(SUM(v.reserved_micro_usd), 0)
                      FROM aggregated_billing_project_reservations v
                      WHERE v.billing_project = p.name) AS reserved_micro_usd"""


def usd_from_micro(micro_usd: int) -> float:
    """Micro-dollars (the API) to dollars (the DOUBLE columns)."""
    return micro_usd / 1e6


def micro_from_usd(usd: float) -> int:
    """Dollars to whole micro-dollars, rounded to the nearest."""
    return int(round(usd * 1e6))


@dataclasses.dataclass(frozen=True)
class BillingProject:
    """A row of `billing_projects` with its members and spend so far."""

    name: str
    state: str
    """'open', 'closed' or 'deleted'."""
    limit_usd: float | None
    """None: unlimited."""
    created_at_ms: int
    members: tuple[str, ...]
    """Usernames, sorted."""
    spend_usd: float
    """SUM(usage × rate) over the project's aggregate."""
    reserved_micro_usd: int = 0
    """What the project's running attempts reserved (their worst case, while it has a limit)."""
    max_job_duration_ms: int = 3_600_000
    """While it has a limit: the timeout of a job without one (what its worst case is reserved for)."""


def may_read(principal: Principal, project: BillingProject) -> bool:
    """Members, administrators and developers see a project; nobody else."""
    return bool(principal.roles & _READ_ROLES) or principal.name in project.members


def sees_every_project(principal: Principal) -> bool:
    return bool(principal.roles & _READ_ROLES)


class ProjectExists(Exception):
    """create_project with a taken name (deleted projects keep theirs)."""


class UnknownUser(Exception):
    """A member to add who is not a user of corral (the `usernames` view, migration 0020)."""

    def __init__(self, username: str):
        super().__init__(username)
        self.username = username


class StateRefuses(Exception):
    """The project's state refuses the change (deleted; open when deleting; running batches)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


@dataclasses.dataclass(frozen=True)
class BatchCost:
    """One batch's accrued cost, as WatchSpend samples it."""

    batch_id: int
    state: str
    """'open', 'running' or 'complete'."""
    cost_usd: float


class BillingStore:
    """The reads and procedure calls behind BillingService."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = wall_clock_ms):
        self.db = db
        self.clock_ms = clock_ms

    # -- projects ----------------------------------------------------------

    async def create_project(self, name: str, members: Iterable[str], limit_usd: float | None) -> BillingProject:
        """An open project with its members (`create_billing_project`); ProjectExists if the name is taken,
        UnknownUser if a member is not a user."""
        try:
            await self.db.call("create_billing_project", name, sorted(set(members)), limit_usd, self.clock_ms())
        except ConflictError as e:
            raise ProjectExists(name) from e
        except NotFoundError as e:
            raise UnknownUser(str(e.status["username"])) from None
        project = await self.get_project(name)
        assert project is not None
        return project

    async def get_project(self, name: str) -> BillingProject | None:
        rows = await self.db.fetchall(
            f"SELECT p.*, {_SPEND_COLUMNS} FROM billing_projects p WHERE p.name = %s",
            (name,), name="get_billing_project")
        projects = await self._with_members(rows)
        return projects[0] if projects else None

    async def list_projects(self, states: Sequence[str], member: str | None, visible_to: str | None,
                            after: str, limit: int) -> list[BillingProject]:
        """Projects by name after `after`: in `states`, with `member` among their members
        if given, and only those `visible_to` is a member of unless it is None (sees all)."""
        in_states = ", ".join(["%s"] * len(states))
        rows = await self.db.fetchall(
            f"""SELECT p.*, {_SPEND_COLUMNS} FROM billing_projects p
                WHERE p.name > %s AND p.state IN ({in_states})
                  AND (%s IS NULL OR EXISTS (SELECT 1 FROM billing_project_members m
                                             WHERE m.billing_project = p.name AND m.user = %s))
                  AND (%s IS NULL OR EXISTS (SELECT 1 FROM billing_project_members m
                                             WHERE m.billing_project = p.name AND m.user = %s))
                ORDER BY p.name LIMIT %s""",
            (after, *states, visible_to, visible_to, member, member, limit), name="list_billing_projects")
        return await self._with_members(rows)

    async def _with_members(self, rows: list[dict[str, Any]]) -> list[BillingProject]:
        if not rows:
            return []
        names = [r["name"] for r in rows]
        members: dict[str, list[str]] = {n: [] for n in names}
        for m in await self.db.fetchall(
                f"""SELECT billing_project, user FROM billing_project_members
                    WHERE billing_project IN ({', '.join(['%s'] * len(names))}) ORDER BY user""",
                tuple(names), name="billing_project_members"):
            members[m["billing_project"]].append(m["user"])
        return [BillingProject(r["name"], r["state"], r["limit_usd"], r["time_created_ms"],
                               tuple(members[r["name"]]), float(r["spend_usd"]), int(r["reserved_micro_usd"]),
                               int(r["max_job_duration_ms"]))
                for r in rows]

    # -- changes: each a procedure that locks the project row, then checks its state

    async def _change(self, procedure: str, name: str, *args: Any) -> None:
        """Call a procedure that changes project `name`; its refusals as StateRefuses and UnknownUser."""
        try:
            await self.db.call(procedure, name, *args)
        except NotFoundError as e:
            if "username" in e.status:
                raise UnknownUser(str(e.status["username"])) from None
            # The servicer found the project before calling; rows are never removed.
            raise StateRefuses(f"billing project {name} vanished") from None
        except FailedPreconditionError as e:
            raise StateRefuses(e.message) from None

    async def add_member(self, name: str, user: str) -> None:
        """Idempotent; refused on a deleted project, and UnknownUser if `user` is not a user."""
        await self._change("add_billing_project_member", name, user)

    async def remove_member(self, name: str, user: str) -> None:
        """Idempotent; refused on a deleted project. The user's running batches go on."""
        await self._change("remove_billing_project_member", name, user)

    async def set_limit(self, name: str, limit_usd: float | None, max_job_duration_ms: int | None = None) -> None:
        """None removes the limit (a None duration keeps the project's); refused on a deleted project."""
        await self._change("set_billing_project_limit", name, limit_usd, max_job_duration_ms)

    async def set_open(self, name: str, is_open: bool) -> None:
        """Close or reopen (idempotent); refused on a deleted project."""
        await self._change("set_billing_project_open", name, is_open)

    async def delete_project(self, name: str) -> None:
        """closed → deleted when no batch of the project is running, its secrets deleted with it; deleting again
        changes nothing (`delete_billing_project`)."""
        await self._change("delete_billing_project", name)

    # -- spend -------------------------------------------------------------

    async def spend_by_date(self, name: str, first_day: datetime.date | None, last_day: datetime.date) -> float:
        """Cost billed on UTC days first_day..last_day (None: from the beginning)."""
        row = await self.db.fetchone(
            """SELECT COALESCE(SUM(d.`usage` * r.rate_usd), 0) AS cost_usd
               FROM aggregated_billing_project_user_resources_by_date d
               JOIN resources r ON r.resource_id = d.resource_id
               WHERE d.billing_project = %s AND d.billing_date BETWEEN %s AND %s""",
            (name, first_day or _EPOCH_DAY, last_day), name="billing_spend_by_date")
        return float(row["cost_usd"]) if row else 0.0

    async def spend_lines_by_day(self, name: str, first_day: datetime.date | None, last_day: datetime.date,
                                 after: datetime.date | None, limit: int) -> list[tuple[datetime.date, float]]:
        """(day, cost) ascending, days after `after`."""
        rows = await self.db.fetchall(
            """SELECT d.billing_date AS k, SUM(d.`usage` * r.rate_usd) AS cost_usd
               FROM aggregated_billing_project_user_resources_by_date d
               JOIN resources r ON r.resource_id = d.resource_id
               WHERE d.billing_project = %s AND d.billing_date BETWEEN %s AND %s AND d.billing_date > %s
               GROUP BY d.billing_date ORDER BY d.billing_date LIMIT %s""",
            (name, first_day or _EPOCH_DAY, last_day, after or _EPOCH_DAY - datetime.timedelta(days=1), limit),
            name="billing_spend_lines_by_day")
        return [(r["k"], float(r["cost_usd"])) for r in rows]

    async def spend_lines_by_user(self, name: str, first_day: datetime.date | None, last_day: datetime.date,
                                  after: str, limit: int) -> list[tuple[str, float]]:
        """(batch owner, cost) by username, usernames after `after`."""
        rows = await self.db.fetchall(
            """SELECT d.user AS k, SUM(d.`usage` * r.rate_usd) AS cost_usd
               FROM aggregated_billing_project_user_resources_by_date d
               JOIN resources r ON r.resource_id = d.resource_id
               WHERE d.billing_project = %s AND d.billing_date BETWEEN %s AND %s AND d.user > %s
               GROUP BY d.user ORDER BY d.user LIMIT %s""",
            (name, first_day or _EPOCH_DAY, last_day, after, limit), name="billing_spend_lines_by_user")
        return [(r["k"], float(r["cost_usd"])) for r in rows]

    async def reservations(self, name: str, limit: int) -> list[dict[str, Any]]:
        """Per batch whose unfinished attempts hold budget (schedule_jobs' reservations, migration 0013):
        batch_id, reserved_micro_usd, since_ms (their oldest start; None before any started) and n_attempts,
        the largest first. Only open and running batches are read: a complete batch's jobs are all final,
        and a job's attempt ends (giving its reservation back) as the job completes."""
        return await self.db.fetchall(
            """SELECT a.batch_id, SUM(a.reserved_micro_usd) AS reserved_micro_usd, MIN(a.start_time_ms) AS since_ms,
                      COUNT(*) AS n_attempts
               FROM batches b
               JOIN attempts a ON a.batch_id = b.batch_id AND a.end_time_ms IS NULL AND a.reserved_micro_usd > 0
               WHERE b.billing_project = %s AND b.state IN ('open', 'running')
               GROUP BY a.batch_id ORDER BY reserved_micro_usd DESC, a.batch_id LIMIT %s""",
            (name, limit), name="billing_reservations")

    async def spend_lines_by_batch(self, name: str, after: int, limit: int) -> list[tuple[int, float]]:
        """(batch id, whole-life cost) ascending, ids after `after`; batches that cost nothing have no line.

        The schema keeps a batch's cost (group 0 of aggregated_job_group_resources)
        but not by day, so these lines cannot be restricted to a day range."""
        rows = await self.db.fetchall(
            """SELECT b.batch_id AS k, SUM(a.`usage` * r.rate_usd) AS cost_usd
               FROM batches b
               JOIN aggregated_job_group_resources a ON a.batch_id = b.batch_id AND a.job_group_id = 0
               JOIN resources r ON r.resource_id = a.resource_id
               WHERE b.billing_project = %s AND b.batch_id > %s
               GROUP BY b.batch_id ORDER BY b.batch_id LIMIT %s""",
            (name, after, limit), name="billing_spend_lines_by_batch")
        return [(int(r["k"]), float(r["cost_usd"])) for r in rows]

    async def max_batch_id(self) -> int:
        """The highest batch id so far, of any project (a primary-key lookup)."""
        row = await self.db.fetchone("SELECT COALESCE(MAX(batch_id), 0) AS m FROM batches", name="max_batch_id")
        return int(row["m"]) if row else 0

    async def batch_costs(self, name: str, tracked: Sequence[int], after_id: int | None) -> list[BatchCost]:
        """Costs of the project's batches whose cost may have grown since the last sample:
        open or running now, in `tracked` (not complete at the last sample), or with an
        id above `after_id` (created since). Each part is an index range, not a scan
        of the project's history."""
        parts = ["SELECT batch_id FROM batches WHERE billing_project = %s AND state IN ('open', 'running')"]
        params: list[Any] = [name]
        if after_id is not None:
            parts.append("SELECT batch_id FROM batches WHERE batch_id > %s AND billing_project = %s")
            params += [after_id, name]
        if tracked:
            parts.append(f"SELECT batch_id FROM batches WHERE batch_id IN ({', '.join(['%s'] * len(tracked))})")
            params += list(tracked)
        rows = await self.db.fetchall(
            f"""SELECT b.batch_id, b.state, COALESCE(SUM(a.`usage` * r.rate_usd), 0) AS cost_usd
                FROM ({' UNION '.join(parts)}) x
                JOIN batches b ON b.batch_id = x.batch_id
                LEFT JOIN aggregated_job_group_resources a ON a.batch_id = b.batch_id AND a.job_group_id = 0
                LEFT JOIN resources r ON r.resource_id = a.resource_id
                GROUP BY b.batch_id, b.state""",
            tuple(params), name="billing_watch_batch_costs")
        return [BatchCost(int(r["batch_id"]), r["state"], float(r["cost_usd"])) for r in rows]


class BatchCostTracker:
    """Which batches' cost grew between two samples of one WatchSpend stream.

    Pure bookkeeping over `BillingStore.batch_costs` samples. A batch seen
    for the first time grew from 0 if it was created after the stream began
    (it was open, costing nothing, at every earlier sample, or it would have
    been sampled). A batch that existed, complete, when the stream began and
    then got a new update has no known earlier cost: its first sample is
    its baseline and only later growth is reported. The lines are a guide;
    the stream's total delta is exact.
    """

    MAX_TRACKED = 100_000
    """Beyond this many remembered costs, forget complete batches (they become 'existed at the start')."""

    def __init__(self) -> None:
        self._costs: dict[int, int] = {}
        self._incomplete: set[int] = set()
        self._horizon_id: int | None = None
        self.after_id: int | None = None
        """Batches above this id are new since the last sample."""

    def tracked(self) -> list[int]:
        """Batches that were not complete at the last sample."""
        return sorted(self._incomplete)

    def sample(self, costs: Iterable[BatchCost], max_batch_id: int) -> list[tuple[int, int]]:
        """Record a sample taken after reading `max_batch_id`; (batch id, growth in
        micro-dollars) of the batches that grew, largest first."""
        first = self._horizon_id is None
        if first:
            self._horizon_id = max_batch_id
        grown = []
        for c in costs:
            micro = micro_from_usd(c.cost_usd)
            before = self._costs.get(c.batch_id)
            if before is None and not first and c.batch_id > (self._horizon_id or 0):
                before = 0
            if before is not None and micro > before:
                grown.append((c.batch_id, micro - before))
            self._costs[c.batch_id] = micro
            if c.state == "complete":
                self._incomplete.discard(c.batch_id)
            else:
                self._incomplete.add(c.batch_id)
        self.after_id = max_batch_id
        if len(self._costs) > self.MAX_TRACKED:
            self._costs = {b: v for b, v in self._costs.items() if b in self._incomplete}
            self._horizon_id = max_batch_id
        grown.sort(key=lambda g: (-g[1], g[0]))
        return grown
