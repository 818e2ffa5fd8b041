"""The image a job names and the one each attempt ran, from the worker's report to the user (issue 35):
the driver records the digest a JobStarted carries on its attempt, and GetJob and `corral job` give the
job's image as every container tool reads it and each attempt's digest, over real gRPC."""

from __future__ import annotations

from pathlib import Path

from corral.batch.v1 import job_service_pb2 as pb
from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import driver_service_pb2 as dpb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.driver.v1 import worker_session_pb2 as ws
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import service_channel
from tests.service.test_cli_jobs import corral, logged_in, out
from tests.service.test_driver_session import driver, read_until, ts  # noqa: F401 - driver is a fixture
from tests.service.test_jobs import Env, complete, env  # noqa: F401 - env is a fixture
from tests.world import World

DIGEST = "sha256:" + "0123456789abcdef" * 4


async def test_the_driver_records_the_digest_a_start_reports(world: World, driver: dict,  # noqa: F811
                                                             certs: DevCertificateAuthority) -> None:
    refs = await driver["specs"].write_bunch(1, 1, 2, [
        job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]))] * 2)
    batch_id, _, first = await world.batch([{"spec_ref": refs[0]}, {"spec_ref": refs[1]}])
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "activation-secret")
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        activated = await stub.ActivateWorker(dpb.ActivateWorkerRequest(instance_name="i1",
                                                                        activation_token="activation-secret"))
        call = stub.WorkerSession()
        await call.write(dpb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1",
                                                                 instance_token=activated.instance_token)))
        await read_until(call, "welcome")
        await driver["scheduler"].cycle()
        runs = [(await read_until(call, "run_job")).run_job for _ in range(2)]
        oci, process = sorted((r.attempt for r in runs), key=lambda a: a.job_id)
        # The OCI runtime reports the digest it pulled; the process runtime pulls none.
        await call.write(dpb.WorkerSessionRequest(event_id=1, job_started=ws.JobStarted(
            attempt=oci, start_time=ts(world.clock()), isolation="OCI container (runc)", image_digest=DIGEST)))
        await call.write(dpb.WorkerSessionRequest(event_id=2, job_started=ws.JobStarted(
            attempt=process, start_time=ts(world.clock()), isolation="no container isolated this job")))
        acked = {(await read_until(call, "ack_job_event")).ack_job_event.event_id for _ in range(2)}
        assert acked == {1, 2}
        await call.done_writing()
    rows = {r["job_id"]: r for r in await world.db.fetchall(
        "SELECT job_id, image_digest, start_time_ms FROM attempts WHERE batch_id = %s", (batch_id,))}
    assert (rows[first]["image_digest"], rows[first + 1]["image_digest"]) == (DIGEST, None)
    assert rows[first + 1]["start_time_ms"] is not None  # started all the same


async def test_get_job_and_corral_job_show_the_normalized_image_and_each_attempts_digest(
        env: Env, auth_app: AuthApp, certs: DevCertificateAuthority, tmp_path: Path) -> None:  # noqa: F811
    w = env.world
    await w.instance()
    written = ["busybox", "lab/tool:1.2", "docker.io/library/busybox:latest"]
    batch_id = await env.submit(*(job_spec_pb2.JobSpec(image=image, argv=job_spec_pb2.Argv(args=["true"]))
                                  for image in written))
    for job_id in (1, 2):
        attempt = w.attempt_id()
        await w.store.schedule_jobs(w.epoch, "i1", [{"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}])
        await w.store.mark_jobs_started(w.epoch, "i1", [
            {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "start_time_ms": w.clock(),
             "image_digest": DIGEST if job_id == 1 else ""}])
        await complete(env, batch_id, job_id, attempt, "Success", exit_code=0, reason="exited")

    jobs = [(await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=j), metadata=env.as_("bob"))).job
            for j in (1, 2, 3)]
    assert [j.spec.image for j in jobs] == written  # as the user wrote it
    assert [j.normalized_image for j in jobs] == ["docker.io/library/busybox:latest", "docker.io/lab/tool:1.2",
                                                  "docker.io/library/busybox:latest"]
    assert [[a.image_digest for a in j.attempts] for j in jobs] == [[DIGEST], [""], []]
    listed = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id), metadata=env.as_("alice"))
    assert {j.normalized_image for j in listed.jobs} == {""}  # GetJob's alone, as the spec is

    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    shown = [out(await corral(alice, "job", str(batch_id), str(j))) for j in (1, 2, 3)]
    assert "  image docker.io/library/busybox:latest (written busybox)  command" in shown[0]
    assert f"    image digest: {DIGEST}\n" in shown[0]
    assert "  image docker.io/lab/tool:1.2 (written lab/tool:1.2)  command" in shown[1]
    assert "image digest" not in shown[1]  # its runtime pulled no image: nothing to show, no error
    assert "  image docker.io/library/busybox:latest  command" in shown[2]  # written as normalized: once
