"""ExplainJob's reasons as a pure function of the facts."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.frontend.explain import (
    FINAL_STATES,
    Cancelled,
    Held,
    JobFacts,
    LockConflict,
    Parent,
    Scheduling,
    explain,
)
from services.policy import planner

READY = JobFacts(batch_id=1, job_id=5, state="Ready", user="alice", always_run=False, dependency_failed=False,
                 cores_mcpu=1000, regions=())
NO_ROOM = Scheduling(planner.Wait(planner.NO_CAPACITY_IN_REGIONS, "no room"))


def codes(facts: JobFacts) -> list[str]:
    return [r.code for r in explain(facts)]


def test_a_ready_job_the_planner_would_start_has_no_reason() -> None:
    assert codes(dataclasses.replace(READY, scheduling=Scheduling())) == []
    assert codes(READY) == []


def test_the_planners_reason_is_the_schedulers() -> None:
    for code in (*planner.RULES, planner.QUEUED_BEHIND_OWN_JOBS):
        [reason] = explain(dataclasses.replace(READY, scheduling=Scheduling(planner.Wait(code, "why"))))
        assert (reason.code, reason.detail) == (code, "why")


def test_decisive_reasons_hide_the_schedulers() -> None:
    facts = dataclasses.replace(READY, cancelled=Cancelled(2, "bob", "wrong input"), scheduling=NO_ROOM)
    [reason] = explain(facts)
    assert (reason.code, reason.detail) == ("JOB_GROUP_CANCELLED", "job group 2 was cancelled by bob: wrong input")
    # always_run jobs run anyway: then the scheduler's reason applies.
    assert codes(dataclasses.replace(facts, always_run=True)) == ["NO_CAPACITY_IN_REGIONS"]


def test_a_held_job_says_which_hold_and_hides_the_schedulers_reason() -> None:
    at = 1_764_497_400_000  # 2025-11-30 10:10:00 UTC
    for held, what in ((Held(0, "alice", at), "batch 1"), (Held(3, "bob", at), "job group 3"),
                       (Held(None, "alice", at), "the job")):
        [reason] = explain(dataclasses.replace(READY, held=held, scheduling=NO_ROOM))
        assert (reason.code, reason.detail) == (
            "HELD", f"{what} was held by {held.held_by} at 2025-11-30 10:10:00 UTC; it is not scheduled until "
                    "released")
    # A pending job under a hold: held, and waiting on its parents too.
    pending = dataclasses.replace(READY, state="Pending", held=Held(0, "alice", at), parents=(Parent(1, "Running", 1),))
    assert codes(pending) == ["HELD", "WAITING_ON_PARENTS"]
    # A cancellation is the decisive reason: a cancelled job never comes back to wait for its release.
    cancelled = dataclasses.replace(READY, held=Held(0, "alice", at), cancelled=Cancelled(0, "alice", ""))
    assert codes(cancelled) == ["BATCH_CANCELLED"]
    assert codes(dataclasses.replace(cancelled, always_run=True)) == ["HELD"]


def test_pending_jobs_wait_on_parents_and_know_about_failed_ones() -> None:
    facts = dataclasses.replace(READY, state="Pending", dependency_failed=True,
                                parents=(Parent(1, "Failed", 1), Parent(2, "Running", 1), Parent(3, "Success", 1)))
    [failed, waiting] = explain(facts)
    assert (failed.code, failed.jobs) == ("PARENT_FAILED", ((1, 1),))
    assert (waiting.code, waiting.jobs) == ("WAITING_ON_PARENTS", ((1, 2),))
    # An edge accepting failure is not a failed dependency.
    accepting = dataclasses.replace(facts, dependency_failed=False, parents=(Parent(1, "Failed", 2 | 1),))
    assert codes(accepting) == []


def test_a_lock_names_its_holders() -> None:
    conflict = LockConflict("db", "exclusive", ("x",), ((1, 2), (3, 4)))
    wait = planner.Wait(planner.BLOCKED_BY_LOCK, "needs exclusive lock", ((1, 2), (3, 4)), "db")
    [reason] = explain(dataclasses.replace(READY, scheduling=Scheduling(wait, conflict)))
    assert (reason.code, reason.jobs, reason.lock) == ("BLOCKED_BY_LOCK", ((1, 2), (3, 4)), conflict)


def test_a_job_no_machine_can_run_says_it_never_runs_and_why() -> None:
    """A job accepted before the deployment changed (or naming a machine type, before the frontend refused
    them) is not told the autoscaler makes its machine: it is told it can never run, and why."""
    why = "a machine of its own (machine_type): no pool of this deployment offers it (pools: standard on local)"
    [reason] = explain(dataclasses.replace(READY, regions=("us",), scheduling=Scheduling(never=why)))
    assert (reason.code, reason.detail) == ("CANNOT_RUN", why)
    # Decisive reasons still come first, and hide it.
    cancelled = dataclasses.replace(READY, cancelled=Cancelled(0, "bob", ""), scheduling=Scheduling(never=why))
    assert codes(cancelled) == ["BATCH_CANCELLED"]


@given(st.sampled_from(sorted(FINAL_STATES) + ["Running", "Creating"]), st.booleans(), st.booleans())
def test_a_running_or_finished_job_has_exactly_one_reason(state: str, cancelled: bool, always_run: bool) -> None:
    facts = dataclasses.replace(READY, state=state, always_run=always_run, instance="i1",
                                cancelled=Cancelled(0, "bob", "") if cancelled else None)
    expected = {"Running": "RUNNING", "Creating": "STARTING"}.get(state, "FINISHED")
    assert codes(facts) == [expected]


@pytest.mark.parametrize(("state", "word"), [("Success", "succeeded"), ("Failed", "failed"), ("Error", "error"),
                                              ("Cancelled", "cancelled")])
def test_a_reason_says_a_state_as_the_cli_shows_it(state: str, word: str) -> None:
    """`why: the job ended Success` stood beside the state `succeeded` (issue 36): one vocabulary."""
    [reason] = explain(dataclasses.replace(READY, state=state, exit_code=0))
    assert reason.detail == f"the job ended {word} with exit code 0"
    [failed] = explain(dataclasses.replace(READY, state="Pending", parents=(Parent(1, state, 0),)))
    assert failed.detail.endswith(f"1 ({word})")
