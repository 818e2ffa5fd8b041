"""Dependencies: accepted parent states, always_run, relative parents,
parents in earlier updates, and the invisibility of uncommitted updates."""

from __future__ import annotations

import itertools

import pytest

from services.db.database import InvalidArgumentError
from services.db.invariants import check_invariants
from tests.world import World, job_spec

STATE_BITS = {"Success": 1, "Failed": 2, "Error": 4, "Cancelled": 8}
OUTCOMES = tuple(STATE_BITS)
ACCEPTED_SETS = [
    frozenset(subset)
    for n in range(1, len(OUTCOMES) + 1)
    for subset in itertools.combinations(OUTCOMES, n)
]


def bits(states: frozenset[str]) -> int:
    return sum(STATE_BITS[s] for s in states)


def expected_child_state(accepted: frozenset[str], parent_outcome: str, always_run: bool) -> str:
    """Design §3: Ready when the parent's final state is accepted; otherwise
    Cancelled, unless always_run (which runs regardless)."""
    return "Ready" if always_run or parent_outcome in accepted else "Cancelled"


async def test_every_accepted_subset_against_every_parent_outcome(world: World) -> None:
    """15 subsets x 4 outcomes x always_run: 120 parent/child pairs in one batch."""
    await world.instance()
    cases = list(itertools.product(ACCEPTED_SETS, OUTCOMES, (False, True)))
    jobs = []
    for accepted, _, always_run in cases:
        jobs.append({})
        jobs.append({"always_run": always_run, "parents": [{"in_update_offset": -1, "accepted_states": bits(accepted)}]})
    batch_id, _, start = await world.batch(jobs)

    for i, (_, outcome, _) in enumerate(cases):
        parent = start + 2 * i
        attempt = await world.run(batch_id, parent)
        assert await world.finish(batch_id, parent, attempt, outcome) == "completed"
    await world.drain(batch_id)

    for i, (accepted, outcome, always_run) in enumerate(cases):
        child = await world.job(batch_id, start + 2 * i + 1)
        want = expected_child_state(accepted, outcome, always_run)
        assert child["state"] == want, (sorted(accepted), outcome, always_run, child)
        # A cancelled child names the parent, how it ended and what the child accepts.
        runs_after = " or ".join(s.lower() for s in OUTCOMES if s in accepted)
        reason = (f"parent job {start + 2 * i} ended {outcome.lower()} and this job runs only after "
                  f"{runs_after}")
        assert child["end_reason"] == (reason if want == "Cancelled" else None)
        # ... and its event says so too (GetJob's error_message and WatchBatch's JobStateChanged.reason).
        events = await world.db.fetchall(
            "SELECT reason FROM batch_event_outbox WHERE batch_id = %s AND job_id = %s AND new_state = 'Cancelled' "
            "UNION ALL SELECT reason FROM batch_events WHERE batch_id = %s AND job_id = %s AND new_state = 'Cancelled'",
            (batch_id, child["job_id"], batch_id, child["job_id"]))
        assert [e["reason"] for e in events] == ([reason] if want == "Cancelled" else [])
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize("outcomes", list(itertools.product(OUTCOMES, repeat=2)))
async def test_every_parent_must_be_accepted(world: World, outcomes: tuple[str, str]) -> None:
    """Two parents accepting {Success, Failed}: the child runs only if both are."""
    await world.instance()
    accepted = bits(frozenset({"Success", "Failed"}))
    batch_id, _, start = await world.batch(
        [{}, {}, {"parents": [{"in_update_offset": -2, "accepted_states": accepted},
                              {"in_update_offset": -1, "accepted_states": accepted}]}]
    )
    for offset, outcome in enumerate(outcomes):
        attempt = await world.run(batch_id, start + offset)
        await world.finish(batch_id, start + offset, attempt, outcome)
        if offset == 0:
            assert await world.state(batch_id, start + 2) == "Pending"
    await world.drain(batch_id)
    ok = all(o in ("Success", "Failed") for o in outcomes)
    assert await world.state(batch_id, start + 2) == ("Ready" if ok else "Cancelled")
    assert await check_invariants(world.db) == []


async def test_cancellation_propagates_down_a_chain_and_always_run_cleanup_runs(world: World) -> None:
    await world.instance()
    # 1 -> 2 -> 3 -> 4, and an always_run cleanup 5 after 4.
    batch_id, _, s = await world.batch(
        [{}, {"parents": [{"in_update_offset": -1}]}, {"parents": [{"in_update_offset": -1}]},
         {"parents": [{"in_update_offset": -1}]}, {"always_run": True, "parents": [{"in_update_offset": -1}]}]
    )
    attempt = await world.run(batch_id, s)
    await world.finish(batch_id, s, attempt, "Failed")
    assert await world.drain(batch_id) == 3
    assert [await world.state(batch_id, s + i) for i in range(5)] == [
        "Failed", "Cancelled", "Cancelled", "Cancelled", "Ready"]
    cleanup = await world.run(batch_id, s + 4)
    await world.finish(batch_id, s + 4, cleanup, "Success")
    batch = await world.batch_row(batch_id)
    assert batch["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_relative_parents_resolve_against_the_job_even_with_bunches_out_of_order(world: World) -> None:
    await world.instance()
    created = await world.store.create_batch("alice", "proj")
    batch_id = created["batch_id"]
    update = await world.store.create_update(batch_id, 4)
    u, s = update["update_id"], update["start_job_id"]
    # Second bunch first: job s+3 names s+1 and s+2 relatively; s+2 names s.
    await world.store.insert_jobs(batch_id, u, [
        job_spec(s + 2, parents=[{"in_update_offset": -2}]),
        job_spec(s + 3, parents=[{"in_update_offset": -2}, {"in_update_offset": -1}]),
    ])
    await world.store.insert_jobs(batch_id, u, [job_spec(s), job_spec(s + 1)])
    await world.store.commit_update(batch_id, u)
    edges = await world.db.fetchall(
        "SELECT job_id, parent_id FROM job_parents WHERE batch_id = %s ORDER BY job_id, parent_id", (batch_id,))
    assert [(e["job_id"], e["parent_id"]) for e in edges] == [(s + 2, s), (s + 3, s + 1), (s + 3, s + 2)]
    assert [await world.state(batch_id, s + i) for i in range(4)] == ["Ready", "Ready", "Pending", "Pending"]
    assert (await world.job(batch_id, s + 3))["n_pending_parents"] == 2
    assert await check_invariants(world.db) == []


async def test_jobs_of_an_uncommitted_update_are_invisible_until_commit(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}])
    # A second update whose job depends on job s of the first.
    update = await world.store.create_update(batch_id, 2)
    u2, s2 = update["update_id"], update["start_job_id"]
    await world.store.insert_jobs(batch_id, u2, [job_spec(s2), job_spec(s2 + 1, parents=[{"job_id": s}])])

    # Nothing of update 2 is counted or runnable.
    assert (await world.batch_row(batch_id))["n_jobs"] == 1
    result = await world.store.schedule_jobs(
        world.epoch, "i1", [{"batch_id": batch_id, "job_id": s2, "attempt_id": world.attempt_id()}])
    assert result[0]["outcome"] == "not_ready"
    # The parent finishes while the child's update is still open: the child
    # no longer waits, but stays Pending (invisible) until the commit.
    attempt = await world.run(batch_id, s)
    await world.finish(batch_id, s, attempt, "Success")
    child = await world.job(batch_id, s2 + 1)
    assert (child["state"], child["n_pending_parents"]) == ("Pending", 0)
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []

    await world.store.commit_update(batch_id, u2)
    assert [await world.state(batch_id, s2 + i) for i in range(2)] == ["Ready", "Ready"]
    batch = await world.batch_row(batch_id)
    assert (batch["n_jobs"], batch["state"]) == (3, "running")
    assert await check_invariants(world.db) == []


async def test_parent_completed_in_an_earlier_update_counts_at_insert(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {}])
    attempt = await world.run(batch_id, s)
    await world.finish(batch_id, s, attempt, "Failed")
    update = await world.store.create_update(batch_id, 3)
    u2, s2 = update["update_id"], update["start_job_id"]
    await world.store.insert_jobs(batch_id, u2, [
        job_spec(s2, parents=[{"job_id": s}]),  # Failed not accepted
        job_spec(s2 + 1, parents=[{"job_id": s, "accepted_states": 2}]),  # accepts Failed
        job_spec(s2 + 2, parents=[{"job_id": s}, {"job_id": s + 1}]),  # s+1 still Ready
    ])
    await world.store.commit_update(batch_id, u2)
    await world.drain(batch_id)
    assert await world.state(batch_id, s2) == "Cancelled"
    assert await world.state(batch_id, s2 + 1) == "Ready"
    third = await world.job(batch_id, s2 + 2)
    assert (third["state"], third["n_pending_parents"], third["dependency_failed"]) == ("Pending", 1, 1)
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize(
    "parents, message",
    [
        ([{"job_id": 6}], "smaller"),  # the job's own id (it is job 6)
        ([{"in_update_offset": 0}], "negative"),
        ([{"in_update_offset": -3}], "before the start"),  # job 3: committed, but outside the update
        ([{"job_id": 1, "in_update_offset": -1}], "exactly one"),
        ([{"job_id": 1, "accepted_states": 16}], "1..15"),
        ([{"job_id": 1}, {"job_id": 1}], "twice"),
        ([{"job_id": 4}], "committed job"),  # exists only in another, uncommitted update
    ],
)
async def test_bad_parents_are_refused_and_nothing_is_written(world: World, parents: list, message: str) -> None:
    batch_id, _, _ = await world.batch([{}, {}, {}])  # jobs 1..3, committed
    await world.store.create_update(batch_id, 1)  # reserves job 4, never committed
    update = await world.store.create_update(batch_id, 2)
    u, s = update["update_id"], update["start_job_id"]
    assert s == 5
    with pytest.raises(InvalidArgumentError, match=message):
        await world.store.insert_jobs(batch_id, u, [job_spec(s), job_spec(s + 1, parents=parents)])
    assert await world.db.fetchall("SELECT * FROM jobs WHERE batch_id = %s AND job_id >= 4", (batch_id,)) == []
    assert await world.db.fetchall("SELECT * FROM job_parents WHERE batch_id = %s", (batch_id,)) == []


async def test_only_the_last_job_of_a_bunch_has_lists_and_every_list_is_stored(world: World) -> None:
    """insert_jobs reads a list (regions, parents, attributes, locks) only when a job of the bunch has one: a
    bunch whose last job alone has them stores them all, and a job that leaves keys out gets their defaults."""
    batch_id = int((await world.store.create_batch("alice", "proj"))["batch_id"])
    update = await world.store.create_update(batch_id, 3)
    start = int(update["start_job_id"])
    await world.store.insert_jobs(batch_id, update["update_id"], [
        {"job_id": start, "cores_mcpu": 1000, "inst_coll": "standard"},
        job_spec(start + 1),
        job_spec(start + 2, regions=["local"], parents=[{"in_update_offset": -2, "accepted_states": 3}],
                 attributes=[{"key": "name", "value": "last"}], locks=[{"level": "node", "mode": "all_shared"}])])
    await world.store.commit_update(batch_id, update["update_id"])
    jobs = {r["job_id"]: r for r in await world.db.fetchall(
        "SELECT job_id, state, job_group_id, always_run, priority, max_attempts, timeout_ms, retry_policy, "
        "on_demand, memory_bytes, storage_bytes, regions_bits, n_pending_parents FROM jobs WHERE batch_id = %s",
        (batch_id,))}
    assert jobs[start] == {"job_id": start, "state": "Ready", "job_group_id": 0, "always_run": 0, "priority": 0,
                           "max_attempts": 3, "timeout_ms": None, "retry_policy": None, "on_demand": 0,
                           "memory_bytes": 0, "storage_bytes": 0, "regions_bits": None, "n_pending_parents": 0}
    assert (jobs[start + 2]["state"], jobs[start + 2]["regions_bits"], jobs[start + 2]["n_pending_parents"]) == \
        ("Pending", 1, 1)
    assert await world.db.fetchall("SELECT job_id, parent_id, accepted_states FROM job_parents WHERE batch_id = %s",
                                   (batch_id,)) == [{"job_id": start + 2, "parent_id": start, "accepted_states": 3}]
    assert await world.db.fetchall("SELECT job_id, `key`, `value` FROM job_attributes WHERE batch_id = %s",
                                   (batch_id,)) == [{"job_id": start + 2, "key": "name", "value": "last"}]
    assert await world.db.fetchall("SELECT job_id, level, mode FROM job_locks WHERE batch_id = %s", (batch_id,)) == \
        [{"job_id": start + 2, "level": "node", "mode": "all_shared"}]
    assert await check_invariants(world.db) == []
