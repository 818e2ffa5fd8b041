"""JobGroupService: reading job groups and cancelling a subtree.

Cancelling is the one O(1) write of `cancel_job_group` (group 0 is the
batch, as CancelBatch); the first cancellation's who, when and why are
kept, a repeat changes nothing, and so does cancelling a finished group
(the answer is the group as it is: complete, no cancellation). The driver
is then told, so its canceller drains the subtree's jobs now rather than at
its next period.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
from google.protobuf import duration_pb2

from corral.batch.v1 import batch_pb2, job_group_pb2, job_group_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import job_group_service_pb2 as pb
from services.common.errors import NotFound
from services.common.identity import current_principal
from services.db.store import JobStore
from services.frontend.access import owned_batch, readable_batch
from services.frontend.batch_store import BatchStore
from services.frontend.group_store import GroupReadStore
from services.frontend.job_protos import micro_usd, timestamp
from services.frontend.jobs import decode_page_token, encode_page_token, page_size
from services.frontend.notify import Notify, no_notify

_STATES = {"running": batch_pb2.BATCH_STATE_RUNNING, "complete": batch_pb2.BATCH_STATE_COMPLETE}


def cancellation_proto(row: dict[str, Any] | None) -> batch_pb2.CancellationInfo | None:
    """Who cancelled the group (or an ancestor), when and why."""
    if row is None:
        return None
    cause = (batch_pb2.CANCELLATION_CAUSE_FAILURE_LIMIT if row["reason"].startswith("cancel_after_n_failures")
             else batch_pb2.CANCELLATION_CAUSE_USER_REQUEST)
    return batch_pb2.CancellationInfo(cancelled_by=row["cancelled_by"], reason=row["reason"],
                                      cancelled_at=timestamp(row["time_cancelled_ms"]), cause=cause)


def retry_policy_proto(stored: str | None) -> job_spec_pb2.RetryPolicy | None:
    """A group's retry policy as stored (`validate.retry_policy_json`: the delays' defaults filled in)."""
    if stored is None:
        return None
    policy = json.loads(stored)
    return job_spec_pb2.RetryPolicy(
        max_preemptions_before_on_demand=policy["max_preemptions_before_on_demand"],
        retry_oom_with_memory_factor=policy["oom_memory_factor"], max_memory_bytes=policy["max_memory_bytes"],
        max_failed_retries=policy["max_failed_retries"], retry_exit_codes=policy["exit_codes"],
        retry_delay=duration_pb2.Duration(seconds=policy["delay_ms"] // 1000, nanos=policy["delay_ms"] % 1000 * 10**6),
        max_retry_delay=duration_pb2.Duration(seconds=policy["max_delay_ms"] // 1000,
                                              nanos=policy["max_delay_ms"] % 1000 * 10**6))


def group_proto(row: dict[str, Any], details: dict[str, Any]) -> job_group_pb2.JobGroup:
    counts = details["counts"]
    root = row["job_group_id"] == 0
    return job_group_pb2.JobGroup(
        batch_id=row["batch_id"], job_group_id=row["job_group_id"],
        parent_job_group_id=None if root else row["parent_id"] or 0, update_id=row["update_id"],
        attributes=details["attributes"], cancel_after_n_failures=row["cancel_after_n_failures"],
        retry_policy=retry_policy_proto(row["retry_policy"]), state=_STATES[row["state"]], cancellation=cancellation_proto(details["cancellation"]),
        counts=batch_pb2.JobCounts(
            n_jobs=counts.n_jobs, n_pending=counts.n_pending, n_ready=counts.n_ready, n_running=counts.n_running,
            n_succeeded=counts.n_succeeded, n_failed=counts.n_failed, n_errored=counts.n_errored,
            n_cancelled=counts.n_cancelled),
        cost_micro_usd=micro_usd(details["cost_usd"]), created_at=timestamp(row["created_ms"]),
        completed_at=timestamp(row["time_completed_ms"]) if row["state"] == "complete" else None)


class JobGroupServicer(job_group_service_pb2_grpc.JobGroupServiceServicer):
    """See the module docstring."""

    def __init__(self, jobs: JobStore, batches: BatchStore, groups: GroupReadStore, notify: Notify = no_notify):
        self.jobs = jobs
        self.batches = batches
        self.groups = groups
        self.notify = notify

    async def _group(self, batch_id: int, job_group_id: int) -> job_group_pb2.JobGroup:
        row = await self.groups.get_group(batch_id, job_group_id)
        if row is None:
            raise NotFound(f"no job group {job_group_id} in batch {batch_id}")
        return group_proto(row, (await self.groups.details(batch_id, [row]))[job_group_id])

    async def GetJobGroup(self, request: pb.GetJobGroupRequest, context: grpc.aio.ServicerContext
                          ) -> pb.GetJobGroupResponse:
        await readable_batch(self.batches, request.batch_id, current_principal())
        return pb.GetJobGroupResponse(job_group=await self._group(request.batch_id, request.job_group_id))

    async def ListJobGroups(self, request: pb.ListJobGroupsRequest, context: grpc.aio.ServicerContext
                            ) -> pb.ListJobGroupsResponse:
        limit = page_size(request.page_size)
        after = decode_page_token(request.page_token) if request.page_token else -1
        await readable_batch(self.batches, request.batch_id, current_principal())
        parent = request.parent_job_group_id if request.HasField("parent_job_group_id") else None
        rows = await self.groups.list_groups(request.batch_id, parent, after, limit)
        details = await self.groups.details(request.batch_id, rows)
        return pb.ListJobGroupsResponse(
            job_groups=[group_proto(r, details[r["job_group_id"]]) for r in rows],
            next_page_token=encode_page_token(rows[-1]["job_group_id"]) if len(rows) == limit else "")

    async def CancelJobGroup(self, request: pb.CancelJobGroupRequest, context: grpc.aio.ServicerContext
                             ) -> pb.CancelJobGroupResponse:
        principal = current_principal()
        batch = await owned_batch(self.batches, request.batch_id, principal)
        if await self.groups.get_group(request.batch_id, request.job_group_id) is None:
            raise NotFound(f"no job group {request.job_group_id} in batch {request.batch_id}")
        status = await self.jobs.cancel_job_group(request.batch_id, request.job_group_id, principal.name,
                                                  request.reason or "cancelled by user")
        # A finished group is left as it is (cancel_job_group): complete, with no cancellation.
        if status["message"] != "complete":
            kind = "batch_cancelled" if request.job_group_id == 0 else "job_group_cancelled"
            await self.notify(kind, request.batch_id, request.job_group_id, batch["billing_project"])
        return pb.CancelJobGroupResponse(job_group=await self._group(request.batch_id, request.job_group_id))
