"""validate.check_bunch holds each spec's lists to their limits (Limits) on its
own, whoever calls it: the request interceptor checks them too, first."""

from __future__ import annotations

from corral.batch.v1 import job_spec_pb2 as spec_pb
from services.common.fields import FieldViolation
from services.frontend.limits import Limits
from services.frontend.validate import UpdateBlock, check_bunch

BLOCK = UpdateBlock(start_job_id=1, n_jobs=10, start_job_group_id=1, n_job_groups=0)


def job(**fields: object) -> spec_pb.JobSpec:
    return spec_pb.JobSpec(image="busybox", argv=spec_pb.Argv(args=["true"]), **fields)  # type: ignore[arg-type]


def test_each_list_of_a_spec_is_held_to_its_limit() -> None:
    limits = Limits(max_parents_per_job=1, max_env_per_job=1, max_attributes=1, max_files_per_job=1,
                    max_regions_per_job=1, max_locks_per_job=1, max_names_per_lock=1, max_secrets_per_job=1)
    lock = spec_pb.JobLock(level="l", mode=spec_pb.LOCK_MODE_SHARED, names=["a", "b"])
    big = job(parents=[spec_pb.ParentRef(job_id=1)] * 2, env={"A": "1", "B": "2"}, attributes={"a": "", "b": ""},
              input_files=[spec_pb.InputFile()] * 2, output_files=[spec_pb.OutputFile()] * 2,
              regions=["x", "y"], locks=[lock, lock], secrets=[spec_pb.SecretMount()] * 2)
    found = check_bunch([job(), big], 5, BLOCK, limits=limits)
    # (The empty file URLs are refused too, for their own reasons: tests/unit/test_urls.py.)
    assert [v for v in found if not v.field.endswith(("from_url", "to_url"))] == [
        FieldViolation(f"jobs[1].{field}", f"at most 1 entries ({setting})") for field, setting in [
            ("parents", "max_parents_per_job"), ("env", "max_env_per_job"), ("attributes", "max_attributes"),
            ("input_files", "max_files_per_job"), ("output_files", "max_files_per_job"),
            ("regions", "max_regions_per_job"), ("locks", "max_locks_per_job"), ("secrets", "max_secrets_per_job"),
            ("locks[0].names", "max_names_per_lock"), ("locks[1].names", "max_names_per_lock")]]


def test_at_the_limits_a_spec_is_valid() -> None:
    limits = Limits(max_parents_per_job=2, max_regions_per_job=2, max_cores_mcpu=2000, max_spec_bytes=1000)
    ok = job(parents=[spec_pb.ParentRef(job_id=1), spec_pb.ParentRef(job_id=2)], regions=["x", "y"],
             resources=spec_pb.ResourceRequest(cores_mcpu=2000))
    assert check_bunch([ok], 5, BLOCK, limits=limits) == []
    over = job(resources=spec_pb.ResourceRequest(cores_mcpu=2001), script="x" * 1000)
    over.ClearField("argv")
    assert check_bunch([over], 5, BLOCK, limits=limits) == [
        FieldViolation("jobs[0].resources.cores_mcpu", "must be between 0 and 2000 (max_cores_mcpu)"),
        FieldViolation("jobs[0]", "the spec is larger than 1000 bytes (max_spec_bytes)")]


def test_a_bunch_is_held_to_max_jobs_per_bunch() -> None:
    assert check_bunch([job()] * 3, 1, BLOCK, limits=Limits(max_jobs_per_bunch=2)) == [
        FieldViolation("jobs", "at most 2 jobs per bunch (max_jobs_per_bunch); send several bunches")]


def test_a_timeout_past_a_durations_range_is_refused() -> None:
    """Found by tests/service/test_job_spec_fuzz.py: it passed the checks, then job_row failed to convert it
    (INTERNAL, after the batch was created)."""
    from google.protobuf import duration_pb2

    from services.frontend.validate import MAX_DURATION_S, job_row
    assert check_bunch([job(timeout=duration_pb2.Duration(seconds=MAX_DURATION_S))], 5, BLOCK) == []
    job_row(job(timeout=duration_pb2.Duration(seconds=MAX_DURATION_S)), 5, BLOCK, "ref")
    for bad in (duration_pb2.Duration(seconds=MAX_DURATION_S + 1), duration_pb2.Duration(seconds=220651627862092),
                duration_pb2.Duration(nanos=1_000_000_000)):
        assert [v.field for v in check_bunch([job(timeout=bad)], 5, BLOCK)] == ["jobs[0].timeout"]
