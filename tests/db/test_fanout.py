"""Large fan-out: a completed parent's children are released in bounded chunks.

MJC (and the cancellers' drains) release at most `max_children` children of
the jobs they complete and queue the rest in job_child_releases; the
releaser (release_children) goes on in chunks. Here the chunks are tiny, so
every path crosses several of them: children made Ready, children with a
failed dependency, always_run children, children of several parents, jobs
added behind a queued release, repeats, and a failover in the middle. The
invariant checker, which counts an edge as pending until its release has
passed the child, is clean after every step. The counters and events the
procedures write themselves equal the triggers' (the twin-batch replay of
test_setbased.py), for releases and for the drain of Pending jobs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiomysql
import pytest

from services.db.database import InvalidArgumentError, StaleEpochError
from services.db.invariants import check_invariants
from services.driver.releaser import ChildReleaser
from tests.db.test_cancel import handler_counts
from tests.db.test_setbased import Twin, counters, job_events, replay
from tests.world import World, job_spec


async def fan_out(world: World, children: list[dict[str, Any]], parents: int = 1,
                  groups: list[dict[str, Any]] | None = None) -> tuple[int, list[int], list[int]]:
    """A committed batch: `parents` parent jobs, then one child per entry of
    `children` (job_spec overrides, and `accepted_states` for its edges),
    each depending on every parent. Returns (batch_id, parent ids, child ids)."""
    jobs: list[dict[str, Any]] = [{} for _ in range(parents)]
    for child in children:
        child = dict(child)
        accepted = child.pop("accepted_states", 1)
        edges = [{"in_update_offset": -(len(jobs) - p), "accepted_states": accepted} for p in range(parents)]
        jobs.append({"parents": edges, **child})
    batch_id, _, s = await world.batch(jobs, groups=groups)
    return batch_id, list(range(s, s + parents)), list(range(s + parents, s + len(jobs)))


async def states(world: World, batch_id: int, job_ids: list[int]) -> list[str]:
    return [await world.state(batch_id, j) for j in job_ids]


async def queue(world: World, batch_id: int) -> dict[int, int]:
    rows = await world.db.fetchall(
        "SELECT parent_id, next_child_id FROM job_child_releases WHERE batch_id = %s", (batch_id,))
    return {r["parent_id"]: r["next_child_id"] for r in rows}


async def complete(world: World, batch_id: int, job_id: int, state: str, max_children: int) -> str:
    """Run the job and report it final, releasing at most `max_children` children inline."""
    attempt = await world.run(batch_id, job_id)
    outcomes = await world.store.mark_jobs_complete(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "state": state,
                             "exit_code": 0 if state == "Success" else 1}], max_children=max_children)
    return outcomes[0]["outcome"]


async def release_all(world: World, max_children: int, max_parents: int = 100, check: bool = True) -> list[int]:
    """Call the releaser until its queue is empty, checking invariants after
    each call; returns the children released by each call."""
    chunks = []
    while True:
        status = await world.store.release_children(world.epoch, max_children, max_parents)
        if not status["n_parents"]:
            return chunks
        chunks.append(int(status["n_children"]))
        if check:
            assert await check_invariants(world.db) == []


async def test_a_success_releases_a_few_children_inline_and_queues_the_rest(world: World) -> None:
    await world.instance()
    batch_id, [parent], children = await fan_out(world, [{} for _ in range(23)])
    assert await complete(world, batch_id, parent, "Success", max_children=4) == "completed"
    # The first four children by id are Ready; the others wait, counted as
    # pending until the releaser passes them.
    assert await states(world, batch_id, children) == ["Ready"] * 4 + ["Pending"] * 19
    assert await queue(world, batch_id) == {parent: children[4]}
    assert await check_invariants(world.db) == []

    # A repeated report changes nothing, in the jobs or in the queue.
    outcome = await world.store.mark_jobs_complete(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": parent, "attempt_id": "late", "state": "Failed"}],
        max_children=100)
    assert outcome[0]["outcome"] == "already_complete"
    assert await queue(world, batch_id) == {parent: children[4]}

    assert await release_all(world, max_children=7) == [7, 7, 5]
    assert await states(world, batch_id, children) == ["Ready"] * 23
    assert await queue(world, batch_id) == {}
    assert [int(r["n_pending_parents"]) for r in await world.db.fetchall(
        "SELECT n_pending_parents FROM jobs WHERE batch_id = %s AND job_id > %s", (batch_id, parent))] == [0] * 23
    # Nothing left: a further call does nothing.
    assert (await world.store.release_children(world.epoch, 7, 100))["n_parents"] == 0


async def test_a_failure_flags_children_and_always_run_ones_still_run(world: World) -> None:
    await world.instance()
    shapes: list[dict[str, Any]] = [{}, {"always_run": True}, {"accepted_states": 2}] * 4
    batch_id, [parent], children = await fan_out(world, shapes)
    assert await complete(world, batch_id, parent, "Failed", max_children=2) == "completed"
    assert await release_all(world, max_children=3) == [3, 3, 3, 1]
    jobs = [await world.job(batch_id, j) for j in children]
    assert {j["state"] for j in jobs} == {"Ready"}
    # Only the children that accept a failed parent have no failed dependency.
    assert [bool(j["dependency_failed"]) for j in jobs] == [True, True, False] * 4
    assert await check_invariants(world.db) == []

    # The canceller drains the flagged ones that are not always_run; the
    # always_run ones run (and the children accepting failure).
    assert await world.drain(batch_id) == 4
    for job_id, shape in zip(children, shapes):
        if shape != {}:
            assert await world.finish(batch_id, job_id, await world.run(batch_id, job_id), "Success") == "completed"
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_children_of_several_parents_wait_for_every_release(world: World) -> None:
    await world.instance()
    batch_id, parents, children = await fan_out(world, [{} for _ in range(10)], parents=3)
    # One parent's children all released inline, one's in chunks, one not
    # finished yet.
    assert await complete(world, batch_id, parents[0], "Success", max_children=100) == "completed"
    assert await complete(world, batch_id, parents[1], "Success", max_children=3) == "completed"
    assert await states(world, batch_id, children) == ["Pending"] * 10
    assert await check_invariants(world.db) == []
    assert await release_all(world, max_children=4) == [4, 3]
    assert [int((await world.job(batch_id, j))["n_pending_parents"]) for j in children] == [1] * 10
    # The last parent with a budget shared by nobody else: still chunked.
    assert await complete(world, batch_id, parents[2], "Success", max_children=5) == "completed"
    assert await states(world, batch_id, children) == ["Ready"] * 5 + ["Pending"] * 5
    assert await release_all(world, max_children=100) == [5]
    assert await states(world, batch_id, children) == ["Ready"] * 10


async def test_two_queued_parents_share_each_chunk(world: World) -> None:
    await world.instance()
    big, [big_parent], big_children = await fan_out(world, [{} for _ in range(20)])
    small, [small_parent], small_children = await fan_out(world, [{} for _ in range(4)])
    assert await complete(world, big, big_parent, "Success", max_children=0) == "completed"
    assert await complete(world, small, small_parent, "Success", max_children=0) == "completed"
    assert await queue(world, big) == {big_parent: big_children[0]}
    # Each call serves both parents, half the budget each: the small fan-out
    # is done after the first call, not after the big one.
    status = await world.store.release_children(world.epoch, 8, 10)
    assert (status["n_children"], status["n_parents"], status["n_finished"]) == (8, 2, 1)
    assert await states(world, small, small_children) == ["Ready"] * 4
    assert await release_all(world, max_children=8) == [8, 8]
    assert await states(world, big, big_children) == ["Ready"] * 20


async def test_a_stale_leader_is_refused_and_the_next_one_continues(world: World) -> None:
    await world.instance()
    batch_id, [parent], children = await fan_out(world, [{} for _ in range(12)])
    assert await complete(world, batch_id, parent, "Success", max_children=2) == "completed"
    await world.store.release_children(world.epoch, 3, 10)
    before = (await states(world, batch_id, children), await queue(world, batch_id))
    assert before == (["Ready"] * 5 + ["Pending"] * 7, {parent: children[5]})

    old_epoch = world.epoch
    world.epoch = await world.store.elect_leader("driver-1")
    with pytest.raises(StaleEpochError):
        await world.store.release_children(old_epoch, 3, 10)
    assert (await states(world, batch_id, children), await queue(world, batch_id)) == before
    assert await release_all(world, max_children=3) == [3, 3, 1]
    assert await states(world, batch_id, children) == ["Ready"] * 12
    assert await check_invariants(world.db) == []


async def test_jobs_added_behind_a_queued_release(world: World) -> None:
    """A final parent with a queued release counts as pending for a new child
    the release has not reached yet, and as released for one it has passed:
    either way the child's edge is counted once."""
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    parent = s
    behind = await world.store.create_update(batch_id, 1)  # ids below the next update's
    ahead = await world.store.create_update(batch_id, 6)
    a = int(ahead["start_job_id"])
    await world.store.insert_jobs(batch_id, ahead["update_id"],
                                  [job_spec(a + i, parents=[{"job_id": parent}]) for i in range(6)])
    await world.store.commit_update(batch_id, ahead["update_id"])
    assert await complete(world, batch_id, parent, "Success", max_children=2) == "completed"
    assert await queue(world, batch_id) == {parent: a + 2}

    # Below next_child_id: the release has passed it, the job starts with no
    # pending parent. Above every id: the release will reach it.
    b = int(behind["start_job_id"])
    await world.store.insert_jobs(batch_id, behind["update_id"], [job_spec(b, parents=[{"job_id": parent}])])
    later = await world.store.create_update(batch_id, 1)
    c = int(later["start_job_id"])
    await world.store.insert_jobs(batch_id, later["update_id"], [job_spec(c, parents=[{"job_id": parent}])])
    assert [int((await world.job(batch_id, j))["n_pending_parents"]) for j in (b, c)] == [0, 1]
    await world.store.commit_update(batch_id, behind["update_id"])
    await world.store.commit_update(batch_id, later["update_id"])
    assert await states(world, batch_id, [b, c]) == ["Ready", "Pending"]
    assert await check_invariants(world.db) == []
    assert await release_all(world, max_children=3) == [3, 2]
    assert await states(world, batch_id, [b, *range(a, a + 6), c]) == ["Ready"] * 8
    assert await check_invariants(world.db) == []


async def test_a_rerun_copy_behind_a_queued_release(world: World) -> None:
    """A copy of a failed child keeps its edge to the original parent, whose
    queued release reaches the copy too (copies get the highest ids)."""
    await world.instance()
    batch_id, [parent], children = await fan_out(world, [{} for _ in range(4)])
    assert await complete(world, batch_id, parent, "Success", max_children=1) == "completed"
    first = children[0]
    assert await world.finish(batch_id, first, await world.run(batch_id, first), "Failed") == "completed"
    update = await world.store.rerun_failed_jobs(batch_id, "again", 2)
    copy = int(update["start_job_id"])
    assert int((await world.job(batch_id, copy))["n_pending_parents"]) == 1
    await world.store.commit_update(batch_id, int(update["update_id"]))
    assert await world.state(batch_id, copy) == "Pending"
    assert await check_invariants(world.db) == []
    assert await release_all(world, max_children=10) == [4]
    assert await states(world, batch_id, [*children[1:], copy]) == ["Ready"] * 4
    assert await check_invariants(world.db) == []


async def test_cancelling_drains_pending_children_without_their_parent(world: World) -> None:
    await world.instance()
    shapes: list[dict[str, Any]] = [{}] * 8 + [{"always_run": True}]
    batch_id, [parent], children = await fan_out(world, shapes)
    attempt = await world.run(batch_id, parent)
    await world.store.cancel_job_group(batch_id, 0, "alice", "stop")
    # Chunks of three; the always_run child waits for its parent.
    assert [await world.store.cancel_pending_jobs(world.epoch, batch_id, 3) for _ in range(4)] == [3, 3, 2, 0]
    assert await states(world, batch_id, children) == ["Cancelled"] * 8 + ["Pending"]
    assert await world.state(batch_id, parent) == "Running"
    assert await check_invariants(world.db) == []

    # The parent is stopped: its release counts the cancelled children down
    # and readies the always_run one, which runs.
    assert await world.finish(batch_id, parent, attempt, "Cancelled") == "completed"
    assert await release_all(world, max_children=4) == []
    always = children[-1]
    job = await world.job(batch_id, always)
    assert (job["state"], bool(job["dependency_failed"])) == ("Ready", True)
    assert await world.finish(batch_id, always, await world.run(batch_id, always), "Success") == "completed"
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_the_pending_drain_leaves_uncommitted_and_uncancelled_jobs(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {"parents": [{"in_update_offset": -1}]},
                                        {"job_group_id": 1, "parents": [{"in_update_offset": -2}]}],
                                       groups=[{"job_group_id": 1, "parent_id": 0}])
    update = await world.store.create_update(batch_id, 1)
    t = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [job_spec(t, job_group_id=1, parents=[
        {"job_id": s}])])
    await world.store.cancel_job_group(batch_id, 1, "alice", "stop")
    assert await world.store.cancel_pending_jobs(world.epoch, batch_id, 100) == 1
    assert await states(world, batch_id, [s, s + 1, s + 2, t]) == ["Ready", "Pending", "Cancelled", "Pending"]
    assert await check_invariants(world.db) == []


async def test_a_pending_job_is_not_runnable_for_mjc(world: World) -> None:
    batch_id, _, s = await world.batch([{}, {"parents": [{"in_update_offset": -1}]}])
    outcomes = await world.store.mark_jobs_complete(world.epoch, None, [
        {"batch_id": batch_id, "job_id": s + 1, "state": "Cancelled"}])
    assert outcomes[0]["outcome"] == "not_runnable"
    with pytest.raises(InvalidArgumentError, match="max_children"):
        await world.store.mark_jobs_complete(world.epoch, None, [], max_children=-1)


async def test_released_counters_and_events_equal_the_triggers(world: World) -> None:
    """Twin batches: the releases, the Pending drain and the Ready drain on
    one, replayed as single-row UPDATEs on the other; same counters, same
    job events."""
    await world.instance()

    async def build() -> Twin:
        # 0 parent of 1-8; 9 parent of 10-13. Group g: 1-4 (2 always_run).
        group: list[dict[str, Any]] = [{"job_group_id": 1, "parent_id": 0}]
        jobs: list[dict[str, Any]] = [{}]
        jobs += [{"job_group_id": 1, "always_run": i in (1, 3), "parents": [{"in_update_offset": -(i + 1)}]}
                 for i in range(4)]
        jobs += [{"cores_mcpu": 250, "parents": [{"in_update_offset": -(i + 5)}]} for i in range(4)]
        jobs += [{"inst_coll": "highmem"}]
        jobs += [{"inst_coll": "highmem", "always_run": i == 0, "parents": [{"in_update_offset": -(i + 1)}]}
                 for i in range(4)]
        batch_id, _, s = await world.batch(jobs, groups=group)
        return Twin(batch_id, s, 1)

    bulk, reference = await build(), await build()
    b = bulk.batch_id

    async def agree() -> None:
        await replay(world, bulk, reference)
        assert await job_events(world, bulk) == await job_events(world, reference)
        assert await counters(world, bulk) == await counters(world, reference)

    world.clock.advance(1000)
    running = {o: await world.run(b, bulk.job(o)) for o in (0, 9)}
    await agree()
    await world.store.cancel_job_group(b, bulk.start_group_id, "alice", "stop")
    assert await world.store.cancel_pending_jobs(world.epoch, b, 1) == 1
    assert await world.store.cancel_pending_jobs(world.epoch, b, 100) == 1  # the always_run ones stay
    await agree()

    world.clock.advance(1000)
    for offset, state in ((0, "Success"), (9, "Failed")):
        outcomes = await world.store.mark_jobs_complete(world.epoch, "i1", [
            {"batch_id": b, "job_id": bulk.job(offset), "attempt_id": running[offset], "state": state,
             "exit_code": 0}], max_children=2)
        assert outcomes[0]["outcome"] == "completed"
        await agree()
    # Both parents share each chunk until 9's children run out. (The
    # reference's count-only changes come at the end: no invariants before.)
    assert await release_all(world, max_children=3, check=False) == [2, 2, 3, 1]
    await agree()
    assert await world.drain(b) == 3  # 10-13 but the always_run one: their parent failed
    await agree()
    assert (await world.state(b, bulk.job(10)), await world.state(b, bulk.job(11))) == ("Ready", "Cancelled")

    # The reference's children that changed only their counts (the cancelled
    # ones, released after their parent ended) get them too, so the
    # invariants hold for both batches.
    await world.db.execute(
        """UPDATE jobs r JOIN jobs k ON k.batch_id = %s AND k.job_id - %s = r.job_id - %s
           SET r.n_pending_parents = k.n_pending_parents, r.dependency_failed = k.dependency_failed
           WHERE r.batch_id = %s""", (b, bulk.start_job_id, reference.start_job_id, reference.batch_id))
    assert await check_invariants(world.db) == []


async def reads_of(world: World, sql: str, args: tuple[Any, ...]) -> int:
    """Index entries one procedure call reads (the server's handler counters), on one connection."""

    async def body(cursor: aiomysql.Cursor) -> int:
        await handler_counts(cursor)  # warm up: the first SHOW creates its own temporary tables
        before = await handler_counts(cursor)
        await cursor.execute(sql, args)
        while await cursor.nextset():
            pass
        after = await handler_counts(cursor)
        return sum(after[h] - before[h] for h in ("Handler_read_next", "Handler_read_prev", "Handler_read_rnd_next"))

    return await world.db.retrying("reads_of", body)


async def release_all_but(world: World, batch_id: int, parent: int, next_child_id: int) -> None:
    while (await queue(world, batch_id))[parent] < next_child_id:
        await world.store.release_children(world.epoch, 1000, 10)


async def test_each_chunk_reads_its_own_range_only(world: World) -> None:
    """Completing a parent of 6,000 children, and releasing a chunk deep in
    its children, each read about a chunk of index entries, not the whole
    fan-out (nor every child before the chunk)."""
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    update = await world.store.create_update(batch_id, 6000)
    t = int(update["start_job_id"])
    for first in range(0, 6000, 3000):
        await world.store.insert_jobs(batch_id, update["update_id"], [
            job_spec(t + i, parents=[{"job_id": s}]) for i in range(first, first + 3000)])
    await world.store.commit_update(batch_id, update["update_id"])
    attempt = await world.run(batch_id, s)
    done = json.dumps([{"batch_id": batch_id, "job_id": s, "attempt_id": attempt, "state": "Success"}])
    completing = await reads_of(world, "CALL mark_jobs_complete(%s, 'i1', %s, %s, 10)",
                                (world.epoch, done, world.clock()))
    assert await queue(world, batch_id) == {s: t + 10}
    early = await reads_of(world, "CALL release_children(%s, 100, 10, %s)", (world.epoch, world.clock()))
    await release_all_but(world, batch_id, s, t + 5000)
    at = (await queue(world, batch_id))[s]
    deep = await reads_of(world, "CALL release_children(%s, 100, 10, %s)", (world.epoch, world.clock()))
    print(f"\nindex entries read: completing the parent {completing}, a chunk of 100 at child 10 {early}, "
          f"at child {at - t:,} {deep}")
    # Reading the fan-out (or what precedes the chunk) would be 5,000 more.
    assert completing < 3000 and early < 3000 and abs(deep - early) < 100
    assert await queue(world, batch_id) == {s: at + 100}
    assert await check_invariants(world.db) == []


async def test_the_releaser_loop_drains_the_queue_and_wakes_the_others(world: World) -> None:
    await world.instance()
    batch_id, [parent], children = await fan_out(world, [{} for _ in range(30)])
    assert await complete(world, batch_id, parent, "Success", max_children=5) == "completed"
    woken = []
    idle = ChildReleaser(world.store, lambda: None, clock_ms=world.clock)
    await idle.cycle()  # not leading: nothing happens
    assert (idle.released_total, await queue(world, batch_id)) == (0, {parent: children[5]})

    releaser = ChildReleaser(world.store, lambda: world.epoch, period_s=60, per_call=10, clock_ms=world.clock,
                             on_released=lambda: woken.append(True))
    task = asyncio.create_task(releaser.run())
    try:
        # One cycle per chunk, each run at once after the last (the period is a minute).
        await releaser.wait_cycles(3, timeout_s=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (releaser.released_total, len(woken)) == (25, 3)
    assert await states(world, batch_id, children) == ["Ready"] * 30
    assert await check_invariants(world.db) == []
