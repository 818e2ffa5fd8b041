"""BatchBuilder's whole-spec and job group calls: what `add_job` keeps, how parents and groups become
in-update references, and what it refuses."""

from __future__ import annotations

import pytest

from corral.batch.v1 import job_spec_pb2, job_state_pb2
from corral.builder import BatchBuilder, JobGroupHandle, Parent


def test_add_job_keeps_a_copy_with_parents_and_group_from_handles() -> None:
    b = BatchBuilder("p")
    outer = b.job_group(attributes={"stage": "outer"}, cancel_after_n_failures=2)
    inner = b.job_group(parent=outer, retry_policy=job_spec_pb2.RetryPolicy(max_failed_retries=1))
    first = b.job("busybox", ["true"])
    second = b.job("busybox", ["false"])
    spec = job_spec_pb2.JobSpec(image="busybox", script="echo hi", priority=3)
    spec.parents.add(job_id=99)  # replaced: a spec's own references are the builder's to make
    spec.job_group.job_group_id = 7
    third = b.add_job(spec, parents=[first, Parent(second, accept=("failed",)), 5], accept=("succeeded", "error"),
                      job_group=inner)
    spec.priority = 4  # the builder kept a copy
    kept = b.specs()[third.index]
    assert (kept.priority, kept.script, kept.job_group.in_update_index) == (3, "echo hi", 1)
    S, F, E = job_state_pb2.JOB_STATE_SUCCEEDED, job_state_pb2.JOB_STATE_FAILED, job_state_pb2.JOB_STATE_ERROR
    assert [(p.WhichOneof("ref"), list(p.accepted_states)) for p in kept.parents] == [
        ("in_update_offset", [S, E]), ("in_update_offset", [F]), ("job_id", [S, E])]
    assert [p.in_update_offset for p in kept.parents[:2]] == [-2, -1] and kept.parents[2].job_id == 5
    groups = b.job_group_specs()
    assert (groups[0].attributes, groups[0].cancel_after_n_failures, groups[0].HasField("parent")) == \
        ({"stage": "outer"}, 2, False)
    assert (groups[1].parent.in_update_index, groups[1].retry_policy.max_failed_retries) == (0, 1)
    assert not groups[1].HasField("cancel_after_n_failures")


def test_references_to_what_the_builder_does_not_have_yet_are_refused() -> None:
    b = BatchBuilder("p")
    with pytest.raises(ValueError, match="group must be added to the same builder"):
        b.add_job(job_spec_pb2.JobSpec(image="x", script="y"), job_group=JobGroupHandle(0))
    with pytest.raises(ValueError, match="parent group must be added before"):
        b.job_group(parent=JobGroupHandle(0))
