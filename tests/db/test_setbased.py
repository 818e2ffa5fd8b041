"""The hot procedures count, log and bill their own changes, set-based.

schedule_jobs, complete_jobs_core (MJC, cancel_ready_jobs) and commit_update
write the live resource counters and job events of their state changes in
grouped statements, and heartbeat_rollup and MJC bill rollups in grouped
upserts, while the triggers skip those statements (@corral_bulk_job_changes,
@corral_bulk_usage). The triggers are the reference: replaying the same
changes on a twin batch with plain single-row UPDATEs, which the triggers
count, log and bill, must give the same counters, events and aggregates.
Paths that still rely on the triggers (deactivate_instance) are part of the
scenarios; the session variables must never outlive a call, an error
included; and MJCs and heartbeats of one instance must not deadlock (the
cycle docs/performance.md names).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import random
from typing import Any

import aiomysql
import pymysql
import pytest

from services.db.invariants import check_invariants
from tests.world import World, job_spec

MIN_MS = 60_000
# The first UTC midnight after FakeClock's start (2023-11-14T22:13:20Z).
MIDNIGHT_MS = 1_700_006_400_000


async def publish_all(world: World) -> None:
    while int((await world.store.publish_batch_events(world.epoch, 1000))["n_published"]) == 1000:
        pass


class Twin:
    """One batch of the scenario: ids, and how to name its rows independently of them."""

    def __init__(self, batch_id: int, start_job_id: int, start_group_id: int):
        self.batch_id = batch_id
        self.start_job_id = start_job_id
        self.start_group_id = start_group_id
        self.n_events_seen = 0

    def job(self, offset: int) -> int:
        return self.start_job_id + offset

    def group_name(self, job_group_id: int) -> str:
        return "root" if job_group_id == 0 else f"g{job_group_id - self.start_group_id}"


async def build(world: World, billing_project: str = "proj") -> Twin:
    """Groups g0 (under the root) and g1 (under g0), nine jobs in two pools:

    0 root         -> Success; its child 2 becomes Ready
    1 g0, highmem  -> Failed; children 3 (always_run) and 4 get dependency_failed
    2 g1           child of 0
    3 g1           child of 1, always_run: Ready with a failed dependency, runs
    4 g0           child of 1: drained by cancel_ready_jobs
    5 root, highmem: Creating on a booting instance, then Running, then Error
    6 root         Ready -> Cancelled without an attempt
    7 g1           child of 5, accepts Failed and Error
    8 root         Running, its instance deactivated (Running -> Ready), then again
    """
    created = await world.store.create_batch("alice", billing_project)
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, 9, 2)
    u, s, g = update["update_id"], int(update["start_job_id"]), int(update["start_job_group_id"])
    await world.store.insert_job_groups(batch_id, u, [{"job_group_id": g, "parent_id": 0},
                                                      {"job_group_id": g + 1, "parent_id": g}])
    await world.store.insert_jobs(batch_id, u, [
        job_spec(s, cores_mcpu=1000),
        job_spec(s + 1, job_group_id=g, inst_coll="highmem", cores_mcpu=2000),
        job_spec(s + 2, job_group_id=g + 1, cores_mcpu=500, parents=[{"job_id": s}]),
        job_spec(s + 3, job_group_id=g + 1, cores_mcpu=500, always_run=True, parents=[{"job_id": s + 1}]),
        job_spec(s + 4, job_group_id=g, cores_mcpu=250, parents=[{"job_id": s + 1}]),
        job_spec(s + 5, inst_coll="highmem", cores_mcpu=1000),
        job_spec(s + 6),
        job_spec(s + 7, job_group_id=g + 1, parents=[{"job_id": s + 5, "accepted_states": 2 | 4}]),
        job_spec(s + 8, cores_mcpu=750),
    ])
    await world.store.commit_update(batch_id, u)
    return Twin(batch_id, s, g)


async def job_events(world: World, twin: Twin) -> list[tuple[Any, ...]]:
    """The batch's published job state changes, named by job offset and group name."""
    rows = await world.db.fetchall(
        "SELECT * FROM batch_events WHERE batch_id = %s AND kind = 'job_state_changed' ORDER BY event_id",
        (twin.batch_id,))
    return [(r["job_id"] - twin.start_job_id, twin.group_name(r["job_group_id"]), r["attempt_id"],
             r["old_state"], r["new_state"], r["exit_code"]) for r in rows]


async def counters(world: World, twin: Twin) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """The batch's live resource counters (token rows summed), nonzero rows only."""
    rows = await world.db.fetchall(
        """SELECT user, inst_coll, job_group_id,
                  SUM(n_ready_cancellable_jobs) a, SUM(ready_cancellable_cores_mcpu) b,
                  SUM(n_ready_always_run_jobs) c, SUM(ready_always_run_cores_mcpu) d,
                  SUM(n_ready_dependency_failed_jobs) e, SUM(n_creating_jobs) f,
                  SUM(n_creating_cancellable_jobs) g, SUM(n_running_jobs) h, SUM(running_cores_mcpu) i,
                  SUM(n_running_cancellable_jobs) j
           FROM user_inst_coll_resources_by_job_group WHERE batch_id = %s
           GROUP BY user, inst_coll, job_group_id""", (twin.batch_id,))
    out = {}
    for r in rows:
        values = tuple(int(r[k]) for k in "abcdefghij")
        if any(values):
            out[(r["user"], r["inst_coll"], twin.group_name(r["job_group_id"]))] = values
    return out


async def replay(world: World, bulk: Twin, reference: Twin) -> None:
    """Apply the bulk batch's new job events to the reference batch, one
    plain UPDATE per change, so that the jobs trigger counts and logs them.
    (The completion counts and checks are the procedures' work, not the
    trigger's: done here as MJC does, to keep the reference consistent.)"""
    await publish_all(world)
    changes = (await job_events(world, bulk))[bulk.n_events_seen:]
    bulk.n_events_seen += len(changes)
    for offset, _, attempt_id, _, new_state, exit_code in changes:
        source = await world.job(bulk.batch_id, bulk.job(offset))
        job_id = reference.job(offset)
        await world.db.execute(
            """UPDATE jobs SET state = %s, attempt_id = COALESCE(%s, attempt_id), exit_code = %s,
                               dependency_failed = %s, n_pending_parents = %s
               WHERE batch_id = %s AND job_id = %s""",
            (new_state, attempt_id, exit_code, source["dependency_failed"], source["n_pending_parents"],
             reference.batch_id, job_id))
        if new_state in ("Success", "Failed", "Error", "Cancelled"):
            await world.db.execute(
                """INSERT INTO job_groups_n_jobs_in_complete_states
                       (batch_id, job_group_id, token, n_completed, n_succeeded, n_failed, n_errored, n_cancelled)
                     SELECT a.batch_id, a.ancestor_id, 0, 1, %s = 'Success', %s = 'Failed', %s = 'Error',
                            %s = 'Cancelled'
                     FROM jobs j JOIN job_group_self_and_ancestors a
                       ON a.batch_id = j.batch_id AND a.job_group_id = j.job_group_id
                     WHERE j.batch_id = %s AND j.job_id = %s
                   ON DUPLICATE KEY UPDATE n_completed = n_completed + 1,
                     n_succeeded = n_succeeded + VALUES(n_succeeded), n_failed = n_failed + VALUES(n_failed),
                     n_errored = n_errored + VALUES(n_errored), n_cancelled = n_cancelled + VALUES(n_cancelled)""",
                (new_state, new_state, new_state, new_state, reference.batch_id, job_id))
    await world.store.recheck_completions(world.epoch, 100)
    await publish_all(world)


async def assert_twins_agree(world: World, bulk: Twin, reference: Twin) -> None:
    await replay(world, bulk, reference)
    assert await job_events(world, bulk) == await job_events(world, reference)
    assert await counters(world, bulk) == await counters(world, reference)
    assert await check_invariants(world.db) == []


async def test_schedule_takes_ready_jobs_in_key_order_while_their_cores_fit(world: World) -> None:
    """SJ against a model of its fit: the Ready jobs asked for, in key order, each scheduled if its cores
    fit in what the ones before it left on its own instance, else no_capacity (a later, smaller job may
    still fit). One call places jobs on one to three instances, as the driver's one call per pool does. A
    call whose every instance's jobs fit on it is decided in one statement, one that does not job by job:
    both must agree with the model. Each round asks new instances for a new batch's jobs and, sometimes,
    for the previous batch's: those are Ready again if they did not fit, else not_ready."""
    rng = random.Random(15)
    rounds = {"together": 0, "one by one": 0}
    previous: list[tuple[tuple[int, int], int]] = []
    scheduled: set[tuple[int, int]] = set()
    for n in range(40):
        free = {f"fit{n}-{k}": rng.choice([250, 1000, 3000, 8000, 40000]) for k in range(rng.randint(1, 3))}
        for name, cores in free.items():
            await world.instance(name, cores_mcpu=cores)
        sizes = [rng.choice([0, 250, 500, 1000, 2000, 4000]) for _ in range(rng.randint(1, 10))]
        batch_id, _, s = await world.batch([{"cores_mcpu": size} for size in sizes])
        asked = [((batch_id, s + i), size) for i, size in enumerate(sizes)]
        if previous and rng.random() < 0.5:
            asked += rng.sample(previous, rng.randint(1, len(previous)))
        on = {key: rng.choice(sorted(free)) for key, _ in asked}
        used, expected = dict.fromkeys(free, 0), {}
        for key, size in sorted(asked):
            if key in scheduled:
                expected[key] = "not_ready"
            elif used[on[key]] + size <= free[on[key]]:
                used[on[key]], expected[key] = used[on[key]] + size, "scheduled"
            else:
                expected[key] = "no_capacity"
        rounds["together" if all(sum(size for key, size in asked if key not in scheduled and on[key] == name)
                                     <= free[name] for name in free)
               else "one by one"] += 1
        rows = await world.store.schedule_jobs(world.epoch, None, [
            {"batch_id": b, "job_id": j, "attempt_id": f"f{n}-{j}", "instance_name": on[(b, j)]}
            for (b, j), _ in asked])
        assert {(row["batch_id"], row["job_id"]): row["outcome"] for row in rows} == expected
        assert {(row["batch_id"], row["job_id"]): row["instance_name"] for row in rows} == on
        for name in free:
            left = await world.db.fetchone("SELECT free_cores_mcpu FROM instances WHERE name = %s", (name,))
            assert left["free_cores_mcpu"] == free[name] - used[name]
        attempts = await world.db.fetchall(
            "SELECT batch_id, job_id, instance_name FROM attempts WHERE attempt_id LIKE %s", (f"f{n}-%",))
        assert {(a["batch_id"], a["job_id"]): a["instance_name"] for a in attempts} == {
            key: on[key] for key, outcome in expected.items() if outcome == "scheduled"}
        scheduled |= {key for key, outcome in expected.items() if outcome == "scheduled"}
        previous = asked
    assert min(rounds.values()) >= 5, rounds
    assert await check_invariants(world.db) == []


async def test_bulk_counters_and_events_equal_the_triggers(world: World) -> None:
    await world.instance("i1")
    await world.instance("i2")
    await world.store.create_instance(world.epoch, "boot", "highmem", 100_000, "tok-boot")  # pending
    bulk, reference = await build(world), await build(world)
    b = bulk.batch_id

    def attempt(offset: int, name: str) -> dict[str, Any]:
        return {"batch_id": b, "job_id": bulk.job(offset), "attempt_id": name}

    def done(offset: int, name: str | None, state: str, exit_code: int | None) -> dict[str, Any]:
        return {"batch_id": b, "job_id": bulk.job(offset), "attempt_id": name, "state": state,
                "exit_code": exit_code, "start_time_ms": world.clock(), "end_time_ms": world.clock()}

    assert await counters(world, bulk) == await counters(world, reference)
    outcomes = await world.store.schedule_jobs(world.epoch, "i1", [attempt(0, "a0"), attempt(1, "a1")])
    assert [o["outcome"] for o in outcomes] == ["scheduled", "scheduled"]
    await world.store.schedule_jobs(world.epoch, "i2", [attempt(8, "a8")])
    outcomes = await world.store.schedule_jobs(world.epoch, "boot", [attempt(5, "a5")])
    assert [o["outcome"] for o in outcomes] == ["creating"]
    await assert_twins_agree(world, bulk, reference)

    await world.store.activate_instance(world.epoch, "boot", "tok-boot")
    await world.store.schedule_jobs(world.epoch, "boot", [attempt(5, "a5")])  # Creating -> Running
    await world.store.deactivate_instance(world.epoch, "i2", "missed heartbeats")  # the trigger's path
    await world.store.schedule_jobs(world.epoch, "i1", [attempt(8, "a8-2")])
    await assert_twins_agree(world, bulk, reference)

    world.clock.advance(1000)
    outcomes = await world.store.mark_jobs_complete(world.epoch, "i1", [
        done(0, "a0", "Success", 0), done(1, "a1", "Failed", 2), done(8, "a8-2", "Success", 0)])
    assert {o["outcome"] for o in outcomes} == {"completed"}
    await world.store.mark_jobs_complete(world.epoch, "boot", [done(5, "a5", "Error", 137)])
    await world.store.mark_jobs_complete(world.epoch, None, [done(6, None, "Cancelled", None)])
    await assert_twins_agree(world, bulk, reference)
    ready = {o: (await world.job(b, bulk.job(o)))["state"] for o in (2, 3, 4, 7)}
    assert ready == {2: "Ready", 3: "Ready", 4: "Ready", 7: "Ready"}

    assert await world.store.cancel_ready_jobs(world.epoch, b, 300) == 1  # job 4: its parent failed
    await assert_twins_agree(world, bulk, reference)

    await world.store.schedule_jobs(world.epoch, "i1", [attempt(o, f"a{o}") for o in (2, 3, 7)])
    await assert_twins_agree(world, bulk, reference)
    outcomes = await world.store.mark_jobs_complete(world.epoch, "i1", [
        done(2, "a2", "Success", 0), done(3, "a3", "Failed", 1), done(7, "a7", "Success", 0)])
    assert {o["outcome"] for o in outcomes} == {"completed"}
    # A repeat changes nothing: no event, no count.
    assert {o["outcome"] for o in await world.store.mark_jobs_complete(
        world.epoch, "i1", [done(2, "a2", "Success", 0)])} == {"already_complete"}
    await assert_twins_agree(world, bulk, reference)

    assert [(e[3], e[4]) for e in await job_events(world, bulk) if e[0] == 8] == [
        ("Ready", "Running"), ("Running", "Ready"), ("Ready", "Running"), ("Running", "Success")]
    assert (await world.batch_row(b))["state"] == "complete"


async def test_commit_counts_its_ready_jobs_in_one_grouped_upsert(world: World) -> None:
    """commit_update adds the counters of its Pending -> Ready flips itself
    (and writes one update_committed event, no job event): cancellable,
    always-run and dependency-failed demand, per pool and group."""
    await world.instance("i1")
    batch_id, _, s = await world.batch([{}])
    await world.run(batch_id, s)
    assert await world.finish(batch_id, s, (await world.job(batch_id, s))["attempt_id"], "Failed") == "completed"
    update = await world.store.create_update(batch_id, 5, 1)
    u, t, g = update["update_id"], int(update["start_job_id"]), int(update["start_job_group_id"])
    await world.store.insert_job_groups(batch_id, u, [{"job_group_id": g, "parent_id": 0}])
    await world.store.insert_jobs(batch_id, u, [
        job_spec(t, cores_mcpu=100),
        job_spec(t + 1, cores_mcpu=200, job_group_id=g, inst_coll="highmem"),
        job_spec(t + 2, cores_mcpu=400, always_run=True, parents=[{"job_id": s}]),  # its parent failed
        job_spec(t + 3, cores_mcpu=800, parents=[{"job_id": s}]),  # dependency failed
        job_spec(t + 4, cores_mcpu=1600, parents=[{"in_update_offset": -4}]),  # stays Pending
    ])
    await publish_all(world)
    before = await world.db.fetchone("SELECT COUNT(*) AS n FROM batch_events WHERE batch_id = %s", (batch_id,))
    await world.store.commit_update(batch_id, u)
    twin = Twin(batch_id, t, g)
    assert await counters(world, twin) == {
        # ready cancellable (jobs, mcpu), always-run (jobs, mcpu), dependency failed, creating, running
        ("alice", "standard", "root"): (1, 100, 1, 400, 1, 0, 0, 0, 0, 0),
        ("alice", "highmem", "g0"): (1, 200, 0, 0, 0, 0, 0, 0, 0, 0),
    }
    await publish_all(world)
    after = await world.db.fetchall("SELECT kind FROM batch_events WHERE batch_id = %s AND event_id > %s",
                                    (batch_id, before["n"]))
    assert [e["kind"] for e in after] == ["update_committed"]
    assert await world.state(batch_id, t + 4) == "Pending"
    assert await check_invariants(world.db) == []


# -- billing -------------------------------------------------------------


async def aggregates(world: World, twin: Twin, billing_project: str) -> dict[str, dict[tuple[Any, ...], int]]:
    """Every billing aggregate of the batch (token rows summed), named independently of ids."""
    names = {r["resource_id"]: r["name"] for r in await world.db.fetchall("SELECT resource_id, name FROM resources")}
    by_job = await world.db.fetchall(
        "SELECT job_id, resource_id, `usage` FROM aggregated_job_resources WHERE batch_id = %s", (twin.batch_id,))
    by_group = await world.db.fetchall(
        """SELECT job_group_id, resource_id, SUM(`usage`) AS `usage` FROM aggregated_job_group_resources
           WHERE batch_id = %s GROUP BY job_group_id, resource_id""", (twin.batch_id,))
    by_project = await world.db.fetchall(
        """SELECT resource_id, SUM(`usage`) AS `usage` FROM aggregated_billing_project_resources
           WHERE billing_project = %s GROUP BY resource_id""", (billing_project,))
    by_day = await world.db.fetchall(
        """SELECT billing_date, user, resource_id, SUM(`usage`) AS `usage`
           FROM aggregated_billing_project_user_resources_by_date
           WHERE billing_project = %s GROUP BY billing_date, user, resource_id""", (billing_project,))
    return {
        "job": {(r["job_id"] - twin.start_job_id, names[r["resource_id"]]): int(r["usage"]) for r in by_job},
        "group": {(twin.group_name(r["job_group_id"]), names[r["resource_id"]]): int(r["usage"]) for r in by_group},
        "project": {(names[r["resource_id"]],): int(r["usage"]) for r in by_project},
        "day": {(r["billing_date"], r["user"], names[r["resource_id"]]): int(r["usage"]) for r in by_day},
    }


async def attempt_times(world: World, twin: Twin) -> dict[tuple[int, str], dict[str, Any]]:
    rows = await world.db.fetchall(
        "SELECT job_id, attempt_id, start_time_ms, rollup_time_ms, end_time_ms FROM attempts WHERE batch_id = %s",
        (twin.batch_id,))
    return {(r["job_id"] - twin.start_job_id, r["attempt_id"]): r for r in rows}


async def replay_rollups(world: World, bulk: Twin, reference: Twin) -> None:
    """Give each reference attempt the bulk attempt's rollup and end, one
    plain UPDATE per attempt, so that the attempts trigger bills them."""
    mirrored = await attempt_times(world, reference)
    for key, row in sorted((await attempt_times(world, bulk)).items()):
        mine = mirrored[key]
        if (mine["rollup_time_ms"], mine["end_time_ms"]) != (row["rollup_time_ms"], row["end_time_ms"]):
            await world.db.execute(
                """UPDATE attempts SET rollup_time_ms = %s, end_time_ms = %s
                   WHERE batch_id = %s AND job_id = %s AND attempt_id = %s""",
                (row["rollup_time_ms"], row["end_time_ms"], reference.batch_id, reference.job(key[0]), key[1]))


async def test_bulk_billing_equals_the_triggers(world: World) -> None:
    """heartbeat_rollup and MJC bill rollups set-based; the attempts trigger,
    fed the same rollups one row at a time, must bill the same usage to the
    job, every ancestor group, the project and the project/user/UTC day."""
    await world.store.create_billing_project("proj-ref", ["alice"])
    await world.instance("i1")
    await world.instance("i2")
    world.clock.now_ms = MIDNIGHT_MS - 30 * MIN_MS
    bulk, reference = await build(world, "proj"), await build(world, "proj-ref")
    running = (0, 1, 5, 8)  # on i1, except 8 on i2

    for twin in (bulk, reference):
        for offset in running:
            key = {"batch_id": twin.batch_id, "job_id": twin.job(offset), "attempt_id": f"a{offset}"}
            instance = "i2" if offset == 8 else "i1"
            await world.store.schedule_jobs(world.epoch, instance, [key])
            await world.store.mark_jobs_started(world.epoch, instance, [{**key, "start_time_ms": world.clock()}])
            await world.store.add_attempt_resources(world.epoch, [
                {**key, "resource": "cpu/local/1", "quantity": 1000 * (offset + 1)},
                {**key, "resource": "memory/local/1", "quantity": 512}])

    def rollups(offsets: tuple[int, ...], at_ms: int) -> list[dict[str, Any]]:
        return [{"batch_id": bulk.batch_id, "job_id": bulk.job(o), "attempt_id": f"a{o}", "rollup_time_ms": at_ms}
                for o in offsets]

    async def agree() -> None:
        await replay_rollups(world, bulk, reference)
        assert await aggregates(world, bulk, "proj") == await aggregates(world, reference, "proj-ref")
        assert await check_invariants(world.db) == []

    world.clock.advance(10 * MIN_MS)
    status = await world.store.heartbeat_rollup(world.epoch, "i1", rollups((0, 1, 5), world.clock()))
    assert status["n_rolled_up"] == 3
    await agree()
    # Across midnight: the whole advance lands on the new day. An attempt
    # listed twice advances to the later time; one of another instance
    # (8 runs on i2) is not touched.
    world.clock.advance(30 * MIN_MS)
    status = await world.store.heartbeat_rollup(
        world.epoch, "i1", rollups((0, 1), world.clock() - MIN_MS) + rollups((0, 5, 8), world.clock()))
    assert status["n_rolled_up"] == 3
    await agree()
    # Late, repeated and backwards heartbeats bill nothing.
    late = rollups((0, 5), world.clock()) + rollups((1,), world.clock() - 2 * MIN_MS)
    assert (await world.store.heartbeat_rollup(world.epoch, "i1", late))["n_rolled_up"] == 0
    # MJC closes the attempts: 0 at a later end, 1 at an end before the last
    # rollup (billing never goes back), 8 by deactivating i2 (the trigger's path).
    world.clock.advance(5 * MIN_MS)
    await world.store.mark_jobs_complete(world.epoch, "i1", [
        {"batch_id": bulk.batch_id, "job_id": bulk.job(0), "attempt_id": "a0", "state": "Success",
         "exit_code": 0, "end_time_ms": world.clock()},
        {"batch_id": bulk.batch_id, "job_id": bulk.job(1), "attempt_id": "a1", "state": "Failed",
         "exit_code": 1, "end_time_ms": world.clock() - 20 * MIN_MS}])
    await world.store.deactivate_instance(world.epoch, "i2", "gone")
    await agree()
    world.clock.advance(5 * MIN_MS)
    await world.store.mark_jobs_complete(world.epoch, "i1", [
        {"batch_id": bulk.batch_id, "job_id": bulk.job(5), "attempt_id": "a5", "state": "Error",
         "exit_code": 1, "end_time_ms": world.clock()},
        {"batch_id": bulk.batch_id, "job_id": bulk.job(0), "attempt_id": "a0", "state": "Success",
         "exit_code": 0, "end_time_ms": world.clock()}])  # a repeat
    await agree()

    billed = await aggregates(world, bulk, "proj")
    assert {day for day, _, _ in billed["day"]} == {datetime.date(2023, 11, 14), datetime.date(2023, 11, 15)}
    assert set(billed["group"]) >= {("root", "cpu/local/1"), ("g0", "cpu/local/1")}
    assert all(usage > 0 for usage in billed["job"].values())


# -- the session variables --------------------------------------------------


async def session_variables(cursor: aiomysql.Cursor) -> tuple[Any, Any]:
    await cursor.execute("SELECT @corral_bulk_job_changes AS jobs, @corral_bulk_usage AS attempts_usage")
    row = await cursor.fetchone()
    return row["jobs"], row["attempts_usage"]


async def call(cursor: aiomysql.Cursor, procedure: str, *args: Any) -> None:
    await cursor.execute(f"CALL {procedure}({', '.join(['%s'] * len(args))})", args)
    while await cursor.nextset():
        pass


async def pooled_session_variables(world: World) -> set[tuple[Any, Any]]:
    """The variables on every connection of the pool (all held at once, so
    each free connection is among them)."""
    n = world.db.config.pool_size
    barrier = asyncio.Barrier(n)

    async def read(cursor: aiomysql.Cursor) -> tuple[Any, Any]:
        values = await session_variables(cursor)
        await barrier.wait()
        return values

    return set(await asyncio.gather(*(world.db.retrying("session_variables", read) for _ in range(n))))


async def test_the_session_variables_never_outlive_a_call(world: World) -> None:
    """Left set on a connection, they would make the triggers skip the next
    statements run there (deactivate_instance's, say)."""
    await world.instance("i1")
    batch_id, _, s = await world.batch([{}, {"parents": [{"in_update_offset": -1}]}, {}])
    attempts = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"a{j}"} for j in (s, s + 2)]
    conn = await aiomysql.connect(**world.db.config.connect_kwargs())
    try:
        async with conn.cursor(aiomysql.DictCursor) as cursor:
            await call(cursor, "schedule_jobs", world.epoch, "i1", json.dumps(attempts), world.clock())
            assert await session_variables(cursor) == (None, None)
            await call(cursor, "mark_jobs_started", world.epoch, "i1",
                       json.dumps([{**a, "start_time_ms": world.clock()} for a in attempts]), True)
            await call(cursor, "heartbeat_rollup", world.epoch, "i1",
                       json.dumps([{**a, "rollup_time_ms": world.clock() + 1000} for a in attempts]), world.clock())
            assert await session_variables(cursor) == (None, None)
            await call(cursor, "mark_jobs_complete", world.epoch, "i1",
                       json.dumps([{**attempts[1], "state": "Success", "exit_code": 0}]), world.clock(), 1000)
            assert await session_variables(cursor) == (None, None)
    finally:
        conn.close()

    # A call failing in the middle of the bulk work, through the pool as the
    # services call: the child's pending count is corrupted below what MJC
    # takes off it. complete_jobs_core refuses that itself: MariaDB 10.11 runs
    # no handler when the CHECK fails in a multi-table UPDATE, and the
    # transaction would stay open, half done, with the variable set.
    await world.db.execute("UPDATE jobs SET n_pending_parents = 0 WHERE batch_id = %s AND job_id = %s",
                           (batch_id, s + 1))
    with pytest.raises(pymysql.err.MySQLError):
        await world.store.mark_jobs_complete(world.epoch, "i1", [{**attempts[0], "state": "Success"}])
    assert await world.state(batch_id, s) == "Running"  # nothing was written
    assert await pooled_session_variables(world) == {(None, None)}
    await world.db.execute("UPDATE jobs SET n_pending_parents = 1 WHERE batch_id = %s AND job_id = %s",
                           (batch_id, s + 1))
    # The trigger counts on every pooled connection: deactivate_instance is its path.
    await world.store.deactivate_instance(world.epoch, "i1", "gone")
    assert await world.state(batch_id, s) == "Ready"
    assert await check_invariants(world.db) == []


# -- no deadlocks on one instance -----------------------------------------------

N_JOBS = 2000
N_CONNECTIONS = 32
PER_CALL = 10


@pytest.mark.parametrize("n_instances", [1, 8])
@pytest.mark.parametrize("lifecycle", ["sj+mjc", "full"])
async def test_concurrent_calls_do_not_deadlock(world: World, lifecycle: str, n_instances: int) -> None:
    """32 connections schedule and complete (and in `full`, also start, add
    resources to and roll up) their own jobs, ten per call, all on one
    instance, or each on one of eight. MJC used to give cores back with an UPDATE of instances joined
    with attempts, which share-locked attempts through attempts_instance
    while holding the instance row: two MJCs of one instance deadlocked
    (about 30 retries a run). A heartbeat reading the instance's open
    attempts through that index would lock every one of them, and deadlock
    with the MJCs closing some. SJ reading its instances in an UPDATE joined
    with them share-locked every instance row it read, and SJs and MJCs of
    different instances deadlocked (hundreds of retries a run)."""
    names = [await world.instance(f"i{n + 1}", cores_mcpu=100_000_000) for n in range(n_instances)]
    batch_id, _, s = await world.batch([{} for _ in range(N_JOBS)])
    chunks = [list(range(s + i, s + i + PER_CALL)) for i in range(0, N_JOBS, PER_CALL)]
    random.Random(5).shuffle(chunks)
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    epoch, store, now = world.epoch, world.store, world.clock()

    async def worker(instance: str) -> None:
        while not queue.empty():
            attempts = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"a{j}"} for j in queue.get_nowait()]
            assert {o["outcome"] for o in await store.schedule_jobs(epoch, instance, attempts)} == {"scheduled"}
            if lifecycle == "full":
                await store.mark_jobs_started(epoch, instance, [{**a, "start_time_ms": now} for a in attempts])
                await store.add_attempt_resources(epoch, [{**a, "resource": "cpu/local/1", "quantity": 1000}
                                                          for a in attempts])
                await store.heartbeat_rollup(epoch, instance, [{**a, "rollup_time_ms": now + 500}
                                                               for a in attempts])
            outcomes = await store.mark_jobs_complete(epoch, instance, [
                {**a, "state": "Success", "exit_code": 0, "start_time_ms": now, "end_time_ms": now + 1000}
                for a in attempts])
            assert {o["outcome"] for o in outcomes} <= {"completed", "already_complete"}

    await asyncio.gather(*(worker(names[n % n_instances]) for n in range(N_CONNECTIONS)))
    print(f"\nretries over {N_JOBS} jobs ({lifecycle}), {PER_CALL} per call, {N_CONNECTIONS} connections, "
          f"{n_instances} instances: {world.db.retry_stats.retries} {world.db.retry_stats.by_errno}")
    assert world.db.retry_stats.by_errno.get(1213, 0) == 0
    free = await world.db.fetchall("SELECT free_cores_mcpu FROM instances")
    assert [r["free_cores_mcpu"] for r in free] == [100_000_000] * n_instances
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_mjc_and_heartbeats_lock_only_their_own_attempts(world: World) -> None:
    """MJC and heartbeats take no lock on an instance's other attempts:
    while another transaction holds one, calls for the rest go through
    (a wait here is what the cycles above are made of)."""
    await world.instance("i1")
    # Many closed attempts and a few open ones: the shape in which the
    # optimizer prefers attempts_instance (instance_name, end_time_ms).
    done_id, _, d = await world.batch([{} for _ in range(300)])
    closed = [{"batch_id": done_id, "job_id": j, "attempt_id": f"c{j}"} for j in range(d, d + 300)]
    await world.store.schedule_jobs(world.epoch, "i1", closed)
    await world.store.mark_jobs_complete(world.epoch, "i1", [{**a, "state": "Success"} for a in closed])
    batch_id, _, s = await world.batch([{} for _ in range(4)])
    for j in range(s, s + 4):
        await world.run(batch_id, j)
    await world.db.execute("ANALYZE TABLE attempts")
    holder = await aiomysql.connect(**world.db.config.connect_kwargs())
    caller = await aiomysql.connect(**world.db.config.connect_kwargs())
    try:
        async with holder.cursor() as held, caller.cursor(aiomysql.DictCursor) as cursor:
            await held.execute("START TRANSACTION")
            await held.execute("SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s FOR UPDATE", (batch_id, s))
            await cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")
            others = [{"batch_id": batch_id, "job_id": j, "attempt_id": (await world.job(batch_id, j))["attempt_id"]}
                      for j in (s + 1, s + 2)]
            await call(cursor, "heartbeat_rollup", world.epoch, "i1",
                       json.dumps([{**a, "rollup_time_ms": world.clock() + 1000} for a in others]), world.clock())
            await call(cursor, "mark_jobs_complete", world.epoch, "i1",
                       json.dumps([{**a, "state": "Success", "exit_code": 0} for a in others]), world.clock(), 1000)
            await held.execute("ROLLBACK")
    finally:
        holder.close()
        caller.close()
    assert [await world.state(batch_id, j) for j in range(s, s + 4)] == ["Running", "Success", "Success", "Running"]
    assert await check_invariants(world.db) == []
