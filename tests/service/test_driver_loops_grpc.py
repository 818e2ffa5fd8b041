"""Driver loops seen over real gRPC: after CancelBatch on the frontend, a job
running on a connected worker gets CancelJob down the worker's session and
the worker's Cancelled report completes the batch; a batch the billing loop
cancelled says so in GetBatch."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2

from corral.batch.v1 import batch_pb2, batch_service_pb2_grpc, job_spec_pb2, job_state_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.server import Listener, Service, serve
from services.common.tls import DevCertificateAuthority
from services.db.invariants import check_invariants
from services.driver.billing_limit_canceller import BillingLimitCanceller
from services.driver.running_canceller import REASON, RunningCanceller
from services.driver.scheduler import Scheduler
from services.driver.servicer import DriverServicer
from services.driver.sessions import SessionRegistry
from services.frontend.app import FrontendApp
from services.common.specs import SpecStore
from tests.service.conftest import UserToken, bearer, person_channel, service_channel
from tests.world import World


def ts(ms: int) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromMilliseconds(ms)
    return out


async def read_until(call: grpc.aio.StreamStreamCall, kind: str) -> pb.WorkerSessionResponse:
    while True:
        message = await asyncio.wait_for(call.read(), timeout=10)
        assert message is not grpc.aio.EOF
        if message.WhichOneof("payload") == kind:
            return message


async def test_a_running_job_gets_cancel_job_after_cancel_batch(world: World, frontend: FrontendApp,
                                                               certs: DevCertificateAuthority, tmp_path: Path,
                                                               user_token: UserToken) -> None:
    alice = bearer(await user_token("alice"))
    registry = SessionRegistry(world.store, SpecStore(f"file://{tmp_path / 'blobs'}"), world.clock)
    servicer = DriverServicer(world.store, registry, lambda: world.epoch, lambda: "driver-0:1",
                              lambda kind: None)
    driver = await serve([Service("corral.driver.v1.DriverService", servicer,
                                  driver_service_pb2_grpc.add_DriverServiceServicer_to_server)],
                         [Listener.mutual_tls("127.0.0.1:0", certs.issue("driver"))])
    canceller = RunningCanceller(world.store, registry, lambda: world.epoch, period_s=0.1,
                                 clock_ms=world.clock)
    loop = asyncio.create_task(canceller.run())
    try:
        async with person_channel(certs.issue("someone"), frontend.public_port) as people:
            batches = batch_service_pb2_grpc.BatchServiceStub(people)
            submitted = await batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                         billing_project="proj", jobs=[
                job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["sleep", "3600"]))]),
                metadata=alice)
            batch_id = submitted.batch.batch_id
            pool = (await world.job(batch_id, 1))["inst_coll"]  # the frontend picks it from the resources
            await world.store.create_instance(world.epoch, "i1", pool, 2000, "activation-secret")
            async with service_channel(certs.issue("worker-i1"), driver.ports[0]) as workers:
                stub = driver_service_pb2_grpc.DriverServiceStub(workers)
                activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                                               activation_token="activation-secret"))
                call = stub.WorkerSession()
                await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1",
                                                                        instance_token=activated.instance_token)))
                await read_until(call, "welcome")
                await Scheduler(world.store, registry, lambda: world.epoch).cycle()
                attempt = (await read_until(call, "run_job")).run_job.attempt
                start_ms = world.clock()
                await call.write(pb.WorkerSessionRequest(event_id=1, job_started=ws.JobStarted(
                    attempt=attempt, start_time=ts(start_ms))))
                assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 1

                response = await batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="wrong input"),
                                                     metadata=alice)
                assert response.batch.cancellation.cancelled_by == "alice"

                cancel = (await read_until(call, "cancel_job")).cancel_job
                assert (cancel.attempt.batch_id, cancel.attempt.job_id, cancel.attempt.attempt_id) == (
                    attempt.batch_id, attempt.job_id, attempt.attempt_id)
                assert cancel.reason == REASON
                await call.write(pb.WorkerSessionRequest(event_id=2, job_completed=ws.JobCompleted(
                    attempt=attempt, state=job_state_pb2.JOB_STATE_CANCELLED, start_time=ts(start_ms),
                    end_time=ts(world.clock.advance(1000)))))
                assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 2
                await call.done_writing()

            got = await batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=alice)
            assert got.batch.state == batch_pb2.BATCH_STATE_COMPLETE
            assert got.batch.counts.n_cancelled == 1
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        await driver.stop(0)
    assert canceller.stop_requests_total == 1  # asked once, not once per cycle
    assert await check_invariants(world.db) == []


async def test_a_batch_over_its_billing_limit_shows_why_it_was_cancelled(world: World, frontend: FrontendApp,
                                                                        certs: DevCertificateAuthority,
                                                                        user_token: UserToken) -> None:
    alice = bearer(await user_token("alice"))
    await world.store.create_billing_project("spent", ["alice"])
    async with person_channel(certs.issue("someone"), frontend.public_port) as people:
        batches = batch_service_pb2_grpc.BatchServiceStub(people)
        submitted = await batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                     billing_project="spent", jobs=[
            job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]))]), metadata=alice)
        # An administrator sets a limit of 0: nothing more may be spent, and the running batch is cancelled.
        await world.db.execute("UPDATE billing_projects SET limit_usd = 0 WHERE name = 'spent'")
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # and no new batch is taken
            await batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                             billing_project="spent", jobs=[
                job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]))]), metadata=alice)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "billing project spent has spent $0.000000 of its $0.000000 limit" in (refused.value.details() or "")
        await BillingLimitCanceller(world.store, lambda: world.epoch, clock_ms=world.clock).cycle()
        got = await batches.GetBatch(bpb.GetBatchRequest(batch_id=submitted.batch.batch_id), metadata=alice)
    cancellation = got.batch.cancellation
    assert (cancellation.cancelled_by, cancellation.reason, cancellation.cause) == (
        "corral", "billing limit reached", batch_pb2.CANCELLATION_CAUSE_BILLING_LIMIT)
    assert await check_invariants(world.db) == []
