"""A job no machine of the deployment can ever run is refused at submission (SubmitBatch, AddJobs), in one
line naming the job, nothing written; a job accepted before the deployment changed is told by ExplainJob
that it can never run; a job without room is told what it waits for and whether it comes. Over real gRPC,
on the local pools of migration 0002."""

from __future__ import annotations

import uuid

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_explanation_pb2 as codes
from corral.batch.v1 import job_service_pb2 as pb
from corral.batch.v1 import job_spec_pb2
from tests.service.test_jobs import Env, env, refused, spec  # noqa: F401 (env is a fixture)

GIB = 2**30
POOLS = "pools: highcpu, highmem, standard on local"


def refusals(error: grpc.aio.AioRpcError) -> list[tuple[str, str]]:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    return [(v.field, v.description) for v in details.field_violations]


async def nothing_written(env: Env) -> None:
    for table in ("batches", "jobs"):
        assert await env.world.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}") == {"n": 0}


def sized(cores_mcpu: int, memory_bytes: int = 0, **kwargs) -> job_spec_pb2.JobSpec:
    return spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=cores_mcpu, memory_bytes=memory_bytes), **kwargs)


async def test_a_machine_type_is_refused_on_the_local_provider_naming_the_job(env: Env) -> None:
    """docs/batch-file.md's old Defaults example: job `big` named a machine type, was accepted, and waited for
    good ("the autoscaler creates it")."""
    error = await refused(env.submit(spec(name="small"), spec(name="big", machine_type="n2-highmem-8"),
                                     spec(machine_type="e2-small")))
    assert refusals(error) == [
        ("jobs[1].machine_type", f"n2-highmem-8: no pool of this deployment offers it "
                                 f"({POOLS}); ask for cores and memory instead"),
        ("jobs[2].machine_type", f"e2-small: no pool of this deployment offers it ({POOLS}); "
                                 "ask for cores and memory instead")]
    await nothing_written(env)

    # The same in an update that adds jobs to a batch.
    batch_id = await env.submit(spec(name="small"))
    created = await env.batches.CreateUpdate(bpb.CreateUpdateRequest(
        idempotency_token=uuid.uuid4().hex, batch_id=batch_id, n_jobs=1), metadata=env.as_("alice"))
    error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(
        batch_id=batch_id, update_id=created.update.update_id, jobs=[spec(name="big", machine_type="n2-highmem-8")]),
        metadata=env.as_("alice")))
    assert refusals(error) == [("jobs[0].machine_type", f"n2-highmem-8: no pool of this "
                                                        f"deployment offers it ({POOLS}); ask for cores and memory "
                                                        "instead")]
    assert await env.world.db.fetchone("SELECT COUNT(*) AS n FROM jobs") == {"n": 1}


async def test_a_job_whose_pool_is_disabled_is_refused_and_one_a_pool_holds_is_accepted(env: Env) -> None:
    # A whole highmem machine (2 cores, 16 GiB) and a whole standard one (2 cores, 8 GiB) run.
    batch_id = await env.submit(sized(2000, 16 * GIB, name="all-highmem"), sized(2000, 8 * GIB), sized(250))
    rows = await env.world.db.fetchall("SELECT inst_coll FROM jobs WHERE batch_id = %s ORDER BY job_id", (batch_id,))
    assert [r["inst_coll"] for r in rows] == ["highmem", "standard", "standard"]

    await env.world.db.execute("UPDATE instance_collections SET enabled = FALSE WHERE name = 'highmem'")
    error = await refused(env.submit(sized(1000, 8 * GIB, name="wide"), sized(1000)))
    assert refusals(error) == [
        ("jobs[0].resources", "its pool, highmem (chosen by its memory per core), is disabled in this "
                              "deployment (pools: highcpu, standard on local)")]


async def explain(env: Env, batch_id: int, job_id: int) -> list[tuple[int, str]]:
    answer = await env.jobs.ExplainJob(pb.ExplainJobRequest(batch_id=batch_id, job_id=job_id),
                                       metadata=env.as_("alice"))
    return [(r.code, r.detail) for r in answer.explanation.reasons]


async def test_a_job_accepted_before_the_deployment_changed_is_told_it_can_never_run(env: Env) -> None:
    batch_id = await env.submit(sized(1000, 8 * GIB, name="wide"), sized(2000))
    await env.world.db.execute("UPDATE instance_collections SET enabled = FALSE WHERE name = 'highmem'")
    await env.world.db.execute("UPDATE instance_collections SET worker_cores = 1 WHERE name = 'standard'")
    assert await explain(env, batch_id, 1) == [
        (codes.WAIT_REASON_CODE_CANNOT_RUN, "its pool, highmem (chosen by its memory per core), is "
                                            "disabled in this deployment (pools: highcpu, standard on local)")]
    assert await explain(env, batch_id, 2) == [
        (codes.WAIT_REASON_CODE_CANNOT_RUN, "2 cores is more than the largest standard machine has "
                                            "(1)")]

    # A job-private job from before the frontend refused them: its machine is made by no one.
    private, _, _ = await env.world.batch([{"inst_coll": "job-private"}])
    assert await explain(env, private, 1) == [
        (codes.WAIT_REASON_CODE_CANNOT_RUN, "a machine of its own (machine_type): no pool of this "
                                            "deployment offers it (pools: highcpu, standard on local); ask for "
                                            "cores and memory instead")]


async def test_a_job_without_room_is_told_what_it_waits_for_and_whether_it_comes(env: Env) -> None:
    w = env.world
    batch_id = await env.submit(sized(1000), sized(1000))
    no_room = "no live standard worker in the job's regions has 1 cores, 4 GiB of memory and 8 GiB of scratch " \
              "storage free; "
    assert await explain(env, batch_id, 1) == [(codes.WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS, no_room + (
        "waiting for a machine: the autoscaler adds one to pool standard in its next cycle (0 of at most 4 "
        "machines now)"))]

    await w.store.create_instance(w.epoch, "starting-1", "standard", 1000, "tok-starting-1")
    assert await explain(env, batch_id, 1) == [(codes.WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS, no_room + (
        "waiting for a machine: the autoscaler is creating 1 machine for pool standard"))]

    # The machine started and runs job 1: the pool is at its max_instances (1), job 2 waits for job 1 to end.
    await w.store.activate_instance(w.epoch, "starting-1", "tok-starting-1")
    await w.db.execute("UPDATE instance_collections SET max_instances = 1 WHERE name = 'standard'")
    await w.run(batch_id, 1, instance="starting-1")
    assert await explain(env, batch_id, 2) == [(codes.WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS, no_room + (
        "waiting for room: pool standard is at its max_instances (1 of 1 machines), so it waits for running "
        "jobs to end"))]
