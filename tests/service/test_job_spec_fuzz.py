"""Submissions generated from the protobuf descriptors (tests/fuzz/job_specs.py)
through the real SubmitBatch, and bunches through AddJobs, over gRPC on a
real frontend and MariaDB.

Every call is answered OK or refused with a code a user's mistake deserves
(never INTERNAL or UNKNOWN); a refused call leaves every table exactly as
it was (row counts and checksums) and no spec in storage; an accepted
submission is whole: committed, with every job; and the counters the
triggers keep still match the base tables at the end. Field limits at and
one past their bounds are tests/service/test_field_limits.py; this test
mixes perturbations anywhere in a request.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import grpc
import pytest

from corral.batch.v1 import batch_pb2, job_group_pb2, update_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_spec_pb2
from services.db.invariants import check_invariants
from tests.fuzz.drawing import draw_examples
from tests.fuzz.job_specs import submissions
from tests.service.test_jobs import Env, env, refused, spec, violations  # noqa: F401 - env is a fixture
from tests.service.test_security import snapshot

pytestmark = pytest.mark.timeout(600)

# ALREADY_EXISTS: two generated requests that drew the same idempotency token differ (issue 36: a token
# reused with a different request is refused, writing nothing).
ALLOWED_REFUSALS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                              grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED,
                              grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS})
"""What a user's mistake may get. Never INTERNAL, UNKNOWN, or UNAVAILABLE for a healthy server."""
EXAMPLES = 120


def stored_specs(blobs: Path) -> set[Path]:
    # Files only: a directory made for a bunch that was then refused holds nothing (and may be shared).
    return {p for p in (blobs / "specs").rglob("*") if p.is_file()} if (blobs / "specs").exists() else set()


async def test_generated_submissions_are_accepted_whole_or_refused_writing_nothing(env: Env) -> None:
    await submit_generated(env, EXAMPLES)


@pytest.mark.slow
@pytest.mark.timeout(3600)
async def test_many_generated_submissions(env: Env) -> None:
    """The same, longer: 2,000 submissions (about ten minutes here)."""
    await submit_generated(env, 2_000)


async def submit_generated(env: Env, n: int) -> None:
    """`n` generated submissions through SubmitBatch, each accepted whole or refused writing nothing."""
    alice = env.as_("alice")
    examples = draw_examples(submissions(), n)
    outcomes: dict[str, int] = {}
    before, specs_before = await snapshot(env.world.db), stored_specs(env.blobs)
    for request, changed in examples:
        where = f"SubmitBatch with {changed or 'no change'}"
        try:
            response = await env.batches.SubmitBatch(request, metadata=alice)
        except grpc.aio.AioRpcError as error:
            assert error.code() in ALLOWED_REFUSALS, f"{where}: {error.code().name} {error.details()}"
            assert await snapshot(env.world.db) == before, f"{where}: refused ({error.details()}) but wrote"
            assert stored_specs(env.blobs) == specs_before, f"{where}: refused ({error.details()}) but stored specs"
            outcomes[error.code().name] = outcomes.get(error.code().name, 0) + 1
            continue
        assert response.update.state == update_pb2.UPDATE_STATE_COMMITTED, where
        assert response.batch.state != batch_pb2.BATCH_STATE_OPEN, where
        assert (response.update.n_jobs, response.batch.counts.n_jobs) == (len(request.jobs),) * 2, where
        assert response.update.n_job_groups == len(request.job_groups), where
        outcomes["OK"] = outcomes.get("OK", 0) + 1
        before, specs_before = await snapshot(env.world.db), stored_specs(env.blobs)
    # Not vacuous: both accepted and refused submissions were sent.
    assert outcomes.get("OK", 0) > 0 and outcomes.get("INVALID_ARGUMENT", 0) > 0, outcomes
    assert await check_invariants(env.world.db) == []


async def test_generated_bunches_are_added_whole_or_refused_writing_nothing(env: Env) -> None:
    """The same jobs sent as an AddJobs bunch of an open update of an existing batch."""
    alice = env.as_("alice")
    examples = draw_examples(submissions(), EXAMPLES // 2)
    for request, changed in examples:
        where = f"AddJobs with {changed or 'no change'}"
        created = await env.batches.CreateBatch(bpb.CreateBatchRequest(
            idempotency_token=uuid.uuid4().hex,
            billing_project="proj", n_jobs=len(request.jobs), n_job_groups=len(request.job_groups)), metadata=alice)
        batch_id, update = created.batch.batch_id, created.update
        before, specs_before = await snapshot(env.world.db), stored_specs(env.blobs)
        try:
            if request.job_groups:
                await env.batches.CreateJobGroups(bpb.CreateJobGroupsRequest(
                    batch_id=batch_id, update_id=update.update_id, job_groups=request.job_groups), metadata=alice)
                before, specs_before = await snapshot(env.world.db), stored_specs(env.blobs)
            await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update.update_id,
                                                         jobs=request.jobs), metadata=alice)
        except grpc.aio.AioRpcError as error:
            assert error.code() in ALLOWED_REFUSALS, f"{where}: {error.code().name} {error.details()}"
            assert await snapshot(env.world.db) == before, f"{where}: refused ({error.details()}) but wrote"
            assert stored_specs(env.blobs) == specs_before, f"{where}: refused ({error.details()}) but stored specs"
    assert await check_invariants(env.world.db) == []


# ---------------------------------------------------------------- what the fuzzer found


def job(**fields: object) -> job_spec_pb2.JobSpec:
    made = spec()
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(made, name).extend(value)
        else:
            getattr(made, name).CopyFrom(value)  # type: ignore[arg-type]
    return made


def nested_groups(depth: int) -> list[job_group_pb2.JobGroupSpec]:
    groups = [job_group_pb2.JobGroupSpec()]
    for i in range(1, depth):
        group = job_group_pb2.JobGroupSpec()
        group.parent.in_update_index = i - 1
        groups.append(group)
    return groups


# (request, the field named): each of these once created the batch, its update and its groups,
# and then was refused, leaving an open batch that held its reserved ids.
HALF_WRITTEN = {
    "a job without an image": (bpb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex, billing_project="proj", job_groups=[job_group_pb2.JobGroupSpec()],
        jobs=[spec(), job_spec_pb2.JobSpec(argv=job_spec_pb2.Argv(args=["true"]))]), "jobs[1].image"),
    "an input file outside the storage roots": (bpb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex,
        billing_project="proj", jobs=[job(input_files=[job_spec_pb2.InputFile(from_url="file:///etc/shadow",
                                                                                to_path="/in")])]),
        "jobs[0].input_files[0].from_url"),
    "an unknown region": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                 billing_project="proj", jobs=[job(regions=["mars"])]),
                          "jobs[0].regions[0]"),
    "the same parent twice": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                     billing_project="proj", jobs=[spec(), spec(-1, -1)]),
                              "jobs[1].parents[1]"),
    "an empty lock name": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                  billing_project="proj", jobs=[job(locks=[job_spec_pb2.JobLock(
        level="l", mode=job_spec_pb2.LOCK_MODE_SHARED, names=["a", ""])])]), "jobs[0].locks[0].names"),
    "one lock level twice": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                    billing_project="proj", jobs=[job(locks=[
        job_spec_pb2.JobLock(level="l", mode=job_spec_pb2.LOCK_MODE_SHARED, names=["a"]),
        job_spec_pb2.JobLock(level="l", mode=job_spec_pb2.LOCK_MODE_EXCLUSIVE, names=["b"])])]),
        "jobs[0].locks[1].level"),
    "a group the batch does not have": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                               billing_project="proj", jobs=[job(
        job_group=job_spec_pb2.JobGroupRef(job_group_id=5))]), "jobs[0].job_group.job_group_id"),
    "groups nested 8 deep": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                    billing_project="proj", job_groups=nested_groups(8),
                                                    jobs=[spec()]), "job_groups[7].parent"),
    "a group's parent past the update": (bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                billing_project="proj", job_groups=[
        job_group_pb2.JobGroupSpec(parent=job_spec_pb2.JobGroupRef(in_update_index=3))], jobs=[spec()]),
        "job_groups[0].parent.in_update_index"),
}


@pytest.mark.parametrize("case", sorted(HALF_WRITTEN))
async def test_a_refused_submission_writes_nothing(env: Env, case: str) -> None:
    request, field = HALF_WRITTEN[case]
    before, specs_before = await snapshot(env.world.db), stored_specs(env.blobs)
    error = await refused(env.batches.SubmitBatch(request, metadata=env.as_("alice")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert field in violations(error)
    assert await snapshot(env.world.db) == before
    assert stored_specs(env.blobs) == specs_before


async def test_a_bunch_the_database_refuses_leaves_no_spec_and_replaces_none(env: Env) -> None:
    alice = env.as_("alice")
    created = await env.batches.CreateBatch(bpb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                   billing_project="proj", n_jobs=2),
                                            metadata=alice)
    batch_id, update_id = created.batch.batch_id, created.update.update_id
    await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update_id, jobs=[spec(name="first")]),
                              metadata=alice)
    kept = stored_specs(env.blobs)
    # Jobs 1 and 2 where job 1 is in already: the database refuses the bunch as a whole
    # (ABORTED: bunches that overlap, a conflict between two senders).
    before = await snapshot(env.world.db)
    error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(
        batch_id=batch_id, update_id=update_id, jobs=[spec(name="other"), spec(name="second")]), metadata=alice))
    assert error.code() == grpc.StatusCode.ABORTED, error.details()
    assert await snapshot(env.world.db) == before
    assert stored_specs(env.blobs) == kept
    # A different bunch for job 1 is taken for a re-sent one; the specs job 1 was accepted with stay.
    again = await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update_id,
                                                         jobs=[spec(name="impostor")]), metadata=alice)
    assert again.already_received
    await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update_id, first_index=1,
                                                 jobs=[spec(name="second")]), metadata=alice)
    await env.batches.CommitUpdate(bpb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id), metadata=alice)
    got = await env.jobs.GetJob(jpb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=alice)
    assert dict(got.job.spec.attributes) == {"name": "first"}
