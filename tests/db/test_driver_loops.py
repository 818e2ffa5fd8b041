"""Driver loops against a real MariaDB: leader election and the canceller."""

from __future__ import annotations

import asyncio

import pytest

from services.db.database import DatabaseConfig, StaleEpochError
from services.db.invariants import check_invariants
from services.db.store import JobStore
from services.driver.canceller import ReadyCanceller
from services.driver.leader import LeaderElection
from services.driver.loop import Loop
from tests.world import World, job_spec


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    """Poll until `predicate()` is true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_one_leader_and_a_standby_takes_over_with_a_new_epoch(db_config: DatabaseConfig, world: World) -> None:
    events: list[tuple[str, int | None]] = []

    def elected(name: str):
        async def callback(epoch: int) -> None:
            events.append((name, epoch))
        return callback

    def deposed(name: str):
        async def callback() -> None:
            events.append((name, None))
        return callback

    first = LeaderElection(db_config, world.store, "driver-a", poll_s=0.05)
    second = LeaderElection(db_config, world.store, "driver-b", poll_s=0.05)
    tasks = [asyncio.create_task(first.run(elected("a"), deposed("a")))]
    await eventually(lambda: first.is_leader)
    tasks.append(asyncio.create_task(second.run(elected("b"), deposed("b"))))
    await asyncio.sleep(0.3)
    assert (first.is_leader, second.is_leader) == (True, False)
    old_epoch = first.state.epoch
    assert old_epoch is not None

    # The leader's process dies: its connection goes, and with it the lock.
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    await eventually(lambda: second.is_leader)
    assert second.state.epoch == old_epoch + 1
    # A write fenced with the old epoch is refused.
    with pytest.raises(StaleEpochError):
        await world.store.create_instance(old_epoch, "i9", "standard", 1000, "t")
    await world.store.create_instance(second.state.epoch, "i9", "standard", 1000, "t")
    assert events == [("a", old_epoch), ("b", old_epoch + 1)]
    tasks[1].cancel()
    await asyncio.gather(tasks[1], return_exceptions=True)


async def test_resigning_hands_over_at_once(db_config: DatabaseConfig, world: World) -> None:
    async def nothing(*args: object) -> None:
        return None

    first = LeaderElection(db_config, world.store, "driver-a", poll_s=0.05)
    second = LeaderElection(db_config, world.store, "driver-b", poll_s=0.05)
    tasks = [asyncio.create_task(first.run(nothing, nothing))]
    await eventually(lambda: first.is_leader)
    tasks.append(asyncio.create_task(second.run(nothing, nothing)))
    tasks[0].cancel()
    await asyncio.gather(tasks[0], return_exceptions=True)
    await first.resign()
    await eventually(lambda: second.is_leader, timeout_s=2)
    tasks[1].cancel()
    await asyncio.gather(tasks[1], return_exceptions=True)


class Flaky(Loop):
    name = "flaky"

    def __init__(self) -> None:
        super().__init__(period_s=0.01, max_backoff_s=0.05)
        self.calls = 0

    async def cycle(self) -> None:
        self.calls += 1
        if self.calls <= 2:
            raise RuntimeError("boom")


async def test_a_failing_cycle_is_logged_and_the_loop_goes_on() -> None:
    loop = Flaky()
    task = asyncio.create_task(loop.run())
    await loop.wait_cycles(4)
    assert loop.calls >= 4 and loop.failures == 0
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_canceller_drains_fairly_and_completes_the_batches(world: World) -> None:
    await world.store.create_billing_project("other", ["carol"])
    batches = []
    for user, project, n_jobs in (("alice", "proj", 700), ("carol", "other", 50)):
        created = await world.store.create_batch(user, project)
        update = await world.store.create_update(created["batch_id"], n_jobs)
        s = update["start_job_id"]
        # A chain at the end: its links become drainable one level per cycle.
        jobs = [job_spec(s + i) for i in range(n_jobs - 3)]
        jobs += [job_spec(s + i, parents=[{"in_update_offset": -1}]) for i in range(n_jobs - 3, n_jobs)]
        await world.store.insert_jobs(created["batch_id"], update["update_id"], jobs)
        await world.store.commit_update(created["batch_id"], update["update_id"])
        await world.store.cancel_job_group(created["batch_id"], 0, user, "stop")
        batches.append(created["batch_id"])

    canceller = ReadyCanceller(world.db, JobStore(world.db, world.clock), lambda: world.epoch, period_s=60)
    first = {r["user"]: int(r["n"]) for r in await canceller.drainable()}
    assert first == {"alice": 697, "carol": 47}
    await canceller.cycle()
    after = {r["user"]: int(r["n"]) for r in await canceller.drainable()}
    # One cycle: 300 jobs in all, and carol gets at least her minimum of 20
    # although alice has 15 times more to drain.
    assert canceller.cancelled_total == 300
    carol_cancelled = first["carol"] - after.get("carol", 0)
    assert carol_cancelled >= 20
    assert first["alice"] - after["alice"] == 300 - carol_cancelled

    task = asyncio.create_task(canceller.run())
    try:
        await eventually(lambda: canceller.cancelled_total == 750, timeout_s=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for batch_id in batches:
        row = await world.db.fetchone("SELECT state FROM batches WHERE batch_id = %s", (batch_id,))
        assert row["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_canceller_does_nothing_without_an_epoch(world: World) -> None:
    batch_id, _, _ = await world.batch([{}, {}])
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")
    canceller = ReadyCanceller(world.db, world.store, lambda: None)
    await canceller.cycle()
    assert canceller.cancelled_total == 0
    assert [r["n"] for r in await canceller.drainable()] == [2]
