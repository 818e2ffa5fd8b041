"""Refused calls raise the right typed error and write nothing at all.

Each case snapshots the row count and checksum of every table, makes a call
the procedure must refuse, and checks the error class, its message and that
no table changed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiomysql
import pytest

from services.db.database import (
    ConflictError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProcedureError,
)
from tests.world import World, job_spec


async def snapshot(world: World) -> dict[str, Any]:
    """Row count and CHECKSUM TABLE of every base table."""
    tables = await world.db.fetchall(
        "SELECT table_name AS t FROM information_schema.tables "
        "WHERE table_schema = DATABASE() AND table_type = 'BASE TABLE' ORDER BY table_name")
    names = ", ".join(f"`{row['t']}`" for row in tables)
    rows = await world.db.fetchall(f"CHECKSUM TABLE {names}")
    return {row["Table"]: row["Checksum"] for row in rows}


async def prepared(world: World) -> dict[str, Any]:
    """A batch with one committed update (jobs 1-2) and an open one (jobs 3-4)."""
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    update = await world.store.create_update(batch_id, 2, n_job_groups=1)
    return {"batch": batch_id, "update": update["update_id"], "start": update["start_job_id"],
            "group": update["start_job_group_id"], "first": s}


Call = Callable[[World, dict[str, Any]], Awaitable[Any]]

CASES: list[tuple[str, Call, type[ProcedureError], str]] = [
    ("batch in unknown project",
     lambda w, c: w.store.create_batch("alice", "nope"), NotFoundError, "no billing project"),
    ("batch by a non-member",
     lambda w, c: w.store.create_batch("mallory", "proj"), PermissionDeniedError, "not a member"),
    ("cancel_after_n_failures of zero",
     lambda w, c: w.store.create_batch("alice", "proj", cancel_after_n_failures=0), InvalidArgumentError, "at least 1"),
    ("update of unknown batch",
     lambda w, c: w.store.create_update(999, 1), NotFoundError, "no batch"),
    ("update with negative size",
     lambda w, c: w.store.create_update(c["batch"], -1), InvalidArgumentError, "non-negative"),
    ("jobs outside the reserved block",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"] + 2)]),
     InvalidArgumentError, "block"),
    ("negative cores",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], cores_mcpu=-1)]),
     InvalidArgumentError, "non-negative"),
    ("unknown pool",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], inst_coll="gpu")]),
     InvalidArgumentError, "instance collection"),
    ("unknown region",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], regions=["mars"])]),
     InvalidArgumentError, "region"),
    ("unknown job group",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], job_group_id=77)]),
     InvalidArgumentError, "job group"),
    ("bad lock mode",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], locks=[
         {"level": "node", "mode": "sneaky", "name": "n1"}])]), InvalidArgumentError, "lock"),
    ("shared lock without a name",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"], locks=[
         {"level": "node", "mode": "shared"}])]), InvalidArgumentError, "lock"),
    ("duplicate job in a bunch",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"]), job_spec(c["start"])]),
     InvalidArgumentError, "twice"),
    ("a job without a job_id",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [job_spec(c["start"]), {"cores_mcpu": 1000}]),
     InvalidArgumentError, "needs a job_id"),
    # The list passes run only when a job of the bunch has that list: here only the last one does.
    ("an unknown region in the last job of a bunch",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [
         job_spec(c["start"]), job_spec(c["start"] + 1, regions=["mars"])]), InvalidArgumentError, "unknown region"),
    ("a parent after its job in the last job of a bunch",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [
         job_spec(c["start"]), job_spec(c["start"] + 1, parents=[{"in_update_offset": 1}])]),
     InvalidArgumentError, "negative"),
    ("a lock without a level in the last job of a bunch",
     lambda w, c: w.store.insert_jobs(c["batch"], c["update"], [
         job_spec(c["start"]), job_spec(c["start"] + 1, locks=[{"mode": "all_shared"}])]),
     InvalidArgumentError, "lock"),
    ("jobs not a list",
     lambda w, c: w.db.call("insert_jobs", c["batch"], c["update"], {"job_id": 1}, 0, None), InvalidArgumentError,
     "array"),
    ("new jobs into a committed update",
     lambda w, c: w.store.insert_jobs(c["batch"], 1, [job_spec(c["first"] + 2)]), FailedPreconditionError,
     "committed"),
    ("commit with missing bunches",
     lambda w, c: w.store.commit_update(c["batch"], c["update"]), FailedPreconditionError, "missing"),
    ("group outside the block",
     lambda w, c: w.store.insert_job_groups(c["batch"], c["update"], [{"job_group_id": c["group"] + 1, "parent_id": 0}]),
     InvalidArgumentError, "within"),
    ("cancel unknown group",
     lambda w, c: w.store.cancel_job_group(c["batch"], 42, "alice", "x"), NotFoundError, "no job group"),
    ("cancel without a user",
     lambda w, c: w.store.cancel_job_group(c["batch"], 0, "", "x"), InvalidArgumentError, "who"),
    ("schedule without attempt id",
     lambda w, c: w.store.schedule_jobs(w.epoch, "i1", [{"batch_id": c["batch"], "job_id": c["first"]}]),
     InvalidArgumentError, "attempt_id"),
    ("schedule on unknown instance",
     lambda w, c: w.store.schedule_jobs(w.epoch, "ghost", [{"batch_id": c["batch"], "job_id": c["first"],
                                                            "attempt_id": "a"}]), NotFoundError, "no instance"),
    ("complete the same job twice in one call",
     lambda w, c: w.store.mark_jobs_complete(w.epoch, "i1", [
         {"batch_id": c["batch"], "job_id": c["first"], "state": "Cancelled"},
         {"batch_id": c["batch"], "job_id": c["first"], "state": "Cancelled"}]), InvalidArgumentError, "twice"),
    ("activate with a wrong token",
     lambda w, c: w.store.activate_instance(w.epoch, "i1", "forged"), PermissionDeniedError, "token"),
    ("instance with no cores",
     lambda w, c: w.store.create_instance(w.epoch, "i2", "standard", 0, "t"), InvalidArgumentError, "positive"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
async def test_refused_call_writes_nothing(world: World, case: tuple[str, Call, type[ProcedureError], str]) -> None:
    _, call, error, message = case
    context = await prepared(world)
    before = await snapshot(world)
    with pytest.raises(error, match=message):
        await call(world, context)
    assert await snapshot(world) == before


async def test_a_resent_bunch_of_a_committed_update_is_a_duplicate(world: World) -> None:
    context = await prepared(world)
    before = await snapshot(world)
    status = await world.store.insert_jobs(context["batch"], 1, [job_spec(context["first"])])
    assert status["message"] == "duplicate"
    assert await snapshot(world) == before


async def test_conflicting_bunch_is_refused(world: World) -> None:
    context = await prepared(world)
    await world.store.insert_jobs(context["batch"], context["update"], [job_spec(context["start"])])
    before = await snapshot(world)
    with pytest.raises(ConflictError, match="before"):
        await world.store.insert_jobs(
            context["batch"], context["update"], [job_spec(context["start"]), job_spec(context["start"] + 1)])
    assert await snapshot(world) == before


@pytest.mark.parametrize("overlap", ["whole", "part"])
@pytest.mark.parametrize("kind", ["jobs", "job groups"])
async def test_a_bunch_that_meets_a_concurrent_one_is_answered_by_what_it_committed(
        world: World, kind: str, overlap: str) -> None:
    """Two clients send bunches of one update at once, and both see none of their rows stored: the later
    one meets the other's rows only when it inserts (duplicate key, 1062). It is answered as if it had
    come after: a duplicate when every row of it is stored, refused (rc 5) when only some are. The other
    client's transaction is stood in for by a plain INSERT, held open until the bunch waits on it."""
    await world.instance()
    batch_id = int((await world.store.create_batch("alice", "proj"))["batch_id"])
    update = await world.store.create_update(batch_id, 2, n_job_groups=2)
    update_id = update["update_id"]
    if kind == "jobs":
        first = update["start_job_id"]
        held_insert = ("INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, user, state, cores_mcpu, "
                       "inst_coll, time_created_ms) VALUES (%s, %s, %s, 0, 'alice', 'Pending', 1000, 'standard', 0)")
        send = world.store.insert_jobs(batch_id, update_id, [job_spec(first), job_spec(first + 1)])
        its_insert = "INSERT INTO jobs (batch_id, job_id, update_id, job_group_id, user, state, dependency_failed"
        refusal = "some jobs of this bunch were inserted before, others not"
        read = "SELECT job_id AS id FROM jobs WHERE batch_id = %s AND update_id = %s"
    else:
        first = update["start_job_group_id"]
        held_insert = ("INSERT INTO job_groups (batch_id, job_group_id, parent_id, update_id, depth, "
                       "time_created_ms) VALUES (%s, %s, 0, %s, 1, 0)")
        send = world.store.insert_job_groups(batch_id, update_id, [{"job_group_id": first, "parent_id": 0},
                                                                   {"job_group_id": first + 1, "parent_id": 0}])
        its_insert = "INSERT INTO job_groups (batch_id, job_group_id, parent_id, update_id, depth"
        refusal = "some of these job groups were inserted before, others not"
        read = "SELECT job_group_id AS id FROM job_groups WHERE batch_id = %s AND update_id = %s"
    stored = [first, first + 1] if overlap == "whole" else [first + 1]
    holder = await aiomysql.connect(**world.db.config.connect_kwargs())
    try:
        async with holder.cursor() as held:
            await held.execute("START TRANSACTION")
            for row_id in stored:
                await held.execute(held_insert, (batch_id, row_id, update_id))
            bunch = asyncio.ensure_future(send)
            # Past its duplicate check once it inserts, where the held rows stop it.
            deadline = time.monotonic() + 10
            while not await world.db.fetchone(
                    "SELECT 1 FROM information_schema.processlist WHERE info LIKE %s", (its_insert + "%",)):
                assert not bunch.done(), bunch.result()
                assert time.monotonic() < deadline, "the bunch never reached its insert"
                await asyncio.sleep(0.01)
            await held.execute("COMMIT")
    finally:
        holder.close()
    if overlap == "whole":
        assert (await bunch)["message"] == "duplicate"
    else:
        with pytest.raises(ConflictError, match=refusal):
            await bunch
    assert sorted(row["id"] for row in await world.db.fetchall(read, (batch_id, update_id))) == stored


async def test_no_update_for_a_batch_of_a_closed_project(world: World) -> None:
    context = await prepared(world)
    await world.db.execute("UPDATE billing_projects SET state = 'closed' WHERE name = 'proj'")
    before = await snapshot(world)
    with pytest.raises(FailedPreconditionError, match="proj is closed"):
        await world.store.create_update(context["batch"], 1)
    assert await snapshot(world) == before
