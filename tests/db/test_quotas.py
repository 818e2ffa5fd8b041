"""Quotas (migration 0031) on a real MariaDB: set_quota each way it sets, clears and refuses (a refusal
writes nothing); the cap on ready (open) jobs at submission; the snapshot's read of quotas and of what runs
across every pool; and the scheduler, ExplainJob and the plan agreeing on QUOTA_REACHED."""

from __future__ import annotations

from typing import Any

import pytest

from services.db.database import InvalidArgumentError, NotFoundError, ResourceExhaustedError
from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand, read_quotas, read_snapshot, read_workers
from services.driver.scheduler import Scheduler
from services.frontend.explain_store import ExplainStore
from services.frontend.quota_store import QuotaRow, QuotaStore
from services.policy import planner
from services.policy.planner import Quota, Usage
from tests.db.test_bad_input import snapshot
from tests.db.test_planner_paths import Recorder
from tests.world import World


@pytest.fixture(autouse=True)
async def people(world: World) -> None:
    """alice and bob as users of corral (the world's project names them without making them users)."""
    await world.db.execute("INSERT INTO users (username, time_created_ms) VALUES ('alice', 1), ('bob', 1)")


async def set_quota(world: World, *args: Any) -> str:
    status, _ = await world.db.call("set_quota", *args)
    return str(status["message"])


async def test_set_quota_sets_replaces_and_clears(world: World) -> None:
    store = QuotaStore(world.db, clock_ms=world.clock)
    got = await store.set_quota(QuotaRow("project", "proj", 4000, 3, 100, 2), "root")
    assert got == QuotaRow("project", "proj", 4000, 3, 100, 2, "root", world.clock())
    # Replaced whole: a cap not given is none.
    world.clock.advance(1000)
    got = await store.set_quota(QuotaRow("project", "proj", max_running_jobs=5), "admin")
    assert got == QuotaRow("project", "proj", None, 5, None, 1, "admin", world.clock())
    assert await set_quota(world, "user", "alice", None, None, 10, 1, "root", world.clock()) == "set"
    assert [q.kind for q in await store.list_quotas(("project", "user"), None, None, 10)] == ["project", "user"]
    # The default clears; clearing again changes nothing.
    assert await set_quota(world, "project", "proj", None, None, None, 1, "root", world.clock()) == "cleared"
    assert await set_quota(world, "project", "proj", None, None, None, 1, "root", world.clock()) == "unchanged"
    assert await store.get("project", "proj") is None
    assert await set_quota(world, "user", "alice", None, None, None, 3, "root", world.clock()) == "set"  # a weight
    assert (await store.get("user", "alice")) == QuotaRow("user", "alice", None, None, None, 3, "root", world.clock())
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize("args, error, message", [
    (("team", "proj", 1, None, None, 1), InvalidArgumentError, "kind must be project or user"),
    (("project", "", 1, None, None, 1), InvalidArgumentError, "say whose quota"),
    (("project", "proj", 0, None, None, 1), InvalidArgumentError, "max_running_cores_mcpu must be between 1"),
    (("project", "proj", 1_000_000_001, None, None, 1), InvalidArgumentError, "max_running_cores_mcpu"),
    (("project", "proj", None, 0, None, 1), InvalidArgumentError, "max_running_jobs must be between 1"),
    (("project", "proj", None, None, -1, 1), InvalidArgumentError, "max_ready_jobs must be between 1"),
    (("project", "proj", None, None, None, 0), InvalidArgumentError, "weight must be between 1 and 1000"),
    (("project", "proj", None, None, None, 1001), InvalidArgumentError, "weight must be between 1 and 1000"),
    (("project", "proj", None, None, None, None), InvalidArgumentError, "weight"),
    (("project", "nope", 1, None, None, 1), NotFoundError, "no billing project nope"),
    (("user", "mallory", 1, None, None, 1), NotFoundError, "no user mallory"),
    (("user", "proj", 1, None, None, 1), NotFoundError, "no user proj"),
])
async def test_set_quota_refuses_and_writes_nothing(world: World, args: tuple[Any, ...], error: type[Exception],
                                                    message: str) -> None:
    await set_quota(world, "user", "bob", 2000, None, None, 1, "root", 1)  # something there already
    before = await snapshot(world)
    with pytest.raises(error, match=message):
        await world.db.call("set_quota", *args, "root", world.clock())
    with pytest.raises(InvalidArgumentError, match="who sets it"):
        await world.db.call("set_quota", "user", "bob", 1, None, None, 1, "", world.clock())
    assert await snapshot(world) == before


async def test_a_deleted_project_takes_no_quota(world: World) -> None:
    await world.store.create_billing_project("gone", ["alice"])
    await world.db.execute("UPDATE billing_projects SET state = 'deleted' WHERE name = 'gone'")
    with pytest.raises(NotFoundError, match="no billing project gone"):
        await world.db.call("set_quota", "project", "gone", 1000, None, None, 1, "root", 1)


async def test_max_ready_jobs_is_checked_at_submission(world: World) -> None:
    await world.batch([{}] * 3)  # alice: 3 open jobs in proj
    await set_quota(world, "user", "alice", None, None, 5, 1, "root", 1)
    with pytest.raises(ResourceExhaustedError, match=r"user alice has 3 open jobs; 3 more would pass the quota "
                                                     r"\(max_ready_jobs\) of user alice: 5"):
        await world.store.check_job_limits("alice", "proj", 3)
    await world.store.check_job_limits("alice", "proj", 2)
    await world.store.check_job_limits("bob", "proj", 100)  # alice's quota is hers
    batch_id = int((await world.store.create_batch("alice", "proj"))["batch_id"])
    with pytest.raises(ResourceExhaustedError, match="max_ready_jobs"):
        await world.store.create_update(batch_id, 3)  # checked again, under the update's locks
    await set_quota(world, "project", "proj", None, None, 4, 1, "root", 1)
    with pytest.raises(ResourceExhaustedError, match=r"billing project proj has 3 open jobs; 2 more would pass the "
                                                     r"quota \(max_ready_jobs\) of billing project proj: 4"):
        await world.store.check_job_limits("bob", "proj", 2)
    # The deployment's limit still holds under a looser quota.
    await set_quota(world, "project", "proj", None, None, None, 1, "root", 1)
    await set_quota(world, "user", "alice", None, None, 1000, 1, "root", 1)
    with pytest.raises(ResourceExhaustedError, match="max_open_jobs_per_user"):
        await world.store.check_job_limits("alice", "proj", 5, max_open_jobs_per_user=7)


async def test_the_snapshot_reads_quotas_and_what_runs_across_pools(world: World) -> None:
    await world.instance("i1")
    await world.instance("h1", inst_coll="highmem")
    batch_id, _, first = await world.batch([{"cores_mcpu": 1000}, {"cores_mcpu": 500, "inst_coll": "highmem"},
                                            {"cores_mcpu": 2000}])
    await world.run(batch_id, first, "i1")
    await world.run(batch_id, first + 1, "h1")
    ended = await world.run(batch_id, first + 2, "i1")
    await world.finish(batch_id, first + 2, ended, "Success")  # ended: no longer counted
    await world.batch([{"cores_mcpu": 250}], user="bob")  # bob runs nothing
    await set_quota(world, "project", "proj", 4000, None, None, 2, "root", 1)
    await set_quota(world, "user", "alice", None, 3, None, 1, "root", 1)
    await set_quota(world, "user", "bob", None, None, None, 5, "root", 1)  # a weight alone: no usage read
    quotas, usage = await read_quotas(world.db, ["proj"], ["alice", "bob"])
    assert quotas == {("project", "proj"): Quota(4000, None, 2, "root"), ("user", "alice"): Quota(None, 3, 1, "root"),
                      ("user", "bob"): Quota(None, None, 5, "root")}
    assert usage == {("project", "proj"): Usage(1500, 2), ("user", "alice"): Usage(1500, 2)}
    assert await read_quotas(world.db, [], []) == ({}, {})


async def test_the_scheduler_and_explain_job_agree_on_a_quota(world: World) -> None:
    """A project's cap of 3 cores with 1 running: of four 1-core jobs, two start, the others wait with
    QUOTA_REACHED, which ExplainJob gives too, naming the quota; the scheduler starts just what the plan says."""
    await world.instance("i1", cores_mcpu=16000)
    running, _, r = await world.batch([{"cores_mcpu": 1000}])
    await world.run(running, r, "i1")
    await set_quota(world, "project", "proj", 3000, None, None, 1, "admin", 1)
    batch_id, _, first = await world.batch([{"cores_mcpu": 1000}] * 4)
    now_ms = world.clock()
    workers = (await read_workers(world.db, "standard"))["standard"]
    plan = planner.plan(await read_snapshot(world.db, "standard", workers, (await read_demand(world.db))["standard"],
                                            planner.JOBS_PER_CYCLE, now_ms / 1000))
    assert [p.key for p in plan.placements] == [(batch_id, first), (batch_id, first + 1)]
    explain = ExplainStore(world.db, clock_ms=lambda: now_ms)
    for job_id in (first + 2, first + 3):
        wait = plan.waits[(batch_id, job_id)]
        assert wait.code == planner.QUOTA_REACHED
        job = {**await world.job(batch_id, job_id), "user": "alice", "billing_project": "proj"}
        scheduling = await explain.scheduling(job, [])
        assert scheduling.wait is not None and scheduling.wait.code == planner.QUOTA_REACHED
    assert scheduling.wait.detail == ("the quota of billing project proj (set by admin) caps its running cores at 3: "
                                      "it runs 1 across every pool, 2 start this cycle, and the job needs 1")
    recorder = Recorder(world.db)
    recorder.live = {"i1"}
    await Scheduler(world.store, recorder, lambda: world.epoch, clock_ms=lambda: now_ms).cycle()
    assert {(p.batch_id, p.job_id) for p in recorder.sent} == {p.key for p in plan.placements}
    assert await check_invariants(world.db) == []
