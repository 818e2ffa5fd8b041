"""The batch event log at the procedure level: producers append to the
outbox, `publish_batch_events` numbers and moves what committed.

Covers every kind of event once, one event for a whole commit, 32
connections completing one batch's jobs while the publisher runs, a
producer's transaction left open across a publish (MariaDB's SKIP LOCKED
skips its row and a later call moves it), and fencing."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import aiomysql
import pytest

from services.db.database import InvalidArgumentError, StaleEpochError
from services.db.invariants import check_invariants
from services.driver.events import EventPublisher
from tests.world import World, job_spec



async def publish_all(world: World, page: int = 1000, cost_interval_ms: int | None = None) -> int:
    """Publish until the outbox is empty; returns how many rows were moved."""
    moved = 0
    while True:
        status = await world.store.publish_batch_events(world.epoch, page, cost_interval_ms)
        moved += int(status["n_published"])
        cost_interval_ms = None
        if int(status["n_published"]) < page:
            return moved


async def events(world: World, batch_id: int) -> list[dict[str, Any]]:
    return await world.db.fetchall("SELECT * FROM batch_events WHERE batch_id = %s ORDER BY event_id", (batch_id,))


def summary(event: dict[str, Any]) -> tuple[Any, ...]:
    """The kind and the fields that identify an event, for comparing lists."""
    kind = event["kind"]
    if kind == "job_state_changed":
        return kind, event["job_id"], event["old_state"], event["new_state"], event["attempt_id"], event["exit_code"]
    if kind == "update_committed":
        return kind, event["update_id"], event["start_job_id"], event["n_jobs"]
    if kind == "cancelled":
        return kind, event["job_group_id"], event["cancelled_by"], event["reason"]
    if kind == "batch_completed":
        return (kind, event["n_jobs"], event["n_succeeded"], event["n_failed"], event["n_errored"],
                event["n_cancelled"], bool(event["cancelled"]))
    return kind, event["cost_micro_usd"], event["delta_micro_usd"]


async def outbox_count(world: World, batch_id: int | None = None) -> int:
    row = await world.db.fetchone(
        "SELECT COUNT(*) AS n FROM batch_event_outbox WHERE %s IS NULL OR batch_id = %s", (batch_id, batch_id))
    assert row is not None
    return int(row["n"])


async def test_every_kind_of_event_appears_once_in_order(world: World) -> None:
    await world.instance("i1")
    await world.instance("i2")
    created = await world.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, 3, n_job_groups=1)
    u, s, g = update["update_id"], update["start_job_id"], update["start_job_group_id"]
    await world.store.insert_job_groups(batch_id, u, [{"job_group_id": g, "parent_id": 0}])
    await world.store.insert_jobs(batch_id, u, [
        job_spec(s), job_spec(s + 1, parents=[{"in_update_offset": -1}]), job_spec(s + 2, job_group_id=g)])
    await world.store.commit_update(batch_id, u)

    first = await world.run(batch_id, s)
    await world.store.add_attempt_resources(world.epoch, [
        {"batch_id": batch_id, "job_id": s, "attempt_id": first, "resource": "cpu/local/1", "quantity": 1000}])
    world.clock.advance(60_000)
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": s, "attempt_id": first, "rollup_time_ms": world.clock()}])
    assert (await world.store.publish_batch_events(world.epoch, 1000, 5_000))["n_cost_events"] == 1
    assert await world.finish(batch_id, s, first, "Success") == "completed"  # child s+1 becomes Ready
    await world.store.cancel_job_group(batch_id, g, "alice", "not needed")
    await world.store.cancel_job_group(batch_id, g, "bob", "again")  # a repeat: no event
    assert await world.drain(batch_id) == 1  # s+2: Ready -> Cancelled
    lost = await world.run(batch_id, s + 1, "i2")
    await world.store.deactivate_instance(world.epoch, "i2", "missed heartbeats")  # Running -> Ready
    second = await world.run(batch_id, s + 1, "i1")
    assert await world.finish(batch_id, s + 1, second, "Failed") == "completed"

    await publish_all(world)
    cost = await world.db.fetchone("SELECT cost_usd FROM batch_cost WHERE batch_id = %s", (batch_id,))
    cost_micro_usd = round(cost["cost_usd"] * 1_000_000)
    assert cost_micro_usd > 0
    published = await events(world, batch_id)
    assert [e["event_id"] for e in published] == list(range(1, len(published) + 1))
    assert [summary(e) for e in published] == [
        ("update_committed", u, s, 3),
        ("job_state_changed", s, "Ready", "Running", first, None),
        ("cost_accrued", cost_micro_usd, cost_micro_usd),
        ("job_state_changed", s, "Running", "Success", first, 0),
        ("job_state_changed", s + 1, "Pending", "Ready", None, None),
        ("cancelled", g, "alice", "not needed"),
        ("job_state_changed", s + 2, "Ready", "Cancelled", None, None),
        ("job_state_changed", s + 1, "Ready", "Running", lost, None),
        ("job_state_changed", s + 1, "Running", "Ready", lost, None),
        ("job_state_changed", s + 1, "Ready", "Running", second, None),
        ("job_state_changed", s + 1, "Running", "Failed", second, 1),
        ("batch_completed", 3, 1, 1, 0, 1, False),
    ]
    assert published[-1]["cost_micro_usd"] == cost_micro_usd  # nothing was billed after the rollup
    sequence = await world.db.fetchone("SELECT * FROM batch_event_sequences WHERE batch_id = %s", (batch_id,))
    assert sequence["last_event_id"] == len(published)
    assert await outbox_count(world) == 0
    assert await check_invariants(world.db) == []


async def test_cost_events_only_when_cost_grew_and_not_too_often(world: World) -> None:
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await world.run(batch_id, job_id)
    await world.store.add_attempt_resources(world.epoch, [
        {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "resource": "cpu/local/1", "quantity": 1000}])

    async def rollup(advance_ms: int) -> None:
        world.clock.advance(advance_ms)
        await world.store.heartbeat_rollup(world.epoch, "i1", [
            {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "rollup_time_ms": world.clock()}])

    async def cost_events() -> int:
        return int((await world.store.publish_batch_events(world.epoch, 1000, 10_000))["n_cost_events"])

    assert await cost_events() == 0  # nothing billed yet
    await rollup(20_000)
    assert await cost_events() == 1
    await rollup(1_000)
    assert await cost_events() == 0  # grew, but within 10 s of the last one
    world.clock.advance(10_000)
    assert await cost_events() == 1
    assert await cost_events() == 0  # did not grow
    costs = [e for e in await events(world, batch_id) if e["kind"] == "cost_accrued"]
    assert costs[1]["cost_micro_usd"] - costs[0]["cost_micro_usd"] == costs[1]["delta_micro_usd"] > 0
    assert await check_invariants(world.db) == []


async def test_a_commit_writes_one_event_not_one_per_job(world: World) -> None:
    n = 1500
    created = await world.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, n)
    u, s = update["update_id"], update["start_job_id"]
    for first in range(0, n, 500):
        await world.store.insert_jobs(batch_id, u, [job_spec(s + i) for i in range(first, first + 500)])
    await world.store.commit_update(batch_id, u)
    await world.store.commit_update(batch_id, u)  # a repeat: no second event
    ready = await world.db.fetchone("SELECT COUNT(*) AS n FROM jobs WHERE batch_id = %s AND state = 'Ready'",
                                    (batch_id,))
    assert ready["n"] == n
    assert await outbox_count(world, batch_id) == 1
    await publish_all(world)
    assert [summary(e) for e in await events(world, batch_id)] == [("update_committed", u, s, n)]
    assert await check_invariants(world.db) == []


N_JOBS = 600
N_CONNECTIONS = 32


async def test_32_connections_completing_one_batch_while_publishing(world: World) -> None:
    for i in range(4):
        await world.instance(f"i{i}")
    batch_id, _, s = await world.batch([{} for _ in range(N_JOBS)])
    queue: asyncio.Queue[int] = asyncio.Queue()
    todo = list(range(s, s + N_JOBS))
    random.Random(3).shuffle(todo)
    for job_id in todo:
        queue.put_nowait(job_id)
    done = asyncio.Event()
    published_while_running = 0

    async def worker(index: int) -> None:
        rng = random.Random(index)
        instance = f"i{index % 4}"
        while not queue.empty():
            chunk = [queue.get_nowait() for _ in range(min(rng.randint(1, 4), queue.qsize()))]
            attempts = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"w{index}-{j}"} for j in chunk]
            scheduled = await world.store.schedule_jobs(world.epoch, instance, attempts)
            assert {r["outcome"] for r in scheduled} == {"scheduled"}
            outcomes = await world.store.mark_jobs_complete(world.epoch, instance, [
                {**a, "state": "Success" if a["job_id"] % 7 else "Failed", "exit_code": 0 if a["job_id"] % 7 else 3}
                for a in attempts])
            assert {r["outcome"] for r in outcomes} <= {"completed", "already_complete"}

    async def publisher() -> None:
        nonlocal published_while_running
        while not done.is_set():
            status = await world.store.publish_batch_events(world.epoch, 50)
            published_while_running += int(status["n_published"])
            await asyncio.sleep(0)  # yield to the workers; no waiting on time

    publishing = asyncio.create_task(publisher())
    await asyncio.gather(*(worker(i) for i in range(N_CONNECTIONS)))
    done.set()
    await publishing
    await publish_all(world)
    assert published_while_running > 0

    published = await events(world, batch_id)
    assert [e["event_id"] for e in published] == list(range(1, 2 * N_JOBS + 3))
    assert published[0]["kind"] == "update_committed"
    assert published[-1]["kind"] == "batch_completed"
    by_job: dict[int, list[dict[str, Any]]] = {}
    for event in published[1:-1]:
        assert event["kind"] == "job_state_changed"
        by_job.setdefault(event["job_id"], []).append(event)
    assert sorted(by_job) == list(range(s, s + N_JOBS))
    for job_id, changes in by_job.items():
        # Causal order: each change starts where the previous one ended.
        assert [(c["old_state"], c["new_state"]) for c in changes] == [
            ("Ready", "Running"), ("Running", "Success" if job_id % 7 else "Failed")], job_id
    n_failed = sum(1 for job_id in range(s, s + N_JOBS) if job_id % 7 == 0)
    assert summary(published[-1]) == ("batch_completed", N_JOBS, N_JOBS - n_failed, n_failed, 0, 0, False)
    assert await check_invariants(world.db) == []


async def _poll(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_an_open_transaction_is_skipped_and_published_later(world: World) -> None:
    """MariaDB 10.11 honours SKIP LOCKED in publish_batch_events: the row of a
    producer still in its transaction is passed over, never waited for and
    never lost."""
    await world.instance()
    batch_a, _, job_a = await world.batch([{}])
    created = await world.store.create_batch("alice", "proj")
    batch_b = int(created["batch_id"])
    update_b = await world.store.create_update(batch_b, 1)
    await world.store.insert_jobs(batch_b, update_b["update_id"], [job_spec(update_b["start_job_id"])])
    await publish_all(world)

    # Hold batch B's root group: commit_update appends its event, then waits
    # for this lock with its transaction (and outbox row) open.
    blocker = await aiomysql.connect(**world.db.config.connect_kwargs())
    observer = await aiomysql.connect(**world.db.config.connect_kwargs())
    try:
        async with blocker.cursor() as cursor:
            await cursor.execute("START TRANSACTION")
            await cursor.execute("SELECT * FROM job_groups WHERE batch_id = %s AND job_group_id = 0 FOR UPDATE",
                                 (batch_b,))
        committing = asyncio.create_task(world.store.commit_update(batch_b, update_b["update_id"]))

        async with observer.cursor(aiomysql.DictCursor) as cursor:
            # Dirty reads show the outbox as it is, open transactions included.
            await cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")

        async def outbox_rows() -> list[dict[str, Any]]:
            async with observer.cursor(aiomysql.DictCursor) as cursor:
                await cursor.execute("SELECT seq, batch_id FROM batch_event_outbox ORDER BY seq")
                return list(await cursor.fetchall())

        async def b_appended() -> bool:
            return any(row["batch_id"] == batch_b for row in await outbox_rows())

        await _poll(b_appended)
        # A later change of batch A commits while B's transaction is open.
        attempt = await world.run(batch_a, job_a)
        assert await world.finish(batch_a, job_a, attempt, "Success") == "completed"
        dirty = await outbox_rows()
        seq_b = [r["seq"] for r in dirty if r["batch_id"] == batch_b]
        seq_a = [r["seq"] for r in dirty if r["batch_id"] == batch_a]
        assert len(seq_b) == 1 and seq_a and seq_b[0] < min(seq_a)  # B's row is first in line

        status = await world.store.publish_batch_events(world.epoch, 100)
        assert int(status["n_published"]) == len(seq_a)  # A's rows, past B's locked one
        assert await events(world, batch_b) == []
        assert not committing.done()

        async with blocker.cursor() as cursor:
            await cursor.execute("COMMIT")
        await committing
    finally:
        blocker.close()
        observer.close()
    await publish_all(world)
    assert [summary(e) for e in await events(world, batch_b)] == [
        ("update_committed", update_b["update_id"], update_b["start_job_id"], 1)]
    assert [e["kind"] for e in await events(world, batch_a)] == [
        "update_committed", "job_state_changed", "job_state_changed", "batch_completed"]
    assert await check_invariants(world.db) == []


async def test_a_stale_epoch_publishes_nothing(world: World) -> None:
    batch_id, _, _ = await world.batch([{}, {}])
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")
    old_epoch = world.epoch
    new_epoch = await world.store.elect_leader("driver-1")
    with pytest.raises(StaleEpochError):
        await world.store.publish_batch_events(old_epoch, 100)
    assert await outbox_count(world, batch_id) == 2
    assert await events(world, batch_id) == []
    world.epoch = new_epoch
    assert await publish_all(world) == 2
    assert [e["kind"] for e in await events(world, batch_id)] == ["update_committed", "cancelled"]
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize("max_events, cost_interval_ms", [(0, None), (-5, None), (None, None), (10, -1)])
async def test_a_malformed_publish_is_refused_and_moves_nothing(world: World, max_events: Any,
                                                                cost_interval_ms: Any) -> None:
    batch_id, _, _ = await world.batch([{}])
    with pytest.raises(InvalidArgumentError):
        await world.store.publish_batch_events(world.epoch, max_events, cost_interval_ms)
    assert await outbox_count(world, batch_id) == 1
    assert await events(world, batch_id) == []


async def test_the_publisher_loop_drains_page_by_page_and_asks_for_costs_when_due(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}, {}])
    attempt = await world.run(batch_id, s)  # 1 commit + 1 start: 2 outbox rows
    await world.store.add_attempt_resources(world.epoch, [
        {"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "resource": "cpu/local/1", "quantity": 1000}])
    world.clock.advance(30_000)
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "rollup_time_ms": world.clock()}])
    await world.run(batch_id, s + 1)
    leading: list[int | None] = [None]
    publisher = EventPublisher(world.store, lambda: leading[0], page_size=2, cost_period_s=10.0,
                               clock_ms=world.clock)

    await publisher.cycle()  # not leading: nothing moves
    assert (publisher.published_total, await outbox_count(world)) == (0, 3)
    leading[0] = world.epoch
    await publisher.cycle()  # pages of 2 until a short one; the first cycle's cost pass is due
    assert (publisher.published_total, publisher.cost_events_total, await outbox_count(world)) == (3, 1, 0)
    world.clock.advance(30_000)
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "rollup_time_ms": world.clock()}])
    world.clock.advance(-25_000)  # only 5 s after the last cost pass: not due
    await publisher.cycle()
    assert publisher.cost_events_total == 1
    world.clock.advance(5_000)
    await publisher.cycle()
    assert publisher.cost_events_total == 2
    # The cost pass rides on the first page of its cycle.
    assert [e["kind"] for e in await events(world, batch_id)] == [
        "update_committed", "job_state_changed", "cost_accrued", "job_state_changed", "cost_accrued"]
    assert await check_invariants(world.db) == []
