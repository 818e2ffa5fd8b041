"""WorkerEvents against a real MariaDB: the passes of several workers' sessions are recorded together, one
MJS and one MJC for all of them; two sessions that report the same job go in separate calls; a pass that
refuses the combined call fails only its own session; and at the driver's stop, the pass under way
finishes, or is cancelled when it cannot."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiomysql
import pytest
from google.protobuf import timestamp_pb2

from corral.batch.v1 import job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.db.database import DatabaseConfig, ProcedureError
from services.db.invariants import check_invariants
from services.driver.worker_events import WorkerEvents
from tests.world import World


def _now() -> timestamp_pb2.Timestamp:
    now = timestamp_pb2.Timestamp()
    now.GetCurrentTime()
    return now


def started(event_id: int, ref: dict[str, Any]) -> pb.WorkerSessionRequest:
    return pb.WorkerSessionRequest(event_id=event_id, job_started=ws.JobStarted(
        attempt=ws.AttemptRef(**ref), start_time=_now()))


def succeeded(event_id: int, ref: dict[str, Any]) -> pb.WorkerSessionRequest:
    return pb.WorkerSessionRequest(event_id=event_id, job_completed=ws.JobCompleted(
        attempt=ws.AttemptRef(**ref), state=job_state_pb2.JOB_STATE_SUCCEEDED, exit_code=0, start_time=_now(),
        end_time=_now()))


def heartbeat(event_id: int) -> pb.WorkerSessionRequest:
    return pb.WorkerSessionRequest(event_id=event_id, heartbeat=ws.Heartbeat())


class CountedCalls:
    """The store's MJS and MJC calls, counted as they go to the database."""

    def __init__(self, world: World, monkeypatch: pytest.MonkeyPatch):
        self.calls: dict[str, int] = {"mark_jobs_started": 0, "mark_jobs_complete_status": 0}
        for name in self.calls:
            real = getattr(world.store, name)

            async def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
                self.calls[_name] += 1
                return await _real(*args, **kwargs)

            monkeypatch.setattr(world.store, name, counted)


async def scheduled(world: World, batch_id: int, job_id: int, instance: str) -> dict[str, Any]:
    ref = {"batch_id": batch_id, "job_id": job_id, "attempt_id": world.attempt_id()}
    assert (await world.store.schedule_jobs(world.epoch, instance, [ref]))[0]["outcome"] == "scheduled"
    return ref


async def test_the_passes_of_three_sessions_are_recorded_in_one_mjs_and_one_mjc(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    instances = [await world.instance(f"i{n}", cores_mcpu=4000) for n in range(1, 4)]
    batch_id, _, start = await world.batch([{} for _ in range(6)])
    refs = [await scheduled(world, batch_id, start + n, instances[n % 3]) for n in range(6)]
    counted = CountedCalls(world, monkeypatch)
    kinds: list[str] = []
    ended: list[dict[str, Any]] = []
    events = WorkerEvents(world.store, kinds.append, ended.extend)

    passes = {instance: [] for instance in instances}  # type: dict[str, list[pb.WorkerSessionRequest]]
    for n, ref in enumerate(refs):
        passes[instances[n % 3]] += [started(2 * n + 1, ref), succeeded(2 * n + 2, ref)]
    passes["i1"].append(heartbeat(100))
    results = await asyncio.gather(*(events.record(world.epoch, i, passes[i]) for i in instances))

    assert counted.calls == {"mark_jobs_started": 1, "mark_jobs_complete_status": 1}
    assert events.calls == 1
    for instance, result in zip(instances, results):  # each session hears of its own events only
        assert sorted(result.acks) == sorted(m.event_id for m in passes[instance])
        assert (result.started, result.completed, result.stop) == (2, 2, [])
    assert [await world.state(batch_id, start + n) for n in range(6)] == ["Success"] * 6
    assert sorted(j["job_id"] for j in ended) == [start + n for n in range(6)]
    assert kinds == ["job_started", "job_ended"]
    free = await world.db.fetchall("SELECT name, free_cores_mcpu FROM instances ORDER BY name")
    assert [(r["name"], r["free_cores_mcpu"]) for r in free] == [(i, 4000) for i in instances]
    attempts = await world.db.fetchall("SELECT job_id, instance_name FROM attempts WHERE batch_id = %s "
                                       "ORDER BY job_id", (batch_id,))
    assert [(r["job_id"], r["instance_name"]) for r in attempts] == [(start + n, instances[n % 3]) for n in range(6)]
    assert await check_invariants(world.db) == []


async def test_a_pass_that_arrives_while_one_is_recorded_goes_in_the_next(world: World) -> None:
    await world.instance("i1")
    await world.instance("i2")
    batch_id, _, start = await world.batch([{}, {}, {}])
    refs = [await scheduled(world, batch_id, start + n, "i1" if n == 0 else "i2") for n in range(3)]
    events = WorkerEvents(world.store, lambda kind: None)
    first = asyncio.ensure_future(events.record(world.epoch, "i1", [succeeded(1, refs[0])]))
    await asyncio.sleep(0)  # the first pass is under way
    later = [asyncio.ensure_future(events.record(world.epoch, "i2", [succeeded(10 + n, ref)])) for n, ref in
             enumerate(refs[1:])]
    await asyncio.gather(first, *later)
    assert events.calls == 2  # the two that waited went together
    assert [await world.state(batch_id, start + n) for n in range(3)] == ["Success"] * 3


async def test_two_sessions_that_report_one_job_go_in_separate_calls(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """MJC refuses a job named twice in one call: a lost worker's attempt and its retry's reported in the same
    pass would otherwise fail both sessions."""
    await world.instance("i1")
    await world.instance("i2")
    batch_id, _, start = await world.batch([{}, {}])
    ref = await scheduled(world, batch_id, start, "i1")
    other = await scheduled(world, batch_id, start + 1, "i2")
    counted = CountedCalls(world, monkeypatch)
    events = WorkerEvents(world.store, lambda kind: None)
    results = await asyncio.gather(events.record(world.epoch, "i1", [succeeded(1, ref)]),
                                   events.record(world.epoch, "i2", [succeeded(1, ref), succeeded(2, other)]))
    assert counted.calls["mark_jobs_complete_status"] == 2
    assert [r.acks for r in results] == [[1], [1, 2]]
    assert await world.state(batch_id, start) == "Success"
    assert await world.state(batch_id, start + 1) == "Success"
    assert await check_invariants(world.db) == []


async def test_a_pass_that_refuses_the_combined_call_fails_only_its_own_session(world: World) -> None:
    await world.instance("i1")
    batch_id, _, start = await world.batch([{}])
    ref = await scheduled(world, batch_id, start, "i1")
    events = WorkerEvents(world.store, lambda kind: None)
    good, ghost = await asyncio.gather(
        events.record(world.epoch, "i1", [started(1, ref), succeeded(2, ref)]),
        events.record(world.epoch, "ghost", [heartbeat(1)]),  # no such instance: heartbeat_rollup refuses it
        return_exceptions=True)
    assert isinstance(ghost, ProcedureError), ghost
    assert not isinstance(good, BaseException) and sorted(good.acks) == [1, 2]
    assert events.calls == 3  # together, then each alone
    assert await world.state(batch_id, start) == "Success"
    assert await check_invariants(world.db) == []


async def test_closing_lets_the_pass_under_way_finish(world: World) -> None:
    await world.instance("i1")
    batch_id, _, start = await world.batch([{}])
    ref = await scheduled(world, batch_id, start, "i1")
    events = WorkerEvents(world.store, lambda kind: None)
    recording = asyncio.ensure_future(events.record(world.epoch, "i1", [started(1, ref), succeeded(2, ref)]))
    await asyncio.sleep(0)  # the pass is under way
    await events.close()
    assert sorted((await recording).acks) == [1, 2]
    assert await world.state(batch_id, start) == "Success"
    await events.close()  # nothing under way: returns at once


async def _waiting_for_the_jobs_lock(world: World) -> list[int]:
    """The connections whose call waits in complete_jobs_core's first statement, which locks the jobs' rows."""
    return [row["id"] for row in await world.db.fetchall(
        "SELECT id FROM information_schema.PROCESSLIST WHERE info LIKE %s",
        ("SELECT COUNT(*) INTO v_locked%tmp_job_completions%",))]


async def test_closing_cancels_a_pass_that_cannot_finish_and_fails_its_session(
        world: World, db_config: DatabaseConfig) -> None:
    await world.instance("i1")
    batch_id, _, start = await world.batch([{}])
    ref = await scheduled(world, batch_id, start, "i1")
    events = WorkerEvents(world.store, lambda kind: None)
    holder = await aiomysql.connect(**db_config.connect_kwargs())
    try:
        async with holder.cursor() as cursor:
            await cursor.execute("START TRANSACTION")
            await cursor.execute("SELECT * FROM jobs WHERE batch_id = %s AND job_id = %s FOR UPDATE",
                                 (batch_id, start))
            recording = asyncio.ensure_future(events.record(world.epoch, "i1", [succeeded(1, ref)]))
            deadline = time.monotonic() + 15  # within the server's lock wait timeout (20 s)
            while not (waiting := await _waiting_for_the_jobs_lock(world)):
                assert not recording.done(), recording
                assert time.monotonic() < deadline, "the pass never waited for the job's row"
                await asyncio.sleep(0.05)
            started_at = time.monotonic()
            await events.close(wait_s=0.2)
            assert time.monotonic() - started_at < 5
            with pytest.raises(RuntimeError, match="the driver stopped before recording the events"):
                await recording
            await cursor.execute("ROLLBACK")
    finally:
        holder.close()
    # The server may still finish the cancelled call once the lock is free (its client has gone); either way
    # nothing is half-done once its connection has ended.
    deadline = time.monotonic() + 15
    while await world.db.fetchall("SELECT id FROM information_schema.PROCESSLIST WHERE id = %s", (waiting[0],)):
        assert time.monotonic() < deadline, "the cancelled call's connection never ended"
        await asyncio.sleep(0.05)
    assert await world.state(batch_id, start) in ("Running", "Success")
    assert await check_invariants(world.db) == []
