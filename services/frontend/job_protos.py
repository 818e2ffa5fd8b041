"""Rows of the job read stores to protos: jobs, attempts, explanations.

Pure translation, no I/O. Money: the database keeps USD as doubles, the API
speaks integer micro-dollars.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from corral.batch.v1 import job_explanation_pb2, job_pb2, job_spec_pb2, job_state_pb2
from services.common.image_refs import InvalidImageReference, parse_reference
from services.frontend.explain import Reason

JOB_STATES = {
    "Pending": job_state_pb2.JOB_STATE_PENDING, "Ready": job_state_pb2.JOB_STATE_READY,
    "Creating": job_state_pb2.JOB_STATE_CREATING, "Running": job_state_pb2.JOB_STATE_RUNNING,
    "Success": job_state_pb2.JOB_STATE_SUCCEEDED, "Failed": job_state_pb2.JOB_STATE_FAILED,
    "Error": job_state_pb2.JOB_STATE_ERROR, "Cancelled": job_state_pb2.JOB_STATE_CANCELLED,
}
FINAL_STATES = frozenset({"Success", "Failed", "Error", "Cancelled"})
_ACCEPTED_BITS = ((1, job_state_pb2.JOB_STATE_SUCCEEDED), (2, job_state_pb2.JOB_STATE_FAILED),
                  (4, job_state_pb2.JOB_STATE_ERROR), (8, job_state_pb2.JOB_STATE_CANCELLED))
# attempts.reason as the procedures and the driver write it: the end reason's
# name in lower case ('worker_lost' or 'preempted' when deactivate_instance
# ended the attempt), 'completed' when the worker gave none, and 'instance
# deactivated' for attempts it ended before migration 0014.
_END_REASONS = {
    "exited": job_pb2.ATTEMPT_END_REASON_EXITED, "completed": job_pb2.ATTEMPT_END_REASON_EXITED,
    "out_of_memory": job_pb2.ATTEMPT_END_REASON_OUT_OF_MEMORY, "timed_out": job_pb2.ATTEMPT_END_REASON_TIMED_OUT,
    "cancelled": job_pb2.ATTEMPT_END_REASON_CANCELLED, "preempted": job_pb2.ATTEMPT_END_REASON_PREEMPTED,
    "worker_lost": job_pb2.ATTEMPT_END_REASON_WORKER_LOST,
    "instance deactivated": job_pb2.ATTEMPT_END_REASON_WORKER_LOST,
    "system_error": job_pb2.ATTEMPT_END_REASON_SYSTEM_ERROR, "refused": job_pb2.ATTEMPT_END_REASON_REFUSED,
}


def timestamp(ms: int | None) -> timestamp_pb2.Timestamp | None:
    """A Timestamp of milliseconds since the epoch; None stays None (unset)."""
    if ms is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(int(ms))
    return ts


def micro_usd(usd: Any) -> int:
    """Dollars (a DOUBLE or DECIMAL sum) to whole micro-dollars."""
    return round(float(usd or 0) * 1_000_000)


def accepted_states(bits: int) -> list[int]:
    """The JobStates of an edge's accepted_states bit set."""
    return [state for bit, state in _ACCEPTED_BITS if bits & bit]


def job_proto(row: dict[str, Any], attributes: dict[str, str]) -> job_pb2.Job:
    """A job row of JobReadStore, without spec and attempts (as ListJobs returns it)."""
    final = row["state"] in FINAL_STATES
    return job_pb2.Job(
        batch_id=row["batch_id"], job_id=row["job_id"], update_id=row["update_id"],
        job_group_id=row["job_group_id"], user=row["user"], billing_project=row["billing_project"],
        state=JOB_STATES[row["state"]], attributes=attributes, exit_code=row["exit_code"],
        error_message=row["latest_error_message"] or "", cost_micro_usd=micro_usd(row["cost_usd"]),
        created_at=timestamp(row["time_committed_ms"]), started_at=timestamp(row["first_start_time_ms"]),
        completed_at=timestamp(row["latest_end_time_ms"]) if final else None,
        rerun_of_job_id=row["rerun_of_job_id"] or 0,
        resources=job_pb2.JobResources(cores_mcpu=row["cores_mcpu"], memory_bytes=row["memory_bytes"],
                                       storage_bytes=row["storage_bytes"], pool=row["inst_coll"]))


def resolved_spec(spec: job_spec_pb2.JobSpec, job_group_id: int, parents: list[dict[str, Any]]
                  ) -> job_spec_pb2.JobSpec:
    """The stored spec with its group and parents as absolute ids (the database's
    edges: relative offsets resolved, and a re-run copy's edges to copies)."""
    resolved = job_spec_pb2.JobSpec()
    resolved.CopyFrom(spec)
    resolved.job_group.CopyFrom(job_spec_pb2.JobGroupRef(job_group_id=job_group_id))
    del resolved.parents[:]
    for edge in parents:
        resolved.parents.add(job_id=edge["parent_id"], accepted_states=accepted_states(edge["accepted_states"]))
    return resolved


def normalized_image(image: str) -> str:
    """`image` as every container tool reads it (`busybox` is `docker.io/library/busybox:latest`); '' if it
    is not a reference (no image, or one stored before submissions were checked)."""
    try:
        return str(parse_reference(image))
    except InvalidImageReference:
        return ""


def attempt_proto(row: dict[str, Any]) -> job_pb2.Attempt:
    """An attempt row of JobReadStore."""
    ended = row["end_time_ms"] is not None
    usage = None
    if row["cpu_time_ms"] is not None or row["peak_memory_bytes"] is not None:
        cpu_time = duration_pb2.Duration()
        cpu_time.FromMilliseconds(int(row["cpu_time_ms"] or 0))
        usage = job_pb2.ResourceUsage(cpu_time=cpu_time, peak_memory_bytes=row["peak_memory_bytes"] or 0)
    return job_pb2.Attempt(
        attempt_id=row["attempt_id"], instance_name=row["instance_name"], region=row["region"] or "",
        spot=bool(row["preemptible"]), cores_mcpu=row["cores_mcpu"], memory_bytes=row["memory_bytes"],
        started_at=timestamp(row["start_time_ms"]), ended_at=timestamp(row["end_time_ms"]),
        end_reason=_END_REASONS.get(row["reason"] or "", job_pb2.ATTEMPT_END_REASON_UNSPECIFIED) if ended
        else job_pb2.ATTEMPT_END_REASON_UNSPECIFIED,
        exit_code=row["exit_code"], error_message=row["error_message"] or "", resources_used=usage,
        cost_micro_usd=micro_usd(row["cost_usd"]), isolation=row["isolation"] or "",
        image_digest=row["image_digest"] or "", retry_reason=row["retry_reason"] or "",
        retry_delay=_duration(row["retry_delay_ms"]))


def _duration(ms: int | None) -> duration_pb2.Duration | None:
    if ms is None:
        return None
    duration = duration_pb2.Duration()
    duration.FromMilliseconds(int(ms))
    return duration


def explanation_proto(batch_id: int, job_id: int, state: str, reasons: list[Reason], at_ms: int
                      ) -> job_explanation_pb2.JobExplanation:
    """The ExplainJob answer."""
    out = job_explanation_pb2.JobExplanation(batch_id=batch_id, job_id=job_id, state=JOB_STATES[state],
                                             explained_at=timestamp(at_ms))
    for reason in reasons:
        proto = out.reasons.add(code=job_explanation_pb2.WaitReasonCode.Value(f"WAIT_REASON_CODE_{reason.code}"),
                                detail=reason.detail, regions=list(reason.regions))
        for b, j in reason.jobs[:100]:
            proto.jobs.add(batch_id=b, job_id=j)
        if reason.lock is not None:
            mode = job_spec_pb2.LockMode.Value(f"LOCK_MODE_{reason.lock.mode.upper()}")
            proto.lock.CopyFrom(job_spec_pb2.JobLock(level=reason.lock.level, mode=mode, names=reason.lock.names))
    return out
