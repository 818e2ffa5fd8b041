"""BatchBuilder refuses a parent it cannot express, before any call (issue 12)."""

from __future__ import annotations

import pytest

from corral import BatchBuilder
from corral.errors import UsageError


def test_a_handle_of_this_builder_becomes_an_offset() -> None:
    b = BatchBuilder("proj")
    first = b.job("busybox", ["true"])
    b.job("busybox", ["true"])
    b.job("busybox", ["true"], parents=[first, 7])
    refs = b.specs()[2].parents
    assert (refs[0].in_update_offset, refs[1].job_id) == (-2, 7)


@pytest.mark.parametrize("jobs_here", [0, 1, 3], ids=["empty", "one-job", "three-jobs"])
def test_a_handle_from_another_builder_is_refused_at_once(jobs_here: int) -> None:
    other = BatchBuilder("proj")
    other.job("busybox", ["true"])
    foreign = other.job("busybox", ["true"])  # index 1: a valid position in a builder of 3 jobs
    b = BatchBuilder("proj")
    for _ in range(jobs_here):
        b.job("busybox", ["true"])
    with pytest.raises(UsageError, match="another BatchBuilder"):
        b.job("busybox", ["true"], parents=[foreign])
    assert len(b) == jobs_here  # nothing added


def test_a_handle_from_a_submitted_builder_does_not_carry_over() -> None:
    """A second batch built from the first one's handles: each handle belongs to the first batch."""
    first_batch = BatchBuilder("proj")
    handles = [first_batch.job("busybox", ["true"]) for _ in range(3)]
    second_batch = BatchBuilder("proj")
    second_batch.job("busybox", ["true"])
    second_batch.job("busybox", ["true"])
    with pytest.raises(UsageError):
        second_batch.job("busybox", ["true"], parents=[handles[0]])


@pytest.mark.parametrize("parent", ["a", 1.0, True, None])
def test_a_parent_that_is_neither_handle_nor_job_id_is_refused(parent: object) -> None:
    b = BatchBuilder("proj")
    b.job("busybox", ["true"])
    with pytest.raises(UsageError, match="neither a JobHandle"):
        b.job("busybox", ["true"], parents=[parent])  # type: ignore[list-item]
