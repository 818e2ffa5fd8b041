"""BatchBuilder's whole-spec and job group calls: what `add_job` keeps, how parents and groups become
in-update references, and what it refuses before any call: a handle from another builder (issue 12)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.aio import _ADD_JOBS_JOBS, _repeated_field
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from corral.batch.v1.batch_service_pb2 import AddJobsRequest
from corral.builder import BatchBuilder, JobGroupHandle, Parent
from corral.errors import UsageError


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
    with pytest.raises(UsageError, match="group must be added to the same builder"):
        b.add_job(job_spec_pb2.JobSpec(image="x", script="y"), job_group=JobGroupHandle(0))
    with pytest.raises(UsageError, match="parent group must be added before"):
        b.job_group(parent=JobGroupHandle(0))


def test_a_group_handle_from_another_builder_is_refused() -> None:
    other = BatchBuilder("p")
    other.job_group()
    foreign = other.job_group()
    b = BatchBuilder("p")
    b.job_group()
    b.job_group()  # index 1 exists here too
    with pytest.raises(UsageError, match="another BatchBuilder"):
        b.add_job(job_spec_pb2.JobSpec(image="x", script="y"), job_group=foreign)
    with pytest.raises(UsageError, match="another BatchBuilder"):
        b.job_group(parent=foreign)
    with pytest.raises(UsageError, match="another BatchBuilder"):
        b.job("x", "y", job_group=foreign)
    assert (len(b), len(b.job_group_specs())) == (0, 2)


def test_job_puts_a_job_in_the_group_given_else_the_root() -> None:
    b = BatchBuilder("p")
    b.job_group()
    group = b.job_group()
    b.job("busybox", "true", job_group=group)
    b.job("busybox", "true")
    assert [(s.HasField("job_group"), s.job_group.in_update_index) for s in b.specs()] == [(True, 1), (False, 0)]


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


def test_a_negative_timeout_is_refused_before_any_call() -> None:
    b = BatchBuilder("p")
    with pytest.raises(UsageError, match=r"^timeout_s: -0.5: must be between 0s and 99999999999s$"):
        b.job("busybox", "true", timeout_s=-0.5)
    b.job("busybox", "true", timeout_s=90.25)
    assert [s.timeout.ToNanoseconds() for s in b.specs()] == [90_250_000_000]


def test_sizes_cores_and_timeouts_as_people_write_them() -> None:
    """Text with Kubernetes' units (corral.quantities) beside the numbers of before, which read as they did."""
    b = BatchBuilder("p")
    b.job("busybox", "true", cores="250m", memory_bytes="4Gi", storage_bytes="10G", timeout_s="1h30m")
    b.job("busybox", "true", cores=0.25, memory_bytes=4 * 2**30, storage_bytes=10**10, timeout_s=5400)
    b.job("busybox", "true", cores=0.1)
    text, numbers, tenth = b.specs()
    assert text == numbers
    assert (text.resources.cores_mcpu, text.resources.memory_bytes, text.resources.storage_bytes,
            text.timeout.ToSeconds()) == (250, 4 * 2**30, 10**10, 5400)
    assert tenth.resources.cores_mcpu == 100


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"memory_bytes": "4GB"}, 'memory_bytes: "4GB": unknown unit "GB"; use Ki, Mi, Gi, Ti (powers of 1024) or k, M, '
                              'G, T (powers of 1000), e.g. 512Mi or 4G'),
    ({"cores": "2 cores"}, 'cores: "2 cores": unknown unit " cores"; write cores (0.25, 2) or milli-cores with m '
                           '(250m)'),
    ({"cores": 0}, "cores: 0: at least 0.001 cores (1m)"),
    ({"timeout_s": "2 hours"}, 'timeout_s: "2 hours": unknown unit " hours"; use ms, s, m (minutes), h or d, e.g. '
                               '90s, 30m, 2h or 1h30m; did you mean "h"?'),
])
def test_a_wrong_unit_is_refused_naming_the_argument(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as refused:
        BatchBuilder("p").job("busybox", "true", **kwargs)  # type: ignore[arg-type]
    assert str(refused.value) == message


def test_a_job_names_the_secrets_it_mounts() -> None:
    b = BatchBuilder("p")
    b.job("busybox", "cat /secrets/db/password", secrets={"db": "/secrets/db", "p/key": "/secrets/key"})
    assert [(m.name, m.mount_path) for m in b.specs()[0].secrets] == [("db", "/secrets/db"),
                                                                     ("p/key", "/secrets/key")]


def test_a_job_names_the_secret_it_pulls_its_image_with() -> None:
    b = BatchBuilder("p")
    b.job("registry.example.com/lab/tool:1", "tool --help", image_pull_secret="registry")
    b.job("busybox", "true")
    assert [s.image_pull_secret for s in b.specs()] == ["registry", ""]
    assert not b.specs()[0].secrets  # a login for the pull, not a mount


@given(st.lists(st.tuples(st.text(max_size=300), st.integers(min_value=0, max_value=2**20)), max_size=30))
def test_a_bunch_sent_from_serialized_specs_is_the_bunch_of_messages(jobs: list[tuple[str, int]]) -> None:
    """The builder keeps specs serialized (a million jobs in ~100 MB, not 1.6 GB), and a bunch of AddJobs is
    made by merging them, unparsed, into the request: the request is the one made from the messages."""
    b = BatchBuilder("p")
    for name, memory in jobs:
        b.job("busybox", ["echo", name], env={"NAME": name}, memory_bytes=memory, cores=0.5)
    for first, end in b.bunches(7) or [(0, 0)]:
        merged = AddJobsRequest(batch_id=3, update_id=1, bunch_index=first // 7, first_index=first)
        merged.MergeFromString(_repeated_field(_ADD_JOBS_JOBS, b.serialized_specs(first, end)))
        made = AddJobsRequest(batch_id=3, update_id=1, bunch_index=first // 7, first_index=first,
                              jobs=b.specs()[first:end])
        assert merged == made
    assert [e - f for f, e in b.bunches(7)] == [min(7, len(jobs) - i) for i in range(0, len(jobs), 7)]


@given(st.lists(st.integers(min_value=0, max_value=3000), max_size=40), st.integers(min_value=1, max_value=9),
       st.integers(min_value=200, max_value=5000))
def test_bunches_bounded_by_bytes_cover_every_job_once_within_both_limits(script_sizes: list[int], size: int,
                                                                         max_bytes: int) -> None:
    """Issue 37: a batch whose specs are larger than one request goes up in bunches. The bunches tile the jobs
    in order; each holds at most `size` jobs and `max_bytes` of specs, unless one spec alone is larger."""
    b = BatchBuilder("p")
    for n in script_sizes:
        b.job("debian", "x" * n)
    bunches = b.bunches(size, max_bytes)
    assert [i for first, end in bunches for i in range(first, end)] == list(range(len(script_sizes)))
    for first, end in bunches:
        held = sum(len(s) for s in b.serialized_specs(first, end))
        assert end - first <= size and (held <= max_bytes or end - first == 1)
    assert b.spec_bytes() == sum(len(s) for s in b.serialized_specs(0, len(b)))
