"""ExplainJob's reasons as a pure function of the facts."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from services.driver.fair_share import UserDemand
from services.frontend.explain import (
    FINAL_STATES,
    Cancelled,
    JobFacts,
    LockConflict,
    Parent,
    Pool,
    Project,
    explain,
    fair_share_mcpu,
)

READY = JobFacts(batch_id=1, job_id=5, state="Ready", user="alice", always_run=False, dependency_failed=False,
                 cores_mcpu=1000, regions=())
ROOMY = Pool("standard", job_private=False, instances_with_room=1, active_cores_mcpu=8000, demands=(),
             jobs_ahead=0, jobs_ahead_capped=False)


def codes(facts: JobFacts) -> list[str]:
    return [r.code for r in explain(facts)]


def test_a_ready_job_with_nothing_in_its_way_has_no_reason() -> None:
    assert codes(dataclasses.replace(READY, pool=ROOMY, project=Project("p", "open", 10.0, 1.0))) == []


def test_over_fair_share_only_while_others_wait() -> None:
    demands = (UserDemand("alice", 6000, 4000), UserDemand("bob", 2000, 0))
    pool = dataclasses.replace(ROOMY, instances_with_room=0, demands=demands)
    assert codes(dataclasses.replace(READY, pool=pool)) == ["NO_CAPACITY_IN_REGIONS"]
    waiting = (UserDemand("alice", 6000, 4000), UserDemand("bob", 2000, 3000))
    pool = dataclasses.replace(pool, demands=waiting)
    assert fair_share_mcpu(pool, "alice") == 4000
    [capacity, fair] = explain(dataclasses.replace(READY, pool=pool))
    assert (capacity.code, fair.code) == ("NO_CAPACITY_IN_REGIONS", "OVER_FAIR_SHARE")
    assert fair.detail == "user alice runs 6 cores of pool standard, fair share is 4"


def test_decisive_reasons_hide_the_schedulers() -> None:
    facts = dataclasses.replace(
        READY, cancelled=Cancelled(2, "bob", "wrong input"), pool=dataclasses.replace(ROOMY, instances_with_room=0),
        project=Project("p", "closed", None, 0.0))
    [reason] = explain(facts)
    assert (reason.code, reason.detail) == ("JOB_GROUP_CANCELLED", "job group 2 was cancelled by bob: wrong input")
    # always_run jobs run anyway: then the scheduler's reasons apply.
    assert codes(dataclasses.replace(facts, always_run=True)) == ["BILLING_LIMIT_REACHED", "NO_CAPACITY_IN_REGIONS"]


def test_pending_jobs_wait_on_parents_and_know_about_failed_ones() -> None:
    facts = dataclasses.replace(READY, state="Pending", dependency_failed=True,
                                parents=(Parent(1, "Failed", 1), Parent(2, "Running", 1), Parent(3, "Success", 1)))
    [failed, waiting] = explain(facts)
    assert (failed.code, failed.jobs) == ("PARENT_FAILED", ((1, 1),))
    assert (waiting.code, waiting.jobs) == ("WAITING_ON_PARENTS", ((1, 2),))
    # An edge accepting failure is not a failed dependency.
    accepting = dataclasses.replace(facts, dependency_failed=False, parents=(Parent(1, "Failed", 2 | 1),))
    assert codes(accepting) == []


def test_locks_limits_and_queues() -> None:
    conflict = LockConflict("db", "exclusive", ("x",), ((1, 2), (3, 4)))
    pool = dataclasses.replace(ROOMY, jobs_ahead=1000, jobs_ahead_capped=True)
    reasons = explain(dataclasses.replace(READY, lock_conflicts=(conflict,), pool=pool,
                                          project=Project("p", "open", 5.0, 5.0)))
    assert [r.code for r in reasons] == ["BILLING_LIMIT_REACHED", "BLOCKED_BY_LOCK", "QUEUED_BEHIND_OWN_JOBS"]
    assert reasons[1].jobs == ((1, 2), (3, 4)) and reasons[1].lock == conflict
    assert reasons[2].detail.startswith("at least 1000 of alice's ready jobs")
    assert codes(dataclasses.replace(READY, pool=dataclasses.replace(ROOMY, job_private=True))) == [
        "NO_CAPACITY_IN_REGIONS"]


@given(st.sampled_from(sorted(FINAL_STATES) + ["Running", "Creating"]), st.booleans(), st.booleans())
def test_a_running_or_finished_job_has_exactly_one_reason(state: str, cancelled: bool, always_run: bool) -> None:
    facts = dataclasses.replace(READY, state=state, always_run=always_run, instance="i1",
                                cancelled=Cancelled(0, "bob", "") if cancelled else None)
    expected = {"Running": "RUNNING", "Creating": "STARTING"}.get(state, "FINISHED")
    assert codes(facts) == [expected]
