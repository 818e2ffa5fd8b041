"""Driver loops against a real MariaDB: the Ready canceller and the canceller of
Creating and Running jobs (leader election: test_leader_election.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from corral.driver.v1 import driver_service_pb2 as pb
from services.db.invariants import check_invariants
from services.driver.store import DriverStore
from services.driver.canceller import ReadyCanceller
from services.driver.loop import Loop
from services.driver.running_canceller import RunningCanceller
from services.driver.sessions import Session, SessionRegistry
from services.common.specs import SpecStore
from tests.world import World, job_spec


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    """Poll until `predicate()` is true."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


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
        # A chain at the end: its Pending links are drained by the pending pass.
        jobs = [job_spec(s + i) for i in range(n_jobs - 3)]
        jobs += [job_spec(s + i, parents=[{"in_update_offset": -1}]) for i in range(n_jobs - 3, n_jobs)]
        await world.store.insert_jobs(created["batch_id"], update["update_id"], jobs)
        await world.store.commit_update(created["batch_id"], update["update_id"])
        await world.store.cancel_job_group(created["batch_id"], 0, user, "stop")
        batches.append(created["batch_id"])

    # A small share (the default is 5,000), so that one cycle cannot drain everything.
    canceller = ReadyCanceller(DriverStore(world.db, world.clock), lambda: world.epoch, period_s=60,
                               per_cycle=300, minimum_per_user=20)
    first = {r.user: r.n for r in await canceller.drainable()}
    assert first == {"alice": 697, "carol": 47}
    assert {r.user: r.n for r in await canceller.pending_drainable()} == {"alice": 3, "carol": 3}
    await canceller.cycle()
    after = {r.user: r.n for r in await canceller.drainable()}
    # One cycle: 300 Ready jobs in all, and carol gets at least her minimum
    # of 20 although alice has 15 times more to drain; and both chains' three
    # Pending links, which never wait for their parents in a cancelled batch.
    assert canceller.cancelled_total == 300 + 2 * 3
    assert await canceller.pending_drainable() == []
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
    canceller = ReadyCanceller(world.store, lambda: None)
    await canceller.cycle()
    assert canceller.cancelled_total == 0
    assert [r.n for r in await canceller.drainable()] == [2]


def cancel_commands(session: Session) -> list[tuple[int, int, str]]:
    """The CancelJob commands queued for a worker so far: (batch, job, attempt)."""
    found = []
    while not session.commands.empty():
        command: pb.WorkerSessionResponse = session.commands.get_nowait()
        if command.WhichOneof("payload") == "cancel_job":
            a = command.cancel_job.attempt
            found.append((a.batch_id, a.job_id, a.attempt_id))
    return found


@pytest.fixture
def registry(world: World, tmp_path: Path) -> SessionRegistry:
    """The driver's real session registry; tests open sessions on it as workers would."""
    return SessionRegistry(world.store, SpecStore(f"file://{tmp_path / 'blobs'}"), world.clock)


async def test_running_jobs_get_cancel_job_and_creating_jobs_are_closed(world: World,
                                                                       registry: SessionRegistry) -> None:
    await world.instance("i1")
    await world.instance("i2")
    await world.store.create_instance(world.epoch, "p1", "job-private", 1000, "tok-p1")  # still booting
    batch_id, _, s = await world.batch([{}, {}, {}, {"always_run": True}, {}, {"inst_coll": "job-private"}, {}])
    on_i1 = {j: await world.run(batch_id, j) for j in (s, s + 1, s + 2, s + 3)}
    await world.run(batch_id, s + 4, "i2")
    creating = await world.store.schedule_jobs(world.epoch, "p1",
                                               [{"batch_id": batch_id, "job_id": s + 5, "attempt_id": "c1"}])
    assert creating[0]["outcome"] == "creating"
    i1 = registry.open("i1")  # i2's worker has no session with this driver
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")

    canceller = RunningCanceller(world.store, registry, lambda: world.epoch, clock_ms=world.clock)
    assert [(r.user, r.n) for r in await canceller.drainable()] == [("alice", 5)]
    await canceller.cycle()
    # Every running cancellable job on a connected worker is asked to stop;
    # the always_run job is not, nor the job whose worker is gone.
    assert sorted(cancel_commands(i1)) == [(batch_id, j, on_i1[j]) for j in (s, s + 1, s + 2)]
    assert await world.state(batch_id, s + 5) == "Cancelled"
    assert (await world.db.fetchone("SELECT free_cores_mcpu FROM instances WHERE name = 'p1'"))[
        "free_cores_mcpu"] == 1000
    assert (canceller.closed_total, canceller.stop_requests_total) == (1, 3)

    # Asked once: the next cycles send nothing until the resend interval passed.
    await canceller.cycle()
    await canceller.cycle()
    assert cancel_commands(i1) == []
    world.clock.advance(61_000)
    await canceller.cycle()
    assert len(cancel_commands(i1)) == 3

    # The worker stops them and reports Cancelled (MJC); i2 is found dead and
    # its job goes back to Ready, where the Ready canceller takes it.
    for j in (s, s + 1, s + 2):
        assert await world.finish(batch_id, j, on_i1[j], "Cancelled") == "completed"
    await world.store.deactivate_instance(world.epoch, "i2", "missed heartbeats")
    assert await world.state(batch_id, s + 4) == "Ready"
    assert await world.drain(batch_id) == 2  # s + 4 and the Ready s + 6
    await world.finish(batch_id, s + 3, on_i1[s + 3], "Success")
    assert [r.n for r in await canceller.drainable()] == []
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_running_canceller_shares_fairly_and_covers_big_batches_over_cycles(
        world: World, registry: SessionRegistry) -> None:
    await world.store.create_billing_project("other", ["carol"])
    await world.instance("i1")
    session = registry.open("i1")
    attempts: dict[tuple[int, int], str] = {}
    batches = {}
    for user, project, n in (("alice", "proj", 30), ("carol", "other", 3)):
        created = await world.store.create_batch(user, project)
        batch_id = int(created["batch_id"])
        update = await world.store.create_update(batch_id, n)
        start = int(update["start_job_id"])
        await world.store.insert_jobs(batch_id, update["update_id"], [job_spec(start + i) for i in range(n)])
        await world.store.commit_update(batch_id, update["update_id"])
        for j in range(start, start + n):
            attempts[(batch_id, j)] = await world.run(batch_id, j)
        await world.store.cancel_job_group(batch_id, 0, user, "stop")
        batches[user] = batch_id

    canceller = RunningCanceller(world.store, registry, lambda: world.epoch, per_cycle=12,
                                 minimum_per_user=5, clock_ms=world.clock)
    await canceller.cycle()
    first = cancel_commands(session)
    # carol's 3 fit in her minimum; alice gets the rest of the 12.
    assert sum(1 for b, _, _ in first if b == batches["carol"]) == 3
    assert sum(1 for b, _, _ in first if b == batches["alice"]) == 9
    sent = list(first)
    for _ in range(5):
        await canceller.cycle()
        sent += cancel_commands(session)
    # Each attempt asked exactly once, alice's 30 over several cycles.
    assert sorted(sent) == sorted((b, j, a) for (b, j), a in attempts.items())
    for (b, j), a in attempts.items():
        await world.finish(b, j, a, "Cancelled")
    assert {(await world.batch_row(b))["state"] for b in batches.values()} == {"complete"}
    assert await check_invariants(world.db) == []


async def test_running_canceller_does_nothing_without_an_epoch(world: World, registry: SessionRegistry) -> None:
    await world.instance("i1")
    batch_id, _, s = await world.batch([{}])
    await world.run(batch_id, s)
    session = registry.open("i1")
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")
    canceller = RunningCanceller(world.store, registry, lambda: None, clock_ms=world.clock)
    await canceller.cycle()
    assert cancel_commands(session) == []
    assert await check_invariants(world.db) == []


async def test_a_cancelled_100k_job_batch_with_running_jobs_drains_to_complete(
        world: World, registry: SessionRegistry) -> None:
    n_jobs, n_running, bunch = 100_000, 20, 5_000
    await world.instance("i1")
    created = await world.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await world.store.create_update(batch_id, n_jobs)
    start = int(update["start_job_id"])
    for first in range(0, n_jobs, bunch):
        await world.store.insert_jobs(batch_id, update["update_id"],
                                      [job_spec(start + i) for i in range(first, min(n_jobs, first + bunch))])
    await world.store.commit_update(batch_id, update["update_id"])
    for j in range(start, start + n_running):
        await world.run(batch_id, j)
    session = registry.open("i1")
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")

    async def worker() -> None:
        """Stops what it is told to and reports it, as a real worker does."""
        while True:
            command = await session.commands.get()
            if command.WhichOneof("payload") == "cancel_job":
                a = command.cancel_job.attempt
                await world.finish(a.batch_id, a.job_id, a.attempt_id, "Cancelled")

    # A large share per cycle keeps the test short; the drain is the same
    # set-based procedure whatever the share.
    ready = ReadyCanceller(world.store, lambda: world.epoch, period_s=0.05, per_cycle=10_000)
    running = RunningCanceller(world.store, registry, lambda: world.epoch, period_s=0.05,
                               clock_ms=world.clock)
    tasks = [asyncio.create_task(t) for t in (ready.run(), running.run(), worker())]
    try:
        async def complete() -> bool:
            return (await world.batch_row(batch_id))["state"] == "complete"

        deadline = asyncio.get_running_loop().time() + 45
        while not await complete():
            assert asyncio.get_running_loop().time() < deadline, "the batch did not drain in time"
            await asyncio.sleep(0.1)
        # The batch is complete once the last cancelling call commits, which this test can see before the
        # loop that made the call has counted what it returned.
        while (ready.cancelled_total, running.stop_requests_total) != (n_jobs - n_running, n_running):
            assert asyncio.get_running_loop().time() < deadline, (ready.cancelled_total, running.stop_requests_total)
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    counts = await world.db.fetchone(
        "SELECT SUM(n_cancelled) AS n FROM job_groups_n_jobs_in_complete_states WHERE batch_id = %s "
        "AND job_group_id = 0", (batch_id,))
    assert int(counts["n"]) == n_jobs
    assert await check_invariants(world.db) == []
