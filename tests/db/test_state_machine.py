"""Every job transition, allowed and refused, as a table.

For each starting state we build a job in that state, apply one operation
through the stored procedures, and check the new state. A refused
operation must leave the job's row exactly as it was. Afterwards every
counter must agree with the base tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from services.db.database import FailedPreconditionError, InvalidArgumentError, NotFoundError
from services.db.invariants import check_invariants
from tests.world import World

FINAL = ("Success", "Failed", "Error", "Cancelled")


@dataclasses.dataclass
class Subject:
    """A job put into a known state, and what the operations need."""

    batch_id: int
    job_id: int
    attempt_id: str | None
    instance: str | None


async def _pending(world: World) -> Subject:
    batch_id, _, start = await world.batch([{}, {"parents": [{"in_update_offset": -1}]}])
    return Subject(batch_id, start + 1, None, None)


async def _ready(world: World) -> Subject:
    batch_id, _, start = await world.batch([{}])
    return Subject(batch_id, start, None, None)


async def _creating(world: World) -> Subject:
    # A job-private machine that has not booted yet: SJ makes the job Creating.
    await world.store.create_instance(world.epoch, "private-1", "job-private", 1000, "tok-private-1")
    subject = await _ready(world)
    attempt = world.attempt_id()
    result = await world.store.schedule_jobs(
        world.epoch, "private-1", [{"batch_id": subject.batch_id, "job_id": subject.job_id, "attempt_id": attempt}]
    )
    assert result[0]["outcome"] == "creating"
    return Subject(subject.batch_id, subject.job_id, attempt, "private-1")


async def _running(world: World) -> Subject:
    subject = await _ready(world)
    attempt = await world.run(subject.batch_id, subject.job_id)
    return Subject(subject.batch_id, subject.job_id, attempt, "i1")


def _final(state: str) -> Callable[[World], Awaitable[Subject]]:
    async def build(world: World) -> Subject:
        subject = await _running(world)
        assert await world.finish(subject.batch_id, subject.job_id, subject.attempt_id, state) == "completed"
        return subject

    return build


BUILDERS: dict[str, Callable[[World], Awaitable[Subject]]] = {
    "Pending": _pending,
    "Ready": _ready,
    "Creating": _creating,
    "Running": _running,
    **{state: _final(state) for state in FINAL},
}


# -- operations: each returns the procedure's outcome for the job ---------


async def schedule_new_attempt(world: World, s: Subject) -> str:
    result = await world.store.schedule_jobs(
        world.epoch, "i1", [{"batch_id": s.batch_id, "job_id": s.job_id, "attempt_id": world.attempt_id()}]
    )
    return result[0]["outcome"]


async def schedule_created_attempt(world: World, s: Subject) -> str:
    """The job-private machine booted: SJ again with the Creating attempt."""
    if s.instance == "private-1":
        await world.store.activate_instance(world.epoch, "private-1", "tok-private-1")
    result = await world.store.schedule_jobs(
        world.epoch, s.instance or "i1",
        [{"batch_id": s.batch_id, "job_id": s.job_id, "attempt_id": s.attempt_id or world.attempt_id()}],
    )
    return result[0]["outcome"]


def complete_with(state: str, with_attempt: bool = True) -> Callable[[World, Subject], Awaitable[str]]:
    async def op(world: World, s: Subject) -> str:
        attempt = s.attempt_id if with_attempt else None
        instance = s.instance if with_attempt else None
        return await world.finish(s.batch_id, s.job_id, attempt, state, instance=instance)

    op.__name__ = f"complete_{state.lower()}" + ("" if with_attempt else "_without_attempt")
    return op


async def cancel_batch_and_drain(world: World, s: Subject) -> str:
    await world.store.cancel_job_group(s.batch_id, 0, "alice", "test")
    return "drained" if await world.drain(s.batch_id) else "untouched"


async def deactivate_instance(world: World, s: Subject) -> str:
    status = await world.store.deactivate_instance(world.epoch, s.instance or "i1", "test")
    return "rescheduled" if status["n_rescheduled"] else "untouched"


async def stale_completion_then_success(world: World, s: Subject) -> str:
    """The worker was declared dead, then reports late: first completion wins."""
    await world.store.deactivate_instance(world.epoch, s.instance or "i1", "missed heartbeats")
    return await world.finish(s.batch_id, s.job_id, s.attempt_id, "Success", instance=s.instance)


# (starting state, operation, expected state afterwards or None if refused)
ALLOWED = [
    ("Ready", schedule_new_attempt, "Running"),
    ("Ready", complete_with("Cancelled", with_attempt=False), "Cancelled"),
    ("Ready", cancel_batch_and_drain, "Cancelled"),
    ("Creating", schedule_created_attempt, "Running"),
    ("Creating", deactivate_instance, "Ready"),
    ("Creating", complete_with("Cancelled"), "Cancelled"),
    ("Creating", complete_with("Error"), "Error"),
    ("Running", deactivate_instance, "Ready"),
    ("Running", stale_completion_then_success, "Success"),
    *[("Running", complete_with(state), state) for state in FINAL],
]

REFUSED = [
    ("Pending", schedule_new_attempt, "not_ready"),
    ("Pending", complete_with("Success", with_attempt=False), "not_runnable"),
    ("Pending", complete_with("Cancelled", with_attempt=False), "not_runnable"),
    ("Ready", complete_with("Success", with_attempt=False), "not_runnable"),
    ("Ready", complete_with("Running", with_attempt=False), "invalid_state"),
    ("Running", schedule_new_attempt, "not_ready"),
    ("Running", complete_with("Ready"), "invalid_state"),
    ("Running", complete_with("Pending"), "invalid_state"),
    ("Running", cancel_batch_and_drain, "untouched"),
    ("Pending", deactivate_instance, "untouched"),
    ("Ready", deactivate_instance, "untouched"),
    *[(state, schedule_new_attempt, "not_ready") for state in FINAL],
    *[(state, complete_with(other), "already_complete") for state in FINAL for other in FINAL],
    *[(state, cancel_batch_and_drain, "untouched") for state in FINAL],
    *[(state, deactivate_instance, "untouched") for state in FINAL],
]


def _case_id(case: tuple[str, Any, Any]) -> str:
    return f"{case[0]}-{case[1].__name__}"


@pytest.mark.parametrize("case", ALLOWED, ids=_case_id)
async def test_allowed_transition(world: World, case: tuple[str, Any, str]) -> None:
    start, operation, expected = case
    await world.instance()
    subject = await BUILDERS[start](world)
    assert await world.state(subject.batch_id, subject.job_id) == start
    await operation(world, subject)
    assert await world.state(subject.batch_id, subject.job_id) == expected
    assert await check_invariants(world.db) == []


@pytest.mark.parametrize("case", REFUSED, ids=_case_id)
async def test_refused_transition_leaves_row_unchanged(world: World, case: tuple[str, Any, str]) -> None:
    start, operation, expected_outcome = case
    await world.instance()
    subject = await BUILDERS[start](world)
    before = await world.job(subject.batch_id, subject.job_id)
    assert before["state"] == start
    assert await operation(world, subject) == expected_outcome
    assert await world.job(subject.batch_id, subject.job_id) == before
    assert await check_invariants(world.db) == []


async def test_pending_becomes_ready_when_its_parent_completes(world: World) -> None:
    await world.instance()
    subject = await _pending(world)
    attempt = await world.run(subject.batch_id, subject.job_id - 1)
    await world.finish(subject.batch_id, subject.job_id - 1, attempt, "Success")
    assert await world.state(subject.batch_id, subject.job_id) == "Ready"


async def test_schedule_on_inactive_instance_refuses_the_whole_call(world: World) -> None:
    await world.instance()
    subject = await _ready(world)
    await world.store.deactivate_instance(world.epoch, "i1", "gone")
    before = await world.job(subject.batch_id, subject.job_id)
    with pytest.raises(FailedPreconditionError, match="inactive"):
        await schedule_new_attempt(world, subject)
    assert await world.job(subject.batch_id, subject.job_id) == before
    assert await world.db.fetchall("SELECT * FROM attempts") == []


async def test_one_call_on_several_instances_moves_each_job_as_its_own_instance_decides(world: World) -> None:
    """One SJ with jobs on an active and a pending instance: Running on the one, Creating on the other,
    each instance's cores taken by its own jobs. A call naming an unknown or inactive instance is refused
    whole, naming the first refused instance in name order, and changes nothing. A job with no instance,
    in a call that names none, is refused."""
    await world.instance("i1", cores_mcpu=8000)
    await world.store.create_instance(world.epoch, "private-1", "job-private", 1000, "tok-private-1")
    batch_id, _, start = await world.batch([{}, {}, {}])
    jobs = [{"batch_id": batch_id, "job_id": start, "attempt_id": "a0", "instance_name": "i1"},
            {"batch_id": batch_id, "job_id": start + 1, "attempt_id": "a1", "instance_name": "private-1"}]
    rows = await world.store.schedule_jobs(world.epoch, None, jobs)
    assert [(r["job_id"], r["outcome"], r["instance_name"]) for r in rows] == [
        (start, "scheduled", "i1"), (start + 1, "creating", "private-1")]
    assert [await world.state(batch_id, start + i) for i in range(2)] == ["Running", "Creating"]
    free = await world.db.fetchall("SELECT name, free_cores_mcpu FROM instances ORDER BY name")
    assert [(r["name"], r["free_cores_mcpu"]) for r in free] == [("i1", 7000), ("private-1", 0)]

    await world.instance("i2", cores_mcpu=8000)
    await world.store.deactivate_instance(world.epoch, "i2", "gone")
    before = [await world.job(batch_id, start + i) for i in range(3)]
    third = {"batch_id": batch_id, "job_id": start + 2, "attempt_id": "a2"}
    with pytest.raises(FailedPreconditionError, match="instance i2 is inactive"):
        await world.store.schedule_jobs(world.epoch, None, [{**third, "instance_name": "i2"},
                                                            {**jobs[0], "attempt_id": "b0", "instance_name": "i1"}])
    with pytest.raises(NotFoundError, match="no instance ghost"):
        await world.store.schedule_jobs(world.epoch, "i1",
                                        [third, {**third, "job_id": start, "instance_name": "ghost"}])
    with pytest.raises(InvalidArgumentError, match="instance_name"):
        await world.store.schedule_jobs(world.epoch, None, [third])
    assert [await world.job(batch_id, start + i) for i in range(3)] == before
    i1 = await world.db.fetchone("SELECT free_cores_mcpu FROM instances WHERE name = 'i1'")
    assert i1["free_cores_mcpu"] == 7000
    assert await check_invariants(world.db) == []
