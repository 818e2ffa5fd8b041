"""The scheduler against a real MariaDB, with a recording dispatcher standing in
for the worker sessions (the one I/O boundary it has)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from google.protobuf import timestamp_pb2

from corral.batch.v1 import job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.db.invariants import check_invariants
from services.db.plan_snapshot import read_demand
from services.common.specs import SpecStore
from services.driver.scheduler import Placement, Scheduler
from services.driver.sessions import SessionRegistry
from services.driver.worker_events import WorkerEvents
from services.policy.fair_share import UserDemand
from tests.world import World


class RecordingDispatcher:
    """Workers that are all connected and take every Run command."""

    def __init__(self, live: set[str], held: dict[str, frozenset[str]] | None = None):
        self.live = live
        self.held = held or {}
        """What each worker's image cache holds, as its reports would say."""
        self.sent: list[Placement] = []

    def live_instances(self) -> set[str]:
        return self.live

    def images_held(self) -> dict[str, frozenset[str]]:
        return self.held

    async def run(self, placements: Sequence[Placement]) -> None:
        self.sent += placements


async def test_two_users_share_the_cores_evenly(world: World) -> None:
    await world.store.create_billing_project("other", ["bob"])
    await world.instance("i1", cores_mcpu=4000)
    await world.instance("i2", cores_mcpu=4000)
    alice, _, _ = await world.batch([{} for _ in range(20)], user="alice")
    bob_batch = await world.store.create_batch("bob", "other")
    update = await world.store.create_update(bob_batch["batch_id"], 20)
    await world.store.insert_jobs(bob_batch["batch_id"], update["update_id"],
                                  [{"job_id": update["start_job_id"] + i, "cores_mcpu": 1000, "inst_coll": "standard"}
                                   for i in range(20)])
    await world.store.commit_update(bob_batch["batch_id"], update["update_id"])

    dispatcher = RecordingDispatcher({"i1", "i2"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch)
    await scheduler.cycle()
    per_batch = {}
    for p in dispatcher.sent:
        per_batch[p.batch_id] = per_batch.get(p.batch_id, 0) + 1
    assert per_batch == {alice: 4, bob_batch["batch_id"]: 4}
    free = await world.db.fetchall("SELECT free_cores_mcpu FROM instances")
    assert [r["free_cores_mcpu"] for r in free] == [0, 0]
    assert await check_invariants(world.db) == []


async def test_only_live_instances_and_runnable_jobs_are_used(world: World) -> None:
    await world.instance("i1", cores_mcpu=8000)
    await world.instance("i2", cores_mcpu=8000)  # no session: never used
    batch_id, _, s = await world.batch([{}, {"always_run": True}, {}, {"priority": 5}])
    group = await world.store.create_update(batch_id, 0, n_job_groups=0)
    assert group["update_id"] == 2
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")
    dispatcher = RecordingDispatcher({"i1"})
    await Scheduler(world.store, dispatcher, lambda: world.epoch).cycle()
    # Cancelled batch: only the always_run job runs.
    assert [(p.job_id, p.instance) for p in dispatcher.sent] == [(s + 1, "i1")]

    other, _, t = await world.batch([{}, {"priority": 5}, {"cores_mcpu": 9000}])
    dispatcher.sent.clear()
    await Scheduler(world.store, dispatcher, lambda: world.epoch).cycle()
    # Priority first; a job bigger than any live instance waits.
    assert [p.job_id for p in dispatcher.sent] == [t + 1, t]
    assert await world.state(other, t + 2) == "Ready"
    assert await check_invariants(world.db) == []


async def test_a_job_goes_to_a_worker_holding_its_image_as_the_job_names_it_or_normalised(world: World) -> None:
    await world.instance("i1", cores_mcpu=8000)
    await world.instance("i2", cores_mcpu=8000)
    await world.instance("i3", cores_mcpu=8000)
    python = "127.0.0.1:5000/lab/python:3.11"
    _, _, s = await world.batch([{"image": python}, {"image": "127.0.0.1:5000/lab/tool"}, {}])
    dispatcher = RecordingDispatcher({"i1", "i2", "i3"}, {
        "i2": frozenset({python}),
        "i3": frozenset({"127.0.0.1:5000/lab/tool:latest", "sha256:" + "a" * 64})})
    await Scheduler(world.store, dispatcher, lambda: world.epoch).cycle()
    # The first by the name its spec writes, the second by its normalised name (a tag added); the one without a
    # recorded image goes first-fit.
    assert sorted((p.job_id - s, p.instance) for p in dispatcher.sent) == [(0, "i2"), (1, "i3"), (2, "i1")]
    assert [r["image"] for r in await world.db.fetchall(
        "SELECT image FROM jobs WHERE job_id >= %s ORDER BY job_id", (s,))] == [python, "127.0.0.1:5000/lab/tool", None]


async def test_no_epoch_no_scheduling(world: World) -> None:
    await world.instance("i1")
    await world.batch([{}])
    dispatcher = RecordingDispatcher({"i1"})
    await Scheduler(world.store, dispatcher, lambda: None).cycle()
    assert dispatcher.sent == []


async def test_a_reused_fair_share_read_counts_the_jobs_it_started_and_new_work_ends_it(world: World) -> None:
    """With demand_reuse_s, the cycles after a fair-share read reuse it, moving the cores of the jobs they
    start from ready to running; new work outside the scheduler (`new_work`) makes the next cycle read it
    again. Without new_work a batch of a user the read did not know waits for the next read."""
    await world.store.create_billing_project("other", ["bob"])
    await world.instance("i1", cores_mcpu=2000)
    await world.batch([{} for _ in range(6)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, demand_reuse_s=3600)
    await scheduler.cycle()
    assert len(dispatcher.sent) == 2
    (alice,) = (await scheduler._read_demand())["standard"]
    assert (alice.running_cores_mcpu, alice.ready_cores_mcpu) == (2000, 4000)  # as the counters now say
    fresh = {d.user: d for d in (await scheduler_demand(world))["standard"]}
    assert fresh["alice"] == alice

    # Room again, and bob's batch since the read: the reused read does not know bob.
    await world.db.execute("UPDATE instances SET cores_mcpu = 4000, free_cores_mcpu = free_cores_mcpu + 2000")
    bob_batch = await world.store.create_batch("bob", "other")
    update = await world.store.create_update(bob_batch["batch_id"], 2)
    await world.store.insert_jobs(bob_batch["batch_id"], update["update_id"],
                                  [{"job_id": update["start_job_id"] + i, "cores_mcpu": 1000, "inst_coll": "standard"}
                                   for i in range(2)])
    await world.store.commit_update(bob_batch["batch_id"], update["update_id"])
    await scheduler.cycle()
    assert {p.batch_id for p in dispatcher.sent[2:]} <= {dispatcher.sent[0].batch_id}
    assert all(k[0] != bob_batch["batch_id"] for k in scheduler.last_plans["standard"].waits)

    scheduler.new_work()
    await world.db.execute("UPDATE instances SET cores_mcpu = 6000, free_cores_mcpu = free_cores_mcpu + 2000")
    await scheduler.cycle()
    assert any(p.batch_id == bob_batch["batch_id"] for p in dispatcher.sent)
    assert await check_invariants(world.db) == []


async def scheduler_demand(world: World) -> dict[str, list[UserDemand]]:
    return await read_demand(world.db)


def _worker_pass(placements: Sequence[Placement]) -> list[pb.WorkerSessionRequest]:
    """What a worker reports for attempts that started and succeeded: one pass of its session."""
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    messages = []
    for n, p in enumerate(placements):
        attempt = ws.AttemptRef(batch_id=p.batch_id, job_id=p.job_id, attempt_id=p.attempt_id)
        messages += [pb.WorkerSessionRequest(event_id=2 * n + 1, job_started=ws.JobStarted(attempt=attempt,
                                                                                            start_time=now)),
                     pb.WorkerSessionRequest(event_id=2 * n + 2, job_completed=ws.JobCompleted(
                         attempt=attempt, state=job_state_pb2.JOB_STATE_SUCCEEDED, exit_code=0, start_time=now,
                         end_time=now))]
    return messages


async def test_a_reused_fair_share_read_counts_the_ends_a_worker_reports(world: World) -> None:
    """A pass of ends that makes no job Ready keeps the read, taking the ended jobs' cores off their users'
    running cores, so that it still says what a fresh read says; a pass whose ends release a child ends the
    reuse (the child is Ready: new work, as the driver's on_change says)."""
    await world.instance("i1", cores_mcpu=2000)
    await world.batch([{} for _ in range(5)], user="alice")
    bob, _, bob_start = await world.batch(
        [{}, {"parents": [{"in_update_offset": -1, "accepted_states": 1}]}], user="bob")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, demand_reuse_s=3600)
    kinds: list[str] = []
    ended: list[dict] = []

    def on_change(kind: str) -> None:
        kinds.append(kind)
        if kind == "job_completed":
            scheduler.new_work()

    def on_ended(jobs: Sequence[dict]) -> None:
        ended.extend(jobs)
        scheduler.ended(jobs)

    events = WorkerEvents(world.store, on_change, on_ended)
    await scheduler.cycle()
    first = list(dispatcher.sent)
    assert len(first) == 2 and {p.batch_id for p in first} >= {bob}  # one each: bob's parent and one of alice's
    await events.record(world.epoch, "i1", _worker_pass([p for p in first if p.batch_id != bob]))
    assert kinds == ["job_started", "job_ended"]
    assert [(j["user"], j["inst_coll"], j["cores_mcpu"]) for j in ended] == [("alice", "standard", 1000)]
    assert scheduler._demand is not None
    assert _waiting(scheduler._demand) == _waiting(await scheduler_demand(world))  # what the counters now say

    await events.record(world.epoch, "i1", _worker_pass([p for p in first if p.batch_id == bob]))
    assert kinds[2:] == ["job_started", "job_completed"]  # bob's child is Ready now
    assert await world.state(bob, bob_start + 1) == "Ready"
    await scheduler.cycle()
    assert scheduler._demand is not None
    assert _waiting(scheduler._demand) == _waiting(await scheduler_demand(world))
    assert await check_invariants(world.db) == []


def _waiting(demand: dict[str, list[UserDemand]]) -> dict[str, list[UserDemand]]:
    """The users with Ready cores (a reused read keeps, with none, those whose last jobs it started)."""
    return {pool: [d for d in users if d.ready_cores_mcpu > 0] for pool, users in demand.items()}


async def test_a_fair_share_read_that_new_work_overlapped_is_not_reused(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """Work that arrives while the read runs may be missing from it: that cycle uses the read, the next one
    reads again."""
    await world.instance("i1", cores_mcpu=2000)
    await world.batch([{} for _ in range(4)], user="alice")
    scheduler = Scheduler(world.store, RecordingDispatcher({"i1"}), lambda: world.epoch,
                          demand_reuse_s=3600)
    real = world.store.read_demand

    async def overlapped() -> dict[str, list[UserDemand]]:
        demand = await real()
        scheduler.new_work()  # as if a commit's notice came while the read ran
        return demand

    monkeypatch.setattr(world.store, "read_demand", overlapped)
    await scheduler.cycle()
    assert scheduler._demand is None
    monkeypatch.setattr(world.store, "read_demand", real)
    await world.db.execute("UPDATE instances SET cores_mcpu = 4000, free_cores_mcpu = 2000")  # room again
    await scheduler.cycle()
    assert scheduler._demand is not None  # a read nothing overlapped is kept


async def test_sj_returns_what_a_run_command_needs_as_the_sessions_would_read_it(world: World,
                                                                                   tmp_path: Path) -> None:
    """The scheduler's placements carry SJ's rows, so the session registry sends Run commands without reading
    the jobs again; for every field a Run command uses, SJ's row is what that read (kept for RunJobs sent
    again) says: a job's sizes and timeout, its owner and project, its update's trace context, and the
    timeout a project with a limit gives a job that set none."""
    await world.instance("i1", cores_mcpu=8000)
    await world.store.create_billing_project("lab", ["bob"], limit_usd=1000.0)
    await world.batch([{"memory_bytes": 1 << 30, "storage_bytes": 2 << 30, "timeout_ms": 5000,
                        "spec_ref": "specs/a"}], user="alice")
    created = await world.store.create_batch("bob", "lab")
    update = await world.store.create_update(created["batch_id"], 1,
                                             trace_context='{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-'
                                                           'b7ad6b7169203331-01"}')
    await world.store.insert_jobs(created["batch_id"], update["update_id"],
                                  [{"job_id": update["start_job_id"], "cores_mcpu": 1000, "inst_coll": "standard",
                                    "spec_ref": "specs/b"}])
    await world.store.commit_update(created["batch_id"], update["update_id"])
    dispatcher = RecordingDispatcher({"i1"})
    await Scheduler(world.store, dispatcher, lambda: world.epoch).cycle()
    assert len(dispatcher.sent) == 2 and all(p.run is not None for p in dispatcher.sent)

    registry = SessionRegistry(world.store, SpecStore(f"file://{tmp_path}"))
    read = await registry._run_details(dispatcher.sent)
    for p in dispatcher.sent:
        assert p.run is not None
        expected = read[(p.batch_id, p.job_id)]
        assert {k: p.run[k] for k in expected} == expected
    by_user = {p.run["user"]: p.run for p in dispatcher.sent if p.run is not None}
    assert (by_user["alice"]["memory_bytes"], by_user["alice"]["timeout_ms"]) == (1 << 30, 5000)
    assert by_user["alice"]["budget_timeout_ms"] is None
    assert by_user["bob"]["budget_timeout_ms"] is not None and "traceparent" in by_user["bob"]["trace_context"]


async def test_one_sj_per_pool_per_cycle_and_a_refused_instance_holds_back_only_its_own_jobs(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The placements on all of a pool's instances go in one SJ. An instance that went away after the
    snapshot refuses that call: then SJ is called per instance, and the others' jobs still start this
    cycle."""
    for name in ("i1", "i2", "i3"):
        await world.instance(name, cores_mcpu=2000)
    await world.batch([{} for _ in range(12)])
    calls: list[str | None] = []
    real = world.store.schedule_jobs

    async def counted(epoch: int, instance_name: str | None, jobs: list[dict]) -> list[dict]:
        calls.append(instance_name)
        return await real(epoch, instance_name, jobs)

    monkeypatch.setattr(world.store, "schedule_jobs", counted)
    dispatcher = RecordingDispatcher({"i1", "i2", "i3"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch)
    await scheduler.cycle()
    assert calls == [None]
    assert sorted(p.instance for p in dispatcher.sent) == ["i1", "i1", "i2", "i2", "i3", "i3"]
    assert all(p.run is not None for p in dispatcher.sent)

    for p in dispatcher.sent:
        await world.finish(p.batch_id, p.job_id, p.attempt_id, "Success", instance=p.instance)
    dispatcher.sent.clear()
    calls.clear()

    async def instance_goes_away(epoch: int, instance_name: str | None, jobs: list[dict]) -> list[dict]:
        if not calls:
            await world.store.deactivate_instance(world.epoch, "i2", "gone")
        return await counted(epoch, instance_name, jobs)

    monkeypatch.setattr(world.store, "schedule_jobs", instance_goes_away)
    await scheduler.cycle()
    assert calls == [None, "i1", "i2", "i3"]
    assert sorted(p.instance for p in dispatcher.sent) == ["i1", "i1", "i3", "i3"]
    assert await check_invariants(world.db) == []


async def _finish_all(world: World, placements: Sequence[Placement]) -> None:
    for p in placements:
        await world.finish(p.batch_id, p.job_id, p.attempt_id, "Success", instance=p.instance)


async def test_kept_queues_serve_later_cycles_until_half_are_gone_or_new_work_comes(world: World) -> None:
    """While the fair-share read may be reused, cycles take their candidates from the queues read before,
    without the jobs already scheduled, in queue order; a queue is read again once fewer than half the jobs
    the planner looks at are left, and `new_work` makes the next cycle read."""
    await world.instance("i1", cores_mcpu=2000)
    batch_id, _, start = await world.batch([{} for _ in range(20)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, jobs_per_cycle=8,
                          demand_reuse_s=3600)
    reads = []
    for _ in range(5):
        sent = len(dispatcher.sent)
        await scheduler.cycle()
        reads.append(scheduler.queue_reads)
        await _finish_all(world, dispatcher.sent[sent:])
    # Read 8: 6 left, 4, then 2 (fewer than half of 8): read again, 6 left.
    assert reads == [1, 1, 1, 2, 2]
    assert [(p.batch_id, p.job_id) for p in dispatcher.sent] == [(batch_id, start + i) for i in range(10)]

    scheduler.new_work()
    await scheduler.cycle()
    assert scheduler.queue_reads == 3
    assert [p.job_id for p in dispatcher.sent[10:]] == [start + 10, start + 11]
    assert await check_invariants(world.db) == []


async def test_a_queue_read_to_its_end_is_kept_until_nothing_is_left(world: World) -> None:
    """A read that returned fewer jobs than asked holds the user's whole queue: it serves until empty."""
    await world.instance("i1", cores_mcpu=1000)
    _, _, start = await world.batch([{} for _ in range(3)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, jobs_per_cycle=8,
                          demand_reuse_s=3600)
    for _ in range(3):
        sent = len(dispatcher.sent)
        await scheduler.cycle()
        await _finish_all(world, dispatcher.sent[sent:])
    assert scheduler.queue_reads == 1
    assert [p.job_id for p in dispatcher.sent] == [start, start + 1, start + 2]


async def test_a_cycle_that_finds_no_free_cores_keeps_the_queues(world: World) -> None:
    """A full fleet is the usual state under load: a cycle with nowhere to place anything looks at no queue,
    and the next one, after jobs ended, still takes its candidates from the queues kept before."""
    await world.instance("i1", cores_mcpu=1000)
    _, _, start = await world.batch([{} for _ in range(6)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, jobs_per_cycle=8,
                          demand_reuse_s=3600)
    await scheduler.cycle()
    await scheduler.cycle()  # i1 is full
    await _finish_all(world, dispatcher.sent)
    await scheduler.cycle()
    assert scheduler.queue_reads == 1
    assert [p.job_id for p in dispatcher.sent] == [start, start + 1]


@pytest.mark.parametrize("demand_reuse_s", [0.0, 0.05])
async def test_queues_older_than_the_demand_reuse_are_read_again(world: World, demand_reuse_s: float) -> None:
    """Without reuse every cycle reads the queues; with it, once they are older than `demand_reuse_s`."""
    await world.instance("i1", cores_mcpu=1000)
    await world.batch([{} for _ in range(6)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, jobs_per_cycle=8,
                          demand_reuse_s=demand_reuse_s)
    for n in range(1, 4):
        sent = len(dispatcher.sent)
        await asyncio.sleep(demand_reuse_s * 2)
        await scheduler.cycle()
        await _finish_all(world, dispatcher.sent[sent:])
        assert scheduler.queue_reads == n


async def test_a_kept_candidate_that_sj_refuses_drops_the_kept_queues(world: World) -> None:
    """A batch cancelled without the scheduler hearing of it: its kept candidates reach SJ, which refuses
    them, so none runs; the next cycle reads the queues again and starts the other batch's jobs."""
    await world.instance("i1", cores_mcpu=1000)
    cancelled, _, _ = await world.batch([{"priority": 5} for _ in range(6)], user="alice")
    other, _, _ = await world.batch([{} for _ in range(6)], user="alice")
    dispatcher = RecordingDispatcher({"i1"})
    scheduler = Scheduler(world.store, dispatcher, lambda: world.epoch, jobs_per_cycle=8,
                          demand_reuse_s=3600)
    await scheduler.cycle()
    assert [p.batch_id for p in dispatcher.sent] == [cancelled]
    await _finish_all(world, dispatcher.sent)
    await world.store.cancel_job_group(cancelled, 0, "alice", "stop")

    await scheduler.cycle()  # the kept queue: the cancelled batch's next job, refused by SJ
    assert len(dispatcher.sent) == 1 and scheduler.queue_reads == 1
    assert "standard" not in scheduler._kept
    await scheduler.cycle()
    assert scheduler.queue_reads == 2
    assert [p.batch_id for p in dispatcher.sent[1:]] == [other]
    assert await check_invariants(world.db) == []
