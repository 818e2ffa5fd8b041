"""Recompute every maintained counter and aggregate from the base tables.

The triggers and procedures keep tokenized counters, group and batch job
counts, instance free cores and reserved memory and storage, pending-parent
counts, held locks, billing aggregates and each job's copy of its owner up to
date incrementally.
`check_invariants` recomputes each of them from jobs, job_parents,
job_child_releases, job_locks, attempts and attempt_resources and returns
one line per difference (an empty list means consistent). Tests run it
after every scenario; an operator or the driver can run it on a quiet
database.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from services.db.database import Database


Key = tuple[Any, ...]
Counts = dict[Key, tuple[Any, ...]]


def _index(rows: Iterable[dict[str, Any]], key: tuple[str, ...], values: tuple[str, ...]) -> Counts:
    return {tuple(r[k] for k in key): tuple(int(r[v] or 0) for v in values) for r in rows}


def _compare(name: str, stored: Counts, expected: Counts, columns: tuple[str, ...]) -> list[str]:
    """Differences, treating a missing row as all zeros."""
    problems = []
    zero = (0,) * len(columns)
    for key in sorted(set(stored) | set(expected), key=repr):
        have, want = stored.get(key, zero), expected.get(key, zero)
        if have != want:
            detail = ", ".join(f"{c}={h} (expected {w})" for c, h, w in zip(columns, have, want) if h != w)
            problems.append(f"{name} {key}: {detail}")
    return problems


async def _check(
    db: Database, name: str, stored_sql: str, expected_sql: str, key: tuple[str, ...], columns: tuple[str, ...]
) -> list[str]:
    stored = _index(await db.fetchall(stored_sql, name=f"invariant_{name}_stored"), key, columns)
    expected = _index(await db.fetchall(expected_sql, name=f"invariant_{name}_expected"), key, columns)
    return _compare(name, stored, expected, columns)


_COMMITTED_JOBS = """
  jobs j JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id AND u.committed
"""

# A group counts from the moment its update is committed (the root always).
_VISIBLE_GROUPS = """
  job_groups g
  JOIN batches b ON b.batch_id = g.batch_id AND b.state <> 'open'
  LEFT JOIN batch_updates gu ON gu.batch_id = g.batch_id AND gu.update_id = g.update_id
  WHERE (g.update_id IS NULL OR gu.committed)
"""


async def _completion_counters(db: Database) -> list[str]:
    columns = ("n_completed", "n_succeeded", "n_failed", "n_errored", "n_cancelled")
    return await _check(
        db, "job_groups_n_jobs_in_complete_states",
        """SELECT batch_id, job_group_id, SUM(n_completed) n_completed, SUM(n_succeeded) n_succeeded,
                  SUM(n_failed) n_failed, SUM(n_errored) n_errored, SUM(n_cancelled) n_cancelled
           FROM job_groups_n_jobs_in_complete_states GROUP BY batch_id, job_group_id""",
        f"""SELECT j.batch_id, a.ancestor_id AS job_group_id,
                  SUM(j.state IN ('Success', 'Failed', 'Error', 'Cancelled')) n_completed,
                  SUM(j.state = 'Success') n_succeeded, SUM(j.state = 'Failed') n_failed,
                  SUM(j.state = 'Error') n_errored, SUM(j.state = 'Cancelled') n_cancelled
           FROM {_COMMITTED_JOBS}
           JOIN job_group_self_and_ancestors a ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
           GROUP BY j.batch_id, a.ancestor_id""",
        ("batch_id", "job_group_id"), columns,
    )


async def _group_and_batch_counts(db: Database) -> list[str]:
    problems = await _check(
        db, "job_groups.n_jobs",
        f"SELECT g.batch_id, g.job_group_id, g.n_jobs FROM {_VISIBLE_GROUPS}",
        f"""SELECT j.batch_id, a.ancestor_id AS job_group_id, COUNT(*) n_jobs
           FROM {_COMMITTED_JOBS}
           JOIN job_group_self_and_ancestors a ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
           GROUP BY j.batch_id, a.ancestor_id""",
        ("batch_id", "job_group_id"), ("n_jobs",),
    )
    problems += await _check(
        db, "batches.n_jobs",
        "SELECT batch_id, n_jobs FROM batches",
        f"SELECT j.batch_id, COUNT(*) n_jobs FROM {_COMMITTED_JOBS} GROUP BY j.batch_id",
        ("batch_id",), ("n_jobs",),
    )
    # A visible group is complete exactly when every job in its subtree is final.
    problems += await _check(
        db, "job_groups.state",
        f"SELECT g.batch_id, g.job_group_id, g.state = 'complete' AS complete FROM {_VISIBLE_GROUPS}",
        f"""SELECT g.batch_id, g.job_group_id,
                  NOT EXISTS (SELECT 1 FROM job_group_self_and_ancestors a
                              JOIN jobs j ON j.batch_id = a.batch_id AND j.job_group_id = a.job_group_id
                              JOIN batch_updates u ON u.batch_id = j.batch_id AND u.update_id = j.update_id
                              WHERE a.batch_id = g.batch_id AND a.ancestor_id = g.job_group_id AND u.committed
                                AND j.state NOT IN ('Success', 'Failed', 'Error', 'Cancelled')) AS complete
           FROM {_VISIBLE_GROUPS}""",
        ("batch_id", "job_group_id"), ("complete",),
    )
    problems += await _check(
        db, "batches.state",
        "SELECT batch_id, state = 'complete' AS complete FROM batches WHERE state <> 'open'",
        """SELECT b.batch_id, g.state = 'complete' AS complete FROM batches b
           JOIN job_groups g ON g.batch_id = b.batch_id AND g.job_group_id = 0 WHERE b.state <> 'open'""",
        ("batch_id",), ("complete",),
    )
    # A complete batch has recorded its completion (the callback outbox) for
    # its current number of jobs; a running one has not.
    problems += await _check(
        db, "batch_completions",
        """SELECT b.batch_id, EXISTS (SELECT 1 FROM batch_completions c
                                     WHERE c.batch_id = b.batch_id AND c.n_jobs = b.n_jobs) AS recorded
           FROM batches b WHERE b.state <> 'open'""",
        "SELECT batch_id, state = 'complete' AS recorded FROM batches WHERE state <> 'open'",
        ("batch_id",), ("recorded",),
    )
    return problems


async def _resource_counters(db: Database) -> list[str]:
    columns = (
        "n_ready_cancellable_jobs", "ready_cancellable_cores_mcpu", "n_ready_always_run_jobs",
        "ready_always_run_cores_mcpu", "n_ready_dependency_failed_jobs", "n_creating_jobs",
        "n_creating_cancellable_jobs", "n_running_jobs", "running_cores_mcpu", "n_running_cancellable_jobs",
    )
    sums = ", ".join(f"SUM({c}) {c}" for c in columns)
    return await _check(
        db, "user_inst_coll_resources_by_job_group",
        f"""SELECT user, inst_coll, batch_id, job_group_id, {sums}
            FROM user_inst_coll_resources_by_job_group GROUP BY user, inst_coll, batch_id, job_group_id""",
        """SELECT b.user, j.inst_coll, j.batch_id, j.job_group_id,
             SUM(j.state = 'Ready' AND NOT j.always_run AND NOT j.dependency_failed) n_ready_cancellable_jobs,
             SUM(IF(j.state = 'Ready' AND NOT j.always_run AND NOT j.dependency_failed, j.cores_mcpu, 0))
               ready_cancellable_cores_mcpu,
             SUM(j.state = 'Ready' AND j.always_run) n_ready_always_run_jobs,
             SUM(IF(j.state = 'Ready' AND j.always_run, j.cores_mcpu, 0)) ready_always_run_cores_mcpu,
             SUM(j.state = 'Ready' AND NOT j.always_run AND j.dependency_failed) n_ready_dependency_failed_jobs,
             SUM(j.state = 'Creating') n_creating_jobs,
             SUM(j.state = 'Creating' AND NOT j.always_run) n_creating_cancellable_jobs,
             SUM(j.state = 'Running') n_running_jobs,
             SUM(IF(j.state = 'Running', j.cores_mcpu, 0)) running_cores_mcpu,
             SUM(j.state = 'Running' AND NOT j.always_run) n_running_cancellable_jobs
           FROM jobs j JOIN batches b ON b.batch_id = j.batch_id
           GROUP BY b.user, j.inst_coll, j.batch_id, j.job_group_id""",
        ("user", "inst_coll", "batch_id", "job_group_id"), columns,
    )


# Whether the edge e (child j, parent p) has been released: p is final and
# its queued release, if any, is past the child.
_RELEASED = """(p.state IN ('Success', 'Failed', 'Error', 'Cancelled')
                AND (r.parent_id IS NULL OR e.job_id < r.next_child_id))"""


async def _instances_and_parents(db: Database) -> list[str]:
    problems = await _check(
        db, "instances.free_cores_mcpu",
        "SELECT name, free_cores_mcpu, used_memory_bytes, used_storage_bytes FROM instances",
        """SELECT i.name, i.cores_mcpu - COALESCE(SUM(IF(i.state IN ('pending', 'active'), j.cores_mcpu, 0)), 0)
                  AS free_cores_mcpu,
                  COALESCE(SUM(IF(i.state IN ('pending', 'active'), COALESCE(j.memory_bytes, 0), 0)), 0)
                  AS used_memory_bytes,
                  COALESCE(SUM(IF(i.state IN ('pending', 'active'), j.storage_bytes, 0)), 0) AS used_storage_bytes
           FROM instances i
           LEFT JOIN attempts a ON a.instance_name = i.name
           LEFT JOIN jobs j ON j.batch_id = a.batch_id AND j.job_id = a.job_id AND j.attempt_id = a.attempt_id
                           AND j.state IN ('Running', 'Creating')
           GROUP BY i.name, i.cores_mcpu""",
        ("name",), ("free_cores_mcpu", "used_memory_bytes", "used_storage_bytes"),
    )
    # An edge is released once its parent is final and the parent's queued
    # release (job_child_releases) has passed the child: until then it counts
    # in the child's n_pending_parents, and only a released edge can set
    # dependency_failed.
    problems += await _check(
        db, "jobs.n_pending_parents",
        "SELECT batch_id, job_id, n_pending_parents, dependency_failed FROM jobs",
        f"""SELECT j.batch_id, j.job_id,
                  COALESCE(SUM(e.parent_id IS NOT NULL AND NOT {_RELEASED}), 0) n_pending_parents,
                  COALESCE(MAX({_RELEASED} AND
                               (e.accepted_states & CASE p.state WHEN 'Success' THEN 1 WHEN 'Failed' THEN 2
                                                                 WHEN 'Error' THEN 4 ELSE 8 END) = 0), 0)
                    dependency_failed
           FROM jobs j
           LEFT JOIN job_parents e ON e.batch_id = j.batch_id AND e.job_id = j.job_id
           LEFT JOIN jobs p ON p.batch_id = e.batch_id AND p.job_id = e.parent_id
           LEFT JOIN job_child_releases r ON r.batch_id = e.batch_id AND r.parent_id = e.parent_id
           GROUP BY j.batch_id, j.job_id""",
        ("batch_id", "job_id"), ("n_pending_parents", "dependency_failed"),
    )
    # A queued release belongs to a final parent, records its state, and has
    # a child left at or after next_child_id (an empty one is deleted).
    problems += await _check(
        db, "job_child_releases",
        "SELECT batch_id, parent_id, 1 AS consistent FROM job_child_releases",
        """SELECT r.batch_id, r.parent_id,
                  (p.state = r.parent_state
                   AND EXISTS (SELECT 1 FROM job_parents e
                               WHERE e.batch_id = r.batch_id AND e.parent_id = r.parent_id
                                 AND e.job_id >= r.next_child_id)) AS consistent
           FROM job_child_releases r
           LEFT JOIN jobs p ON p.batch_id = r.batch_id AND p.job_id = r.parent_id""",
        ("batch_id", "parent_id"), ("consistent",),
    )
    return problems


async def _job_owners(db: Database) -> list[str]:
    """jobs.user: the owner of the job's batch (the scheduler's queue index, migration 0019)."""
    return await _check(
        db, "jobs.user",
        "SELECT batch_id, job_id, 1 AS consistent FROM jobs",
        "SELECT j.batch_id, j.job_id, j.user = b.user AS consistent FROM jobs j JOIN batches b ON b.batch_id = j.batch_id",
        ("batch_id", "job_id"), ("consistent",),
    )


async def _held_locks(db: Database) -> list[str]:
    """held_locks: per distinct lock, the Creating and Running jobs holding it."""
    return await _check(
        db, "held_locks",
        """SELECT billing_project, level, mode, lock_name, SUM(n_holders) AS n_holders FROM held_locks
           GROUP BY billing_project, level, mode, lock_name""",
        """SELECT b.billing_project, l.level, l.mode, l.lock_name, COUNT(*) AS n_holders
           FROM job_locks l
           JOIN jobs j ON j.batch_id = l.batch_id AND j.job_id = l.job_id AND j.state IN ('Creating', 'Running')
           JOIN batches b ON b.batch_id = l.batch_id
           GROUP BY b.billing_project, l.level, l.mode, l.lock_name""",
        ("billing_project", "level", "mode", "lock_name"), ("n_holders",),
    )


# usage of one attempt resource so far: quantity x elapsed rolled-up ms
_ATTEMPT_USAGE = """
  attempt_resources r
  JOIN attempts t ON t.batch_id = r.batch_id AND t.job_id = r.job_id AND t.attempt_id = r.attempt_id
  JOIN jobs j ON j.batch_id = t.batch_id AND j.job_id = t.job_id
  JOIN batches b ON b.batch_id = t.batch_id
"""
_USAGE = "SUM(r.quantity * IF(t.start_time_ms IS NULL OR t.rollup_time_ms IS NULL, 0, t.rollup_time_ms - t.start_time_ms))"


async def _billing(db: Database) -> list[str]:
    problems = await _check(
        db, "aggregated_job_resources",
        "SELECT batch_id, job_id, resource_id, `usage` FROM aggregated_job_resources",
        f"SELECT t.batch_id, t.job_id, r.resource_id, {_USAGE} `usage` FROM {_ATTEMPT_USAGE} "
        "GROUP BY t.batch_id, t.job_id, r.resource_id",
        ("batch_id", "job_id", "resource_id"), ("usage",),
    )
    problems += await _check(
        db, "aggregated_job_group_resources",
        "SELECT batch_id, job_group_id, resource_id, SUM(`usage`) `usage` FROM aggregated_job_group_resources "
        "GROUP BY batch_id, job_group_id, resource_id",
        f"""SELECT t.batch_id, a.ancestor_id AS job_group_id, r.resource_id, {_USAGE} `usage`
            FROM {_ATTEMPT_USAGE}
            JOIN job_group_self_and_ancestors a ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
            GROUP BY t.batch_id, a.ancestor_id, r.resource_id""",
        ("batch_id", "job_group_id", "resource_id"), ("usage",),
    )
    problems += await _check(
        db, "aggregated_billing_project_resources",
        "SELECT billing_project, resource_id, SUM(`usage`) `usage` FROM aggregated_billing_project_resources "
        "GROUP BY billing_project, resource_id",
        f"SELECT b.billing_project, r.resource_id, {_USAGE} `usage` FROM {_ATTEMPT_USAGE} "
        "GROUP BY b.billing_project, r.resource_id",
        ("billing_project", "resource_id"), ("usage",),
    )
    # Days split usage by when it was rolled up; their sum must be the total.
    problems += await _check(
        db, "aggregated_billing_project_user_resources_by_date",
        "SELECT billing_project, user, resource_id, SUM(`usage`) `usage` "
        "FROM aggregated_billing_project_user_resources_by_date GROUP BY billing_project, user, resource_id",
        f"SELECT b.billing_project, b.user, r.resource_id, {_USAGE} `usage` FROM {_ATTEMPT_USAGE} "
        "GROUP BY b.billing_project, b.user, r.resource_id",
        ("billing_project", "user", "resource_id"), ("usage",),
    )
    # Reservations (migration 0013): what open attempts reserved, per project. (Spend + reservations within
    # the limit is not an invariant: an administrator may lower a limit below them.)
    problems += await _check(
        db, "aggregated_billing_project_reservations",
        "SELECT billing_project, SUM(reserved_micro_usd) reserved_micro_usd "
        "FROM aggregated_billing_project_reservations GROUP BY billing_project",
        "SELECT b.billing_project, SUM(t.reserved_micro_usd) reserved_micro_usd FROM attempts t "
        "JOIN batches b ON b.batch_id = t.batch_id WHERE t.end_time_ms IS NULL GROUP BY b.billing_project",
        ("billing_project",), ("reserved_micro_usd",),
    )
    return problems


async def _batch_events(db: Database) -> list[str]:
    # Per batch, the published event ids are exactly 1..last_event_id: with
    # the primary key (batch_id, event_id) ruling out repeats, a count and a
    # maximum both equal to last_event_id (and a minimum of 1) leave no gap.
    return await _check(
        db, "batch_events",
        "SELECT batch_id, COUNT(*) n_events, MIN(event_id) min_event_id, MAX(event_id) max_event_id "
        "FROM batch_events GROUP BY batch_id",
        "SELECT batch_id, last_event_id n_events, 1 min_event_id, last_event_id max_event_id "
        "FROM batch_event_sequences WHERE last_event_id > 0",
        ("batch_id",), ("n_events", "min_event_id", "max_event_id"),
    )


CHECKS: tuple[Callable[[Database], Awaitable[list[str]]], ...] = (
    _completion_counters,
    _group_and_batch_counts,
    _resource_counters,
    _instances_and_parents,
    _held_locks,
    _billing,
    _batch_events,
    _job_owners,
)


async def check_invariants(db: Database) -> list[str]:
    """Every difference between maintained and recomputed numbers."""
    problems: list[str] = []
    for check in CHECKS:
        problems += await check(db)
    return problems
