"""JobGroupService over real gRPC: groups with subtree counts and cost,
listing with a parent filter and pages, and cancelling a subtree."""

from __future__ import annotations

import uuid

import grpc

from corral.batch.v1 import batch_pb2, job_group_pb2, job_spec_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_group_service_pb2 as pb
from services.db.invariants import check_invariants
from tests.service.test_jobs import HOUR_MS, Env, complete, env, refused, spec  # noqa: F401 - env is a fixture


def in_group(index: int, *parents: int) -> job_spec_pb2.JobSpec:
    job = spec(*parents)
    job.job_group.in_update_index = index
    return job


def child_of(index: int | None = None, **attributes: str) -> job_group_pb2.JobGroupSpec:
    group = job_group_pb2.JobGroupSpec(attributes=attributes)
    if index is not None:
        group.parent.in_update_index = index
    return group


async def tree(env: Env) -> int:
    """Groups 1 (root's child) > 2 (its child), 3 (root's child); jobs 1-2 in group 1, 3 in 2, 4 in 3, 5 in the root."""
    return await env.submit(in_group(0), in_group(0), in_group(1), in_group(2), spec(),
                            groups=(child_of(stage="a"), child_of(0, stage="b"), child_of(stage="c")))


async def test_groups_count_their_subtree(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await tree(env)
    attempt = await w.run(batch_id, 3)
    await w.store.add_attempt_resources(w.epoch, [{"batch_id": batch_id, "job_id": 3, "attempt_id": attempt,
                                                   "resource": "cpu/local/1", "quantity": 1000}])
    w.clock.advance(HOUR_MS)
    await w.store.heartbeat_rollup(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 3, "attempt_id": attempt,
                                                    "rollup_time_ms": w.clock()}])
    await complete(env, batch_id, 3, attempt, "Failed", exit_code=1)
    await w.run(batch_id, 1)

    reader = env.as_("bob")  # any member reads
    one = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=1), metadata=reader)
           ).job_group
    c = one.counts
    assert (c.n_jobs, c.n_running, c.n_ready, c.n_failed, c.n_pending) == (3, 1, 1, 1, 0)
    assert (one.parent_job_group_id, one.update_id, one.attributes["stage"], one.cost_micro_usd) == (0, 1, "a", 40_000)
    assert (one.state, one.HasField("cancellation")) == (batch_pb2.BATCH_STATE_RUNNING, False)
    root = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=0), metadata=reader)
            ).job_group
    assert (root.counts.n_jobs, root.HasField("parent_job_group_id"), root.cost_micro_usd) == (5, False, 40_000)
    two = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=2), metadata=reader)
           ).job_group
    assert (two.parent_job_group_id, two.counts.n_jobs, two.counts.n_failed, two.state) == (
        1, 1, 1, batch_pb2.BATCH_STATE_COMPLETE)

    async def listed(**kwargs) -> list[int]:
        found, token = [], ""
        while True:
            page = await env.groups.ListJobGroups(pb.ListJobGroupsRequest(batch_id=batch_id, page_token=token,
                                                                          **kwargs), metadata=reader)
            found += [g.job_group_id for g in page.job_groups]
            token = page.next_page_token
            if not token:
                return found

    assert await listed() == [0, 1, 2, 3]
    assert await listed(page_size=1) == [0, 1, 2, 3]
    assert await listed(parent_job_group_id=0) == [1, 3]
    assert await listed(parent_job_group_id=1) == [2]
    # Groups of an update that is not committed are invisible.
    created = await env.batches.CreateUpdate(bpb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                                     batch_id=batch_id, n_jobs=1, n_job_groups=1),
                                             metadata=env.as_("alice"))
    await env.batches.CreateJobGroups(bpb.CreateJobGroupsRequest(
        batch_id=batch_id, update_id=created.update.update_id, job_groups=[child_of()]), metadata=env.as_("alice"))
    assert await listed() == [0, 1, 2, 3]
    missing = await refused(env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=4),
                                                   metadata=reader))
    assert missing.code() == grpc.StatusCode.NOT_FOUND


async def test_cancel_a_subtree(env: Env) -> None:
    w = env.world
    batch_id = await tree(env)
    request = pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=1, reason="bad input")
    for who, code in (("bob", grpc.StatusCode.PERMISSION_DENIED), ("carol", grpc.StatusCode.NOT_FOUND)):
        assert (await refused(env.groups.CancelJobGroup(request, metadata=env.as_(who)))).code() == code
    assert await w.db.fetchone("SELECT 1 AS x FROM job_groups_cancelled") is None

    cancelled = (await env.groups.CancelJobGroup(request, metadata=env.as_("alice"))).job_group
    info = cancelled.cancellation
    assert (info.cancelled_by, info.reason, info.cause) == ("alice", "bad input",
                                                             batch_pb2.CANCELLATION_CAUSE_USER_REQUEST)
    again = (await env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=1,
                                                                      reason="other"), metadata=env.as_("root"))
             ).job_group
    assert again.cancellation.reason == "bad input"  # the first cancellation is kept
    below = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=2),
                                          metadata=env.as_("alice"))).job_group
    assert below.cancellation.cancelled_by == "alice"  # an ancestor's cancellation covers the subtree
    beside = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=3),
                                           metadata=env.as_("alice"))).job_group
    assert not beside.HasField("cancellation")

    assert await w.drain(batch_id) == 3  # jobs 1, 2 and 3; 4 and 5 are outside the subtree
    assert [await w.state(batch_id, j) for j in (1, 2, 3, 4, 5)] == ["Cancelled"] * 3 + ["Ready"] * 2
    missing = await refused(env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=9),
                                                      metadata=env.as_("alice")))
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    whole = (await env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=0),
                                             metadata=env.as_("alice"))).job_group
    assert whole.cancellation.reason == "cancelled by user"
    batch = (await env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=env.as_("alice"))).batch
    assert batch.cancellation.cancelled_by == "alice"
    assert await check_invariants(w.db) == []


async def test_cancelling_what_has_finished_changes_nothing_and_says_so(env: Env) -> None:
    """Issue 12: a finished group, or batch, is left as it is; the answer shows it complete, not cancelled."""
    w = env.world
    await w.instance()
    batch_id = await tree(env)
    alice = env.as_("alice")
    attempt = await w.run(batch_id, 3)
    await complete(env, batch_id, 3, attempt, "Success")
    finished = (await env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=2),
                                                metadata=alice)).job_group
    assert (finished.state, finished.HasField("cancellation")) == (batch_pb2.BATCH_STATE_COMPLETE, False)
    for job_id in (1, 2, 4, 5):
        await complete(env, batch_id, job_id, await w.run(batch_id, job_id), "Success")

    batch = (await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="late"),
                                           metadata=alice)).batch
    assert (batch.state, batch.HasField("cancellation")) == (batch_pb2.BATCH_STATE_COMPLETE, False)
    for group_id in (0, 1, 3):
        group = (await env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=group_id),
                                                 metadata=alice)).job_group
        assert (group.state, group.HasField("cancellation")) == (batch_pb2.BATCH_STATE_COMPLETE, False)
    assert await w.db.fetchone("SELECT 1 AS x FROM job_groups_cancelled") is None
    # Still complete, and still open to more work: a later update is not refused as cancelled.
    update = (await env.batches.CreateUpdate(bpb.CreateUpdateRequest(batch_id=batch_id, n_jobs=1,
                                                                     idempotency_token="more"), metadata=alice)
              ).update
    await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update.update_id, jobs=[spec()]),
                              metadata=alice)
    # An open update may add jobs: the batch is not finished any more, so this cancellation counts.
    cancelled = (await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="stop"),
                                               metadata=alice)).batch
    assert cancelled.cancellation.reason == "stop"
    refused_commit = await refused(env.batches.CommitUpdate(bpb.CommitUpdateRequest(
        batch_id=batch_id, update_id=update.update_id), metadata=alice))
    assert (refused_commit.code(), refused_commit.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                                 f"batch {batch_id} is cancelled")
    assert await check_invariants(w.db) == []


async def test_cancelling_empty_nested_groups_shows_at_once_and_refuses_their_later_jobs(env: Env) -> None:
    """Issue 36: groups 1 > 2 > 3 with no jobs yet (a job in the root keeps the batch running). Cancelling
    group 1 shows on all three at once, as it does with a job in them; a later update's job or group for any
    of them is FAILED_PRECONDITION, as it is for a group with a job."""
    w = env.world
    alice = env.as_("alice")
    batch_id = await env.submit(spec(), groups=(child_of(), child_of(0), child_of(1)))
    cancelled = (await env.groups.CancelJobGroup(pb.CancelJobGroupRequest(batch_id=batch_id, job_group_id=1,
                                                                          reason="wrong input"), metadata=alice)
                 ).job_group
    assert (cancelled.cancellation.cancelled_by, cancelled.cancellation.reason) == ("alice", "wrong input")
    for group_id in (2, 3):
        below = (await env.groups.GetJobGroup(pb.GetJobGroupRequest(batch_id=batch_id, job_group_id=group_id),
                                              metadata=alice)).job_group
        assert below.cancellation.reason == "wrong input"
    listed = (await env.groups.ListJobGroups(pb.ListJobGroupsRequest(batch_id=batch_id), metadata=alice)).job_groups
    assert [(g.job_group_id, g.HasField("cancellation")) for g in listed] == [(0, False), (1, True), (2, True),
                                                                              (3, True)]

    update = (await env.batches.CreateUpdate(bpb.CreateUpdateRequest(batch_id=batch_id, n_jobs=1, n_job_groups=1,
                                                                     idempotency_token="later"), metadata=alice)
              ).update
    for group_id in (1, 2, 3):
        job = spec()
        job.job_group.job_group_id = group_id
        error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=update.update_id,
                                                                     jobs=[job]), metadata=alice))
        assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                   "a job names a cancelled job group")
    group = job_group_pb2.JobGroupSpec()
    group.parent.job_group_id = 3
    error = await refused(env.batches.CreateJobGroups(bpb.CreateJobGroupsRequest(
        batch_id=batch_id, update_id=update.update_id, job_groups=[group]), metadata=alice))
    assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, "job group 3 is cancelled")
    assert await w.db.fetchone("SELECT COUNT(*) AS n FROM jobs WHERE batch_id = %s", (batch_id,)) == {"n": 1}
    assert await check_invariants(w.db) == []


async def test_cancelling_the_top_of_empty_groups_of_an_empty_batch(env: Env) -> None:
    """A batch of groups only (complete at once): cancelling it is recorded, shows on every group, and
    refuses a later update."""
    alice = env.as_("alice")
    created = await env.batches.CreateBatch(bpb.CreateBatchRequest(billing_project="proj", idempotency_token="empty",
                                                                   n_job_groups=2), metadata=alice)
    batch_id, update_id = created.batch.batch_id, created.update.update_id
    await env.batches.CreateJobGroups(bpb.CreateJobGroupsRequest(batch_id=batch_id, update_id=update_id,
                                                                 job_groups=[child_of(), child_of(0)]), metadata=alice)
    committed = await env.batches.CommitUpdate(bpb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id),
                                               metadata=alice)
    assert committed.batch.state == batch_pb2.BATCH_STATE_COMPLETE
    batch = (await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="stop"),
                                           metadata=alice)).batch
    assert batch.cancellation.reason == "stop"
    listed = (await env.groups.ListJobGroups(pb.ListJobGroupsRequest(batch_id=batch_id), metadata=alice)).job_groups
    assert [g.cancellation.reason for g in listed] == ["stop"] * 3
    error = await refused(env.batches.CreateUpdate(bpb.CreateUpdateRequest(batch_id=batch_id, n_jobs=1,
                                                                           idempotency_token="later"),
                                                   metadata=alice))
    assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, f"batch {batch_id} is cancelled")
