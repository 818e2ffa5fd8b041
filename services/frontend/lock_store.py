"""The lock monitor's reads (ListLocks): which locks are held or wanted, a
page at a time, and for a page's locks their holders and waiters.

Bounded, with the indexes the table already has (no scan of `job_locks`'
history): every read starts from the running batches of the projects the
caller sees (`batches_state`, `batches_billing_project_state`), reaches their
Ready, Creating and Running jobs (`jobs_scheduling`: batch, state) and only
then those jobs' lock rows (the primary key: batch, job, level). The index on
(level, lock_name) is kept out (IGNORE INDEX): it would walk every row ever
written at a name, finished jobs' included. A page reads at most
MAX_ACTIVE_LOCK_ROWS rows of active jobs' locks, the holders at most
MAX_HELD_LOCK_ROWS, and per lock the first WAITERS_READ waiters in queue
order; past a cap the call is refused (`TooManyLocks`) rather than answered
wrongly. Every statement also runs under the frontend's statement time
limit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

from services.db.database import Database
from services.db.plan_snapshot import MAY_RUN, locks_of
from services.policy.lock_contention import HeldLocks, LockMode, Locks, locks_from_rows
from services.policy.lock_monitor import Wanting
from services.policy.planner import JOBS_PER_CYCLE, JobKey

MAX_ACTIVE_LOCK_ROWS = 100_000
"""Most lock rows of active jobs one page reads to find its locks."""
MAX_HELD_LOCK_ROWS = 10_000
"""Most lock rows of running jobs one page reads (the holders of its projects)."""
WAITERS_READ = JOBS_PER_CYCLE
"""Waiters read per lock, from the head of the queue: the scheduler looks at no more jobs in a cycle."""

LockKey = tuple[str, str, str]
"""(billing project, level, name)."""

# The locks of active jobs after the page token: held (a Creating or Running job) or wanted (a Ready job the
# scheduler may start). The inner LIMIT bounds what is read; n_rows says whether it was reached.
_PAGE = """
SELECT billing_project, level, lock_name, SUM(COUNT(*)) OVER () AS n_rows
FROM (
  SELECT b.billing_project, l.level, l.lock_name
  FROM batches b
  JOIN jobs j ON j.batch_id = b.batch_id AND j.state IN ('Ready', 'Creating', 'Running')
  JOIN job_locks l IGNORE INDEX (job_locks_level_name) ON l.batch_id = j.batch_id AND l.job_id = j.job_id
  WHERE b.state = 'running' {where}
    AND (j.state <> 'Ready' OR {may_run})
  LIMIT %s
) active
GROUP BY billing_project, level, lock_name
ORDER BY billing_project, level, lock_name
LIMIT %s
"""

_HELD = """
SELECT b.billing_project, l.batch_id, l.job_id, l.level, l.mode, l.lock_name, a.start_time_ms
FROM batches b
JOIN jobs j ON j.batch_id = b.batch_id AND j.state IN ('Creating', 'Running')
JOIN job_locks l IGNORE INDEX (job_locks_level_name) ON l.batch_id = j.batch_id AND l.job_id = j.job_id
LEFT JOIN attempts a ON a.batch_id = j.batch_id AND a.job_id = j.job_id AND a.attempt_id = j.attempt_id
WHERE b.state = 'running' AND b.billing_project IN ({projects})
ORDER BY l.batch_id, l.job_id
LIMIT %s
"""

# How many Ready jobs need each lock, by mode (whether a mode waits depends on nothing else).
_WANTED = """
SELECT b.billing_project, l.level, l.lock_name, l.mode, COUNT(*) AS n
FROM batches b
JOIN jobs j ON j.batch_id = b.batch_id AND j.state = 'Ready'
JOIN job_locks l IGNORE INDEX (job_locks_level_name) ON l.batch_id = j.batch_id AND l.job_id = j.job_id
WHERE b.state = 'running' AND b.billing_project IN ({projects}) AND l.level IN ({levels})
  AND (b.billing_project, l.level, l.lock_name) IN ({keys}) AND {may_run}
GROUP BY b.billing_project, l.level, l.lock_name, l.mode
"""

# The head of one lock's queue of waiters, in the scheduler's queue order; one part per lock, one statement.
_WAITERS_PART = """
(SELECT %s AS line, l.batch_id, l.job_id, l.mode, j.priority, j.time_created_ms
 FROM batches b
 JOIN jobs j ON j.batch_id = b.batch_id AND j.state = 'Ready'
 JOIN job_locks l IGNORE INDEX (job_locks_level_name) ON l.batch_id = j.batch_id AND l.job_id = j.job_id
   AND l.level = %s AND l.lock_name = %s AND l.mode IN ({modes})
 WHERE b.state = 'running' AND b.billing_project = %s AND {may_run}
 ORDER BY j.priority DESC, l.batch_id, l.job_id
 LIMIT %s)"""


class TooManyLocks(Exception):
    """A page would read more rows than its cap."""


@dataclasses.dataclass(frozen=True)
class Holding:
    """A running job's lock row."""

    key: JobKey
    level: str
    mode: LockMode
    name: str
    since_ms: int | None
    """Its attempt's start; None while the attempt is being created."""


@dataclasses.dataclass(frozen=True)
class ProjectHolders:
    """What the running jobs of one project hold."""

    rows: list[Holding]
    index: HeldLocks
    """Their locks, merged per job as the scheduler merges them."""


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


class LockStore:
    """The lock monitor's reads (module docstring)."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = lambda: int(time.time() * 1000)):
        self.db = db
        self._clock = clock_ms

    def now_s(self) -> float:
        return self._clock() / 1000

    async def page(self, *, project: str | None, member: str | None, level: str, name: str,
                   after: LockKey | None, limit: int) -> list[LockKey]:
        """The next `limit` locks after `after`, of `project` (or every project `member` is in; None: all)."""
        where, params = [], []
        if project is not None:
            where.append("AND b.billing_project = %s")
            params.append(project)
        if member is not None:
            where.append("AND b.billing_project IN (SELECT m.billing_project FROM billing_project_members m "
                         "WHERE m.user = %s)")
            params.append(member)
        if level:
            where.append("AND l.level = %s")
            params.append(level)
        if name:
            where.append("AND l.lock_name = %s")
            params.append(name)
        if after is not None:
            where.append("AND (b.billing_project, l.level, l.lock_name) > (%s, %s, %s)")
            params += after
        sql = _PAGE.format(where=" ".join(where), may_run=MAY_RUN)
        rows = await self.db.fetchall(sql, (*params, MAX_ACTIVE_LOCK_ROWS + 1, limit), name="lock_page")
        if rows and int(rows[0]["n_rows"]) > MAX_ACTIVE_LOCK_ROWS:
            raise TooManyLocks(f"more than {MAX_ACTIVE_LOCK_ROWS} lock rows of active jobs")
        return [(r["billing_project"], r["level"], r["lock_name"]) for r in rows]

    async def holders(self, projects: Sequence[str]) -> dict[str, ProjectHolders]:
        """Every lock the running jobs of `projects` hold, at every level (the weights and the big lock need
        them all), by project."""
        ordered = sorted(set(projects))
        rows = await self.db.fetchall(_HELD.format(projects=_marks(len(ordered))),
                                      (*ordered, MAX_HELD_LOCK_ROWS + 1), name="lock_holders")
        if len(rows) > MAX_HELD_LOCK_ROWS:
            raise TooManyLocks(f"more than {MAX_HELD_LOCK_ROWS} locks held by running jobs")
        held: dict[str, ProjectHolders] = {p: ProjectHolders([], HeldLocks()) for p in ordered}
        per_job: dict[tuple[str, JobKey], list[tuple[str, str, str]]] = {}
        for r in rows:
            key = (r["batch_id"], r["job_id"])
            held[r["billing_project"]].rows.append(Holding(key, r["level"], LockMode.from_db(r["mode"]),
                                                           r["lock_name"], r["start_time_ms"]))
            per_job.setdefault((r["billing_project"], key), []).append((r["level"], r["mode"], r["lock_name"]))
        for (project, key), entries in per_job.items():  # in (batch, job) order, as read
            held[project].index.add(key, locks_from_rows(entries))
        return held

    async def wanted(self, keys: Sequence[LockKey]) -> dict[tuple[LockKey, LockMode], int]:
        """How many Ready jobs the scheduler may start need each lock, by mode."""
        projects, levels = sorted({k[0] for k in keys}), sorted({k[1] for k in keys})
        sql = _WANTED.format(projects=_marks(len(projects)), levels=_marks(len(levels)),
                             keys=", ".join(["(%s, %s, %s)"] * len(keys)), may_run=MAY_RUN)
        rows = await self.db.fetchall(sql, (*projects, *levels, *(v for k in keys for v in k)), name="lock_wanted")
        return {((r["billing_project"], r["level"], r["lock_name"]), LockMode.from_db(r["mode"])): int(r["n"])
                for r in rows}

    async def waiting(self, modes: dict[LockKey, frozenset[LockMode]]) -> dict[LockKey, list[Wanting]]:
        """For each lock, the first WAITERS_READ Ready jobs needing it in one of its `modes`, in queue order,
        with all their locks."""
        lines = [(key, sorted(m.value for m in ms)) for key, ms in modes.items() if ms]
        if not lines:
            return {}
        parts, params = [], []
        for n, ((project, level, name), values) in enumerate(lines):
            parts.append(_WAITERS_PART.format(modes=_marks(len(values)), may_run=MAY_RUN))
            params += [n, level, name, *values, project, WAITERS_READ]
        rows = await self.db.fetchall(" UNION ALL ".join(parts), tuple(params), name="lock_waiters")
        keys = sorted({(r["batch_id"], r["job_id"]) for r in rows})
        locks: dict[JobKey, Locks] = await locks_of(self.db, keys) if keys else {}
        out: dict[LockKey, list[Wanting]] = {key: [] for key, _ in lines}
        for r in rows:
            key = (r["batch_id"], r["job_id"])
            out[lines[int(r["line"])][0]].append(Wanting(key, LockMode.from_db(r["mode"]), int(r["priority"]),
                                                         int(r["time_created_ms"]) / 1000, locks.get(key, {})))
        return out


def rows_of(holders: ProjectHolders, key: LockKey) -> list[Holding]:
    """The holders' rows at exactly this lock."""
    _, level, name = key
    return [h for h in holders.rows if h.level == level and h.name == name]

