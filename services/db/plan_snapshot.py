"""The planner's snapshot of a pool, read from the database: the one read the
scheduler (services.driver.scheduler) and ExplainJob (services.frontend.explain_store)
both make, so that both hand `services.policy.planner.plan` the same kind of facts.

Two steps, so that the scheduler reads the queues of every pool in one
call at the start of a cycle (`read_queues`), and each pool's locks
and budgets just before it plans that pool (`snapshot_of`), after the
previous pool's jobs started; `read_snapshot` does both for one pool.

Bounded: a user's queue is read only as deep as the planner looks
(`planner.depths`, which sums to at most `jobs_per_cycle` plus one per
user and pool), by the `read_ready_heads` procedure, which walks each
user's queue in an index (jobs_ready_queue, migration 0019) and stops
there, however many Ready jobs the user has; locks only for candidates
that declare some; budgets only for the candidates' projects. The running
jobs' locks are read from the held_locks summary (one row per distinct
lock and writer token, migration 0016), not job by job, and only those
that can matter to a candidate (`lock_contention.LockInterest`: in its
billing project, at its levels, and there only the names a candidate asks
for), so the planner decides exactly as if it had read every lock.
Quotas (migration 0031) only for the candidates' projects and users, and
what those with a cap run, across every pool, from the fair-share counters
of their running batches only (an index on batches, then the counters by
batch: the cost grows with their running batches, not their jobs or their
history).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from services.common.image_refs import parse_reference
from services.db.database import Database
from services.policy.fair_share import UserDemand
from services.policy.lock_contention import BIG_LOCK_LEVEL, LockInterest, Locks, locks_from_rows
from services.policy.planner import (
    Budget, Candidate, HeldLock, Holder, JobKey, Quota, QuotaKey, Snapshot, Usage, Worker, depths,
)
from services.policy.runnable import Deployment, InstanceCollection, PoolMachines

# What the view user_inst_coll_fair_share (migration 0003) says, read in three cheap statements rather than
# its one: the view ranks every running batch (a window) and joins every counter row to the ranks and to the
# cancelled groups, which cost twice the plain sum. Every pool at once: each sums every counter row before
# any filter on the pool could apply, so the demand is read once per cycle, not once per pool.
# 1. Every counter row summed per user and pool, no mask: ready demand counts only in running batches anyway
#    (a batch's jobs are Ready only once an update is committed, and none is when it completes).
_DEMAND_ALL = """
SELECT user, inst_coll,
       SUM(n_ready_always_run_jobs + n_ready_cancellable_jobs) AS n_ready_jobs,
       SUM(ready_always_run_cores_mcpu + ready_cancellable_cores_mcpu) AS ready_cores_mcpu,
       SUM(running_cores_mcpu) AS running_cores_mcpu
FROM user_inst_coll_resources_by_job_group
GROUP BY user, inst_coll
"""
# 2. Less the cancellable ready demand of every group of a running batch that is cancelled, itself or through
#    an ancestor (few rows: found from the cancellations, then the counters by their key).
CANCELLED_GROUPS = """(SELECT DISTINCT a.batch_id, a.job_group_id
      FROM job_groups_cancelled c
      JOIN batches b ON b.batch_id = c.batch_id AND b.state = 'running'
      JOIN job_group_self_and_ancestors a ON a.batch_id = c.batch_id AND a.ancestor_id = c.job_group_id)"""
"""A derived table of every (batch_id, job_group_id) of a running batch that is cancelled, itself or through
an ancestor: read from the cancellations, so a few rows per cancelled group."""
_DEMAND_CANCELLED = f"""
SELECT r.user, r.inst_coll, SUM(r.n_ready_cancellable_jobs) AS n_ready_jobs,
       SUM(r.ready_cancellable_cores_mcpu) AS ready_cores_mcpu
FROM {CANCELLED_GROUPS} g
STRAIGHT_JOIN user_inst_coll_resources_by_job_group r ON r.batch_id = g.batch_id AND r.job_group_id = g.job_group_id
GROUP BY r.user, r.inst_coll
"""
# 3. Less all the (masked) ready demand of every group of a running batch that is held, itself or through an
#    ancestor (migration 0029): a hold takes always-run jobs out too.
HELD_GROUPS = """(SELECT DISTINCT a.batch_id, a.job_group_id
      FROM job_groups_held h
      JOIN batches b ON b.batch_id = h.batch_id AND b.state = 'running'
      JOIN job_group_self_and_ancestors a ON a.batch_id = h.batch_id AND a.ancestor_id = h.job_group_id)"""
"""A derived table of every (batch_id, job_group_id) of a running batch that is held, itself or through an
ancestor."""
_DEMAND_HELD_GROUPS = f"""
SELECT r.user, r.inst_coll,
       SUM(r.n_ready_always_run_jobs + IF(c.batch_id IS NULL, r.n_ready_cancellable_jobs, 0)) AS n_ready_jobs,
       SUM(r.ready_always_run_cores_mcpu + IF(c.batch_id IS NULL, r.ready_cancellable_cores_mcpu, 0))
         AS ready_cores_mcpu
FROM {HELD_GROUPS} g
STRAIGHT_JOIN user_inst_coll_resources_by_job_group r ON r.batch_id = g.batch_id AND r.job_group_id = g.job_group_id
LEFT JOIN {CANCELLED_GROUPS} c ON c.batch_id = g.batch_id AND c.job_group_id = g.job_group_id
GROUP BY r.user, r.inst_coll
"""
# 4. Less, for a user with more than DEMAND_BATCHES running batches, the (masked) ready demand of those past
#    the first DEMAND_BATCHES (the cancellation RFC's bound) that step 3 did not take off: first who they are,
#    by an index.
DEMAND_BATCHES = 50
_DEEP_USERS = f"""
SELECT user FROM batches WHERE state = 'running' GROUP BY user HAVING COUNT(*) > {DEMAND_BATCHES}
"""
_DEMAND_BEYOND = f"""
SELECT r.user, r.inst_coll,
       SUM(r.n_ready_always_run_jobs + IF(g.batch_id IS NULL, r.n_ready_cancellable_jobs, 0)) AS n_ready_jobs,
       SUM(r.ready_always_run_cores_mcpu + IF(g.batch_id IS NULL, r.ready_cancellable_cores_mcpu, 0))
         AS ready_cores_mcpu
FROM (SELECT b.batch_id, ROW_NUMBER() OVER (PARTITION BY b.user ORDER BY b.batch_id) AS batch_rank
      FROM batches b WHERE b.state = 'running' AND b.user IN ({{users}})) rb
JOIN user_inst_coll_resources_by_job_group r ON r.batch_id = rb.batch_id
LEFT JOIN (SELECT DISTINCT batch_id, job_group_id FROM job_groups_cancelled_self_or_ancestor) g
  ON g.batch_id = r.batch_id AND g.job_group_id = r.job_group_id
LEFT JOIN (SELECT DISTINCT batch_id, job_group_id FROM job_groups_held_self_or_ancestor) h
  ON h.batch_id = r.batch_id AND h.job_group_id = r.job_group_id
WHERE rb.batch_rank > {DEMAND_BATCHES} AND h.batch_id IS NULL
GROUP BY r.user, r.inst_coll
"""
# 5. Less each job held one by one that the steps before counted: Ready, may run, its group not held, its
#    batch among its user's first DEMAND_BATCHES running ones (few rows: hold_jobs bounds them per batch).
_DEMAND_HELD_JOBS = f"""
SELECT j.user, j.inst_coll, COUNT(*) AS n_ready_jobs, SUM(j.cores_mcpu) AS ready_cores_mcpu
FROM jobs_held hj
STRAIGHT_JOIN jobs j ON j.batch_id = hj.batch_id AND j.job_id = hj.job_id AND j.state = 'Ready'
WHERE {{may_run}}
  AND NOT EXISTS (SELECT 1 FROM job_groups_held_self_or_ancestor y
                  WHERE y.batch_id = j.batch_id AND y.job_group_id = j.job_group_id)
  AND (SELECT COUNT(*) FROM batches b WHERE b.user = j.user AND b.state = 'running'
       AND b.batch_id <= j.batch_id) <= {DEMAND_BATCHES}
GROUP BY j.user, j.inst_coll
"""

# Active instances with their free cores, and the memory and storage their running jobs reserve (kept on the
# instance by schedule_jobs and complete_jobs_core, migration 0018); none of a paused pool (migration 0030),
# where nothing new starts.
_WORKERS = """
SELECT i.name, i.inst_coll, COALESCE(r.region_id, 0) AS region_id, i.free_cores_mcpu, i.memory_bytes,
       i.storage_bytes, i.preemptible, i.used_memory_bytes, i.used_storage_bytes
FROM instances i LEFT JOIN regions r ON r.name = i.region
JOIN instance_collections c ON c.name = i.inst_coll AND NOT c.paused
WHERE i.state = 'active' {pool}
ORDER BY i.name
"""

MAY_RUN = """(j.always_run OR (NOT j.dependency_failed AND NOT EXISTS (
         SELECT 1 FROM job_groups_cancelled_self_or_ancestor x
         WHERE x.batch_id = j.batch_id AND x.job_group_id = j.job_group_id)))"""
"""A Ready job `j` the scheduler may start: one the cancellers will not cancel (its group and batch are not
cancelled and no parent failed it), or one that always runs. The read_ready_heads procedure applies the same
rule to the queues' heads (tests/unit/test_runnable_rule.py holds every copy to one text)."""

_HELD = """
SELECT billing_project, level, mode, lock_name, SUM(n_holders) AS n_holders
FROM held_locks
WHERE billing_project IN ({projects}) {which}
GROUP BY billing_project, level, mode, lock_name
HAVING n_holders > 0
"""

_BUDGETS = """
SELECT p.name, p.state, p.limit_usd,
       (SELECT COALESCE(SUM(x.`usage` * xr.rate_usd), 0) FROM aggregated_billing_project_resources x
        JOIN resources xr ON xr.resource_id = x.resource_id WHERE x.billing_project = p.name) AS spend_usd,
       (SELECT COALESCE(SUM(v.reserved_micro_usd), 0) FROM aggregated_billing_project_reservations v
        WHERE v.billing_project = p.name) AS reserved_micro_usd
FROM billing_projects p WHERE p.name IN ({projects})
"""

_QUOTAS = """
SELECT kind, name, max_running_cores_mcpu, max_running_jobs, weight, set_by FROM quotas
WHERE (kind = 'project' AND name IN ({projects})) OR (kind = 'user' AND name IN ({users}))
"""

# What runs (Creating and Running jobs; the cores of Running ones, as the fair-share counters keep them: a job
# Creating its own machine has none of a pool's), across every pool, per project and per user with a capped
# quota: their running batches by an index, then those batches' counter rows by theirs.
_USAGE = """
SELECT b.{column} AS name, COALESCE(SUM(r.running_cores_mcpu), 0) AS cores_mcpu,
       COALESCE(SUM(r.n_running_jobs + r.n_creating_jobs), 0) AS n_jobs
FROM batches b FORCE INDEX ({index})
STRAIGHT_JOIN user_inst_coll_resources_by_job_group r FORCE INDEX (user_resources_batch) ON r.batch_id = b.batch_id
WHERE b.{column} IN ({{names}}) AND b.state = 'running'
GROUP BY b.{column}
"""
_USAGE_BY_KIND = {"project": _USAGE.format(column="billing_project", index="batches_billing_project_state"),
                  "user": _USAGE.format(column="user", index="batches_user_state")}
"""The usage read of a project's quota, and of a user's, each by its own index on batches."""


def _marks(n: int) -> str:
    return ", ".join(["%s"] * n)


async def read_demand(db: Database) -> dict[str, list[UserDemand]]:
    """Each pool's users that have ready work, with their running and ready cores: what the view
    user_inst_coll_fair_share says (tests/db/test_demand.py holds them to it), in cheaper statements."""

    async def read(cursor: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        # One snapshot for the statements, as the view's one statement had: a count that moves between
        # them (a canceller draining a cancelled group) must not be taken off a total that never held it.
        await cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        await cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        await cursor.execute(_DEMAND_ALL)
        everything = list(await cursor.fetchall())
        await cursor.execute(_DEMAND_CANCELLED)
        less = list(await cursor.fetchall())
        await cursor.execute(_DEMAND_HELD_GROUPS)
        less += list(await cursor.fetchall())
        await cursor.execute(_DEMAND_HELD_JOBS.format(may_run=MAY_RUN))
        less += list(await cursor.fetchall())
        await cursor.execute(_DEEP_USERS)
        deep = [r["user"] for r in await cursor.fetchall()]
        if deep:
            await cursor.execute(_DEMAND_BEYOND.format(users=_marks(len(deep))), tuple(deep))
            less += list(await cursor.fetchall())
        # Not in a `finally`: after a failure or a cancellation the connection is in no state for another
        # statement; `retrying` closes it instead, which ends the transaction.
        await cursor.execute("COMMIT")
        return everything, less

    everything, less = await db.retrying("scheduler_demand", read)
    totals = {(r["user"], r["inst_coll"]): [int(r["n_ready_jobs"]), int(r["ready_cores_mcpu"]),
                                            int(r["running_cores_mcpu"])] for r in everything}
    for r in less:
        total = totals.get((r["user"], r["inst_coll"]))
        if total is not None:
            total[0] -= int(r["n_ready_jobs"])
            total[1] -= int(r["ready_cores_mcpu"])
    by_pool: dict[str, list[UserDemand]] = {}
    for (user, pool), (n_ready, ready_mcpu, running_mcpu) in sorted(totals.items()):
        if ready_mcpu > 0 or n_ready > 0:
            by_pool.setdefault(pool, []).append(UserDemand(user, running_mcpu, ready_mcpu))
    return by_pool


async def read_workers(db: Database, pool: str | None = None) -> dict[str, list[Worker]]:
    """Active instances with free cores, by pool (one pool if given). An instance that did not say how much
    memory, or storage, it has (0) is not checked for it."""
    sql = _WORKERS.format(pool="AND i.inst_coll = %s" if pool is not None else "")
    by_pool: dict[str, list[Worker]] = {}
    for r in await db.fetchall(sql, (pool,) if pool is not None else None, name="scheduler_instances"):
        by_pool.setdefault(r["inst_coll"], []).append(Worker(
            r["name"], int(r["region_id"]), int(r["free_cores_mcpu"]),
            _free(r["memory_bytes"], r["used_memory_bytes"]), bool(r["preemptible"]),
            _free(r["storage_bytes"], r["used_storage_bytes"])))
    return by_pool


def _free(total: Any, used: Any) -> int | None:
    """What is left of `total` bytes once `used` are reserved; None if `total` is not known (0)."""
    total = int(total or 0)
    return max(0, total - int(used)) if total > 0 else None


async def read_deployment(db: Database) -> Deployment:
    """The deployment's instance collections (pools and the job-private one), as operators configured them:
    which collections can ever run a job, and which pool's machine holds it (`services.policy.runnable`).
    The frontend reads it at every submission and ExplainJob; a tiny table."""
    rows = await db.fetchall(
        "SELECT name, is_pool, provider, worker_cores, worker_memory_bytes, worker_storage_bytes, max_instances, "
        "enabled, worker_type, preemptible, paused, paused_by, time_paused_ms FROM instance_collections ORDER BY name",
        name="deployment_collections")
    return Deployment(tuple(InstanceCollection(
        r["name"], bool(r["is_pool"]), r["provider"], int(r["worker_cores"] or 0) * 1000,
        int(r["worker_memory_bytes"] or 0), int(r["worker_storage_bytes"] or 0), int(r["max_instances"]),
        bool(r["enabled"]), r["worker_type"] or "", bool(r["preemptible"]),
        (r["paused_by"] or "?") if r["paused"] else None, r["time_paused_ms"] if r["paused"] else None)
        for r in rows))


async def read_pool_machines(db: Database, collection: InstanceCollection) -> PoolMachines:
    """The pool's machines now: how many are starting and active (what a job finding no room waits for)."""
    row = await db.fetchone(
        "SELECT COALESCE(SUM(state = 'pending'), 0) AS n_starting, COALESCE(SUM(state = 'active'), 0) AS n_active "
        "FROM instances WHERE inst_coll = %s AND state IN ('pending', 'active')", (collection.name,),
        name="explain_pool_machines")
    return PoolMachines(int(row["n_starting"]) if row else 0, int(row["n_active"]) if row else 0,
                        collection.max_instances if collection.enabled else 0)


async def read_snapshot(db: Database, pool: str, workers: Sequence[Worker], demands: Sequence[UserDemand],
                        jobs_per_cycle: int, now_s: float) -> Snapshot:
    """One pool's snapshot (`read_queues` for that pool, then `snapshot_of`)."""
    queues = await read_queues(db, {pool: depths(workers, demands, jobs_per_cycle)})
    return await snapshot_of(db, pool, workers, demands, queues[pool], jobs_per_cycle, now_s)


async def read_queues(db: Database, looks: Mapping[str, Mapping[str, int]]
                      ) -> dict[str, dict[str, list[Candidate]]]:
    """Per pool, each user's queue as deep as the planner looks there (`looks[pool][user]`, from
    `planner.depths`), with the candidates' locks and worst-case costs (what schedule_jobs would reserve,
    priced by the database: job_worst_case_micro_usd): one call for every pool (`read_ready_heads`)."""
    queues: dict[str, dict[str, list[Candidate]]] = {
        pool: {user: [] for user in users} for pool, users in looks.items()}
    heads = [[pool, user, depth] for pool in sorted(looks) for user, depth in sorted(looks[pool].items()) if depth > 0]
    if not heads:
        return queues
    _, (rows,) = await db.call("read_ready_heads", heads)
    for r in rows:
        key = (r["batch_id"], r["job_id"])
        queues[r["inst_coll"]][r["user"]].append(Candidate(
            key, r["user"], r["billing_project"], int(r["cores_mcpu"]),
            int(r["memory_bytes"] or 0), int(r["regions_bits"]) if r["regions_bits"] is not None else None,
            int(r["priority"]), int(r["time_created_ms"]) / 1000,
            locks_from_rows(json.loads(r["locks"])) if r["locks"] is not None else {},
            reserve_micro_usd=int(r["reserve_micro_usd"]),
            on_demand=bool(r["on_demand"]), avoid_worker=r["avoid_instance"],
            not_before_s=int(r["not_before_ms"]) / 1000 if r["not_before_ms"] is not None else None,
            storage_bytes=int(r["storage_bytes"] or 0), image_names=image_names(r["image"])))
    return queues


def image_names(image: str | None) -> frozenset[str]:
    """The names a job's image may go by in a worker's cache report: as its spec writes it and, when it
    parses, normalised (`docker.io/library/busybox:latest` for `busybox`)."""
    if not image:
        return frozenset()
    try:
        return frozenset({image, str(parse_reference(image))})
    except ValueError:
        return frozenset({image})


async def snapshot_of(db: Database, pool: str, workers: Sequence[Worker], demands: Sequence[UserDemand],
                      queues: Mapping[str, Sequence[Candidate]], jobs_per_cycle: int, now_s: float) -> Snapshot:
    """The pool's snapshot from its queues (`read_queues`): the locks the candidates' projects' running jobs
    hold that can matter to them, and the projects' budgets, read now."""
    candidates = [c for queue in queues.values() for c in queue]
    held: dict[str, dict[Holder, Locks]] = {}
    wanting = [c for c in candidates if c.locks]
    if wanting:
        held = await read_held(db, {c.billing_project for c in wanting}, [c.locks for c in wanting])
    budgets: dict[str, Budget] = {}
    projects = sorted({c.billing_project for c in candidates})
    if projects:
        for r in await db.fetchall(_BUDGETS.format(projects=_marks(len(projects))), tuple(projects),
                                   name="scheduler_budgets"):
            limit = float(r["limit_usd"]) if r["limit_usd"] is not None else None
            budgets[r["name"]] = Budget(r["state"], limit, float(r["spend_usd"]), int(r["reserved_micro_usd"]))
    quotas, usage = await read_quotas(db, projects, sorted({c.user for c in candidates}))
    return Snapshot(pool, tuple(workers), tuple(demands), {u: list(q) for u, q in queues.items()}, held, budgets,
                    jobs_per_cycle, now_s, quotas=quotas, usage=usage)


async def read_quotas(db: Database, projects: Sequence[str], users: Sequence[str]
                      ) -> tuple[dict[QuotaKey, Quota], dict[QuotaKey, Usage]]:
    """The quotas of these projects and users, and what those with a cap run now across every pool."""
    if not projects and not users:
        return {}, {}
    rows = await db.fetchall(_QUOTAS.format(projects=_marks(len(projects)) if projects else "NULL",
                                            users=_marks(len(users)) if users else "NULL"),
                             (*projects, *users), name="scheduler_quotas")
    quotas: dict[QuotaKey, Quota] = {}
    for r in rows:
        quotas[(r["kind"], r["name"])] = Quota(
            int(r["max_running_cores_mcpu"]) if r["max_running_cores_mcpu"] is not None else None,
            int(r["max_running_jobs"]) if r["max_running_jobs"] is not None else None, int(r["weight"]), r["set_by"])
    usage: dict[QuotaKey, Usage] = {}
    for kind, sql in _USAGE_BY_KIND.items():
        capped = sorted(name for (k, name), q in quotas.items()
                        if k == kind and (q.max_running_cores_mcpu is not None or q.max_running_jobs is not None))
        if capped:
            for r in await db.fetchall(sql.format(names=_marks(len(capped))), tuple(capped),
                                       name=f"scheduler_{kind}_usage"):
                usage[(kind, r["name"])] = Usage(int(r["cores_mcpu"]), int(r["n_jobs"]))
    return quotas, usage


async def locks_of(db: Database, keys: list[JobKey]) -> dict[JobKey, Locks]:
    """The locks of each of these jobs that declares some, by level."""
    rows = await db.fetchall(
        f"SELECT batch_id, job_id, level, mode, lock_name FROM job_locks WHERE (batch_id, job_id) IN "
        f"({', '.join(['(%s, %s)'] * len(keys))})", tuple(v for key in keys for v in key), name="candidate_locks")
    entries: dict[JobKey, list[tuple[str, str, str]]] = {}
    for r in rows:
        entries.setdefault((r["batch_id"], r["job_id"]), []).append((r["level"], r["mode"], r["lock_name"]))
    return {key: locks_from_rows(e) for key, e in entries.items()}


async def read_held(db: Database, projects: set[str], wanted: Iterable[Locks]) -> dict[str, dict[Holder, Locks]]:
    """The locks running jobs of `projects` hold that matter to jobs wanting `wanted` (`LockInterest`), one
    `HeldLock` per distinct lock."""
    ordered = sorted(projects)
    interest = LockInterest.of(wanted)
    which, params = "", []
    if not interest.everything:
        clauses, params = ["level = %s"], [BIG_LOCK_LEVEL]
        if interest.whole_levels:
            clauses.append(f"level IN ({_marks(len(interest.whole_levels))})")
            params += sorted(interest.whole_levels)
        for level, names in sorted(interest.names.items()):
            clauses.append(f"(level = %s AND lock_name IN ({_marks(len(names) + 1)}))")
            params += [level, "", *sorted(names)]
        which = f"AND ({' OR '.join(clauses)})"
    rows = await db.fetchall(_HELD.format(projects=_marks(len(ordered)), which=which), (*ordered, *params),
                             name="held_locks")
    held: dict[str, dict[Holder, Locks]] = {}
    for r in rows:
        holder = HeldLock(r["level"], r["mode"], r["lock_name"], int(r["n_holders"]))
        held.setdefault(r["billing_project"], {})[holder] = locks_from_rows([(r["level"], r["mode"], r["lock_name"])])
    return held
