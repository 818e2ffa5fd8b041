"""The driver's worker protocol over real gRPC and mutual TLS: activation, the
session stream, Run commands from the scheduler, acknowledged job events."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiomysql
import grpc
import pytest
from google.protobuf import timestamp_pb2

from corral.batch.v1 import job_spec_pb2, job_state_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.session_protocol import PROTOCOL, driver_refusal, spoken, worker_refusal
from services.common.server import Listener, Service, serve
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.db.invariants import check_invariants
from services.driver.scheduler import Scheduler
from services.driver.servicer import DriverServicer
from services.driver.sessions import SessionRegistry
from services.common.specs import SpecStore
from tests.world import World
from tests.service.conftest import service_channel


def ts(ms: int) -> timestamp_pb2.Timestamp:
    out = timestamp_pb2.Timestamp()
    out.FromMilliseconds(ms)
    return out


@pytest.fixture
async def driver(world: World, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[dict]:
    specs = SpecStore(f"file://{tmp_path / 'blobs'}")
    registry = SessionRegistry(world.store, specs, world.clock)
    leading = {"epoch": world.epoch}
    scheduler = Scheduler(world.store, registry, lambda: leading["epoch"])
    servicer = DriverServicer(world.store, registry, lambda: leading["epoch"], lambda: "driver-0:1",
                              lambda kind: None, placed=scheduler.placed)
    servers = await serve([Service("corral.driver.v1.DriverService", servicer,
                                   driver_service_pb2_grpc.add_DriverServiceServicer_to_server)],
                          [Listener.mutual_tls("127.0.0.1:0", certs.issue("driver"))])
    try:
        yield {"port": servers.ports[0], "registry": registry, "specs": specs, "leading": leading,
               "servicer": servicer, "scheduler": scheduler}
    finally:
        await servers.stop(0)


async def read_until(call, kind: str) -> pb.WorkerSessionResponse:
    while True:
        message = await asyncio.wait_for(call.read(), timeout=10)
        assert message is not grpc.aio.EOF
        if message.WhichOneof("payload") == kind:
            return message


async def test_a_job_runs_through_the_session(world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    refs = await driver["specs"].write_bunch(1, 1, 1, [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"]))])
    batch_id, _, job_id = await world.batch([{"spec_ref": refs[0]}])
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "activation-secret")
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                                       activation_token="activation-secret"))
        call = stub.WorkerSession()
        await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1",
                                                                instance_token=activated.instance_token)))
        welcome = await read_until(call, "welcome")
        assert welcome.welcome.epoch == world.epoch

        scheduler = Scheduler(world.store, driver["registry"], lambda: world.epoch)
        await scheduler.cycle()
        run = (await read_until(call, "run_job")).run_job
        assert (run.attempt.batch_id, run.attempt.job_id, run.user, list(run.spec.argv.args)) == (
            batch_id, job_id, "alice", ["true"])
        attempt = run.attempt
        start, end = world.clock(), world.clock.advance(3000)
        await call.write(pb.WorkerSessionRequest(event_id=1, job_started=ws.JobStarted(attempt=attempt,
                                                                                      start_time=ts(start))))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 1
        # Sent twice (the worker did not see the ack): recorded once, acked again.
        await call.write(pb.WorkerSessionRequest(event_id=1, job_started=ws.JobStarted(attempt=attempt,
                                                                                      start_time=ts(start))))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 1
        await call.write(pb.WorkerSessionRequest(event_id=2, job_completed=ws.JobCompleted(
            attempt=attempt, state=job_state_pb2.JOB_STATE_SUCCEEDED, exit_code=0, start_time=ts(start),
            end_time=ts(end))))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 2
        await call.done_writing()

    assert (await world.batch_row(batch_id))["state"] == "complete"
    usage = await world.db.fetchone(
        "SELECT `usage` FROM aggregated_job_resources a JOIN resources r ON r.resource_id = a.resource_id "
        "WHERE r.name = 'cpu/local/1'")
    assert usage["usage"] == 1000 * 3000  # 1 core for 3 s, billed once
    assert await check_invariants(world.db) == []
    await asyncio.sleep(0)  # the session closed when the stream ended
    assert driver["registry"].live_instances() == set()


async def test_a_standby_refuses_workers_and_names_the_leader(world: World, driver: dict,
                                                             certs: DevCertificateAuthority) -> None:
    driver["leading"]["epoch"] = None
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "activation-secret")
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                               activation_token="activation-secret"))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "driver-0:1" in error.value.details()
        leader = await stub.GetLeader(pb.GetLeaderRequest())
        assert leader.leader_address == "driver-0:1"


async def test_a_session_with_a_forged_token_is_refused(world: World, driver: dict,
                                                       certs: DevCertificateAuthority) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "activation-secret")
    await world.store.activate_instance(world.epoch, "i1", "activation-secret")
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = driver_service_pb2_grpc.DriverServiceStub(channel).WorkerSession()
        await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1", instance_token="forged")))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call.read()
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert driver["registry"].live_instances() == set()


@pytest.mark.parametrize("worker_protocol", [0, PROTOCOL - 1, PROTOCOL, PROTOCOL + 1])
async def test_a_driver_takes_workers_of_its_protocol_and_the_one_before_and_refuses_newer_ones(
        world: World, driver: dict, certs: DevCertificateAuthority, worker_protocol: int) -> None:
    """Drivers are upgraded before workers (services/common/session_protocol.py): a worker that predates
    numbering (0, protocol 1) or speaks this driver's protocol or the one before is welcomed, and told the
    driver's; a newer one is refused with FAILED_PRECONDITION saying what to do."""
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "activation-secret")
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                                       activation_token="activation-secret"))
        call = stub.WorkerSession()
        await call.write(pb.WorkerSessionRequest(hello=ws.Hello(
            instance_name="i1", instance_token=activated.instance_token, protocol=worker_protocol)))
        if worker_protocol > PROTOCOL:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await call.read()
            assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert error.value.details() == (f"this worker speaks session protocol {worker_protocol}, newer than "
                                             f"this driver's {PROTOCOL}: upgrade the drivers before the workers")
            assert driver["registry"].live_instances() == set()
        else:
            assert (await read_until(call, "welcome")).welcome.protocol == PROTOCOL
            assert driver["registry"].live_instances() == {"i1"}
        call.cancel()


def test_which_pairs_of_protocols_talk() -> None:
    """Every pair: a driver takes its own protocol and the one before (0 is 1); a worker works only for a
    driver at least as new as itself."""
    assert spoken(0) == 1 and spoken(PROTOCOL) == PROTOCOL
    for worker in range(1, PROTOCOL + 3):
        assert (worker_refusal(worker) == "") == (PROTOCOL - 1 <= worker <= PROTOCOL), worker
    for driver_protocol in range(1, PROTOCOL + 3):
        assert (driver_refusal(driver_protocol) == "") == (driver_protocol >= PROTOCOL), driver_protocol
    assert "upgrade the drivers before the workers" in driver_refusal(spoken(0))


async def welcomed_session(world: World, driver: dict, certs: DevCertificateAuthority,
                           channel: grpc.aio.Channel, cores_mcpu: int = 2000,
                           takes_command_bunches: bool = False) -> grpc.aio.StreamStreamCall:
    """Instance i1 activated, and a session the driver welcomed (saying it takes EventBunch)."""
    await world.store.create_instance(world.epoch, "i1", "standard", cores_mcpu, "activation-secret")
    stub = driver_service_pb2_grpc.DriverServiceStub(channel)
    activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                                   activation_token="activation-secret"))
    call = stub.WorkerSession()
    await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1",
                                                            instance_token=activated.instance_token,
                                                            takes_command_bunches=takes_command_bunches)))
    assert (await read_until(call, "welcome")).welcome.takes_event_bunches
    return call


async def test_heartbeats_are_acknowledged_once_recorded(world: World, driver: dict,
                                                        certs: DevCertificateAuthority) -> None:
    """The acks are how a worker knows its driver is still there (a paused one sends none)."""
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel)
        world.clock.advance(1000)
        await call.write(pb.WorkerSessionRequest(event_id=7, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 7
        row = await world.db.fetchone("SELECT last_heartbeat_ms FROM instances WHERE name = 'i1'")
        assert row["last_heartbeat_ms"] == world.clock()
        call.cancel()


async def test_the_driver_keeps_the_latest_image_cache_report_of_each_session(
        world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    """What the scheduler prefers a worker for: each report replaces the one before; gone with the session."""
    digest = "sha256:" + "b" * 64
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel)
        report = ws.ImageCacheReport(images=[ws.CachedImage(digest=digest, names=["docker.io/library/python:3.11",
                                                                                  "python:3.11"])])
        await call.write(pb.WorkerSessionRequest(event_id=1, image_cache=report))
        await call.write(pb.WorkerSessionRequest(event_id=2, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 2  # recorded, in order
        assert driver["registry"].images_held() == {
            "i1": frozenset({digest, "docker.io/library/python:3.11", "python:3.11"})}

        emptied = pb.WorkerSessionRequest(event_id=3, image_cache=ws.ImageCacheReport())  # all evicted
        await call.write(pb.WorkerSessionRequest(events=pb.EventBunch(events=[
            emptied, pb.WorkerSessionRequest(event_id=4, heartbeat=ws.Heartbeat(free_cores_mcpu=2000))])))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 4
        assert driver["registry"].images_held() == {}

        await call.write(pb.WorkerSessionRequest(event_id=5, image_cache=report))
        await call.write(pb.WorkerSessionRequest(event_id=6, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
        assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 6
        call.cancel()
    await asyncio.sleep(0.1)  # the session closed when the stream ended
    assert driver["registry"].images_held() == {}


async def test_a_driver_that_stops_leading_ends_its_sessions_naming_the_leader(
        world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel)
        driver["leading"]["epoch"] = None
        assert driver["servicer"].end_sessions("this driver no longer leads") == 1
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await read_until(call, "nothing comes: the session ends")
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error.value.details() == "this driver no longer leads; the leader is at driver-0:1"
    assert driver["registry"].connected_instances() == set()


async def test_a_session_ends_at_the_next_event_once_its_epoch_is_gone(
        world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    """The driver stepped down and leads again under a new epoch before anyone ended the session:
    the old session's next pass of events is not recorded under either epoch."""
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel)
        before = await world.db.fetchone("SELECT last_heartbeat_ms FROM instances WHERE name = 'i1'")
        driver["leading"]["epoch"] = world.epoch + 1
        world.clock.advance(1000)
        await call.write(pb.WorkerSessionRequest(event_id=3, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await read_until(call, "ack_job_event")
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE
        assert f"no longer leads under epoch {world.epoch}" in error.value.details()
    assert await world.db.fetchone("SELECT last_heartbeat_ms FROM instances WHERE name = 'i1'") == before


async def read_acks(call, n: int) -> set[int]:
    """The event ids of the next `n` acknowledgements, sent alone or in a CommandBunch."""
    acked: set[int] = set()
    while len(acked) < n:
        message = await asyncio.wait_for(call.read(), timeout=10)
        assert message is not grpc.aio.EOF
        commands = message.commands.commands if message.WhichOneof("payload") == "commands" else [message]
        acked |= {c.ack_job_event.event_id for c in commands if c.WhichOneof("payload") == "ack_job_event"}
    return acked


async def test_a_worker_that_takes_bunches_gets_commands_and_sends_events_in_bunches(
        world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    """Hello says the worker takes CommandBunch; Welcome says the driver takes EventBunch. The Run commands
    the scheduler queues together come in one message, and the events of one bunch are each recorded and
    acknowledged as if sent alone."""
    refs = await driver["specs"].write_bunch(1, 1, 1, [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"])) for _ in range(3)])
    batch_id, _, start = await world.batch([{"spec_ref": ref} for ref in refs])
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel, cores_mcpu=8000, takes_command_bunches=True)
        await Scheduler(world.store, driver["registry"], lambda: world.epoch).cycle()
        bunch = (await read_until(call, "commands")).commands.commands
        assert [c.WhichOneof("payload") for c in bunch] == ["run_job"] * 3
        assert [c.run_job.attempt.job_id for c in bunch] == [start, start + 1, start + 2]
        assert len({c.command_id for c in bunch}) == 3 and all(c.command_id for c in bunch)

        begun, ended = world.clock(), world.clock.advance(1000)
        events = [pb.WorkerSessionRequest(event_id=1 + i, job_started=ws.JobStarted(
            attempt=c.run_job.attempt, start_time=ts(begun))) for i, c in enumerate(bunch)]
        events += [pb.WorkerSessionRequest(event_id=4 + i, job_completed=ws.JobCompleted(
            attempt=c.run_job.attempt, state=job_state_pb2.JOB_STATE_SUCCEEDED, start_time=ts(begun),
            end_time=ts(ended))) for i, c in enumerate(bunch)]
        events.append(pb.WorkerSessionRequest(command_ack=ws.CommandAck(command_id=bunch[0].command_id,
                                                                        accepted=True)))
        await call.write(pb.WorkerSessionRequest(events=pb.EventBunch(events=events)))
        assert await read_acks(call, 6) == {1, 2, 3, 4, 5, 6}
        call.cancel()
    assert (await world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(world.db) == []


async def test_a_worker_that_does_not_say_it_takes_bunches_gets_commands_one_at_a_time(
        world: World, driver: dict, certs: DevCertificateAuthority) -> None:
    refs = await driver["specs"].write_bunch(1, 1, 1, [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"])) for _ in range(3)])
    await world.batch([{"spec_ref": ref} for ref in refs])
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel, cores_mcpu=8000)
        await Scheduler(world.store, driver["registry"], lambda: world.epoch).cycle()
        for _ in range(3):
            message = await asyncio.wait_for(call.read(), timeout=10)
            assert message.WhichOneof("payload") == "run_job"
        call.cancel()


@pytest.mark.parametrize("inner", [
    pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1")),
    pb.WorkerSessionRequest(events=pb.EventBunch(events=[pb.WorkerSessionRequest(
        event_id=1, heartbeat=ws.Heartbeat(free_cores_mcpu=1))])),
    pb.WorkerSessionRequest(event_id=1),
], ids=["hello", "a bunch in a bunch", "no payload"])
async def test_an_event_bunch_carries_only_events(world: World, driver: dict, certs: DevCertificateAuthority,
                                                  inner: pb.WorkerSessionRequest) -> None:
    async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
        call = await welcomed_session(world, driver, certs, channel)
        await call.write(pb.WorkerSessionRequest(events=pb.EventBunch(events=[
            pb.WorkerSessionRequest(event_id=2, heartbeat=ws.Heartbeat(free_cores_mcpu=1)), inner])))
        with pytest.raises(grpc.aio.AioRpcError) as error:
            while await asyncio.wait_for(call.read(), timeout=10) is not grpc.aio.EOF:
                pass
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "events.events[1]" in error.value.details()


async def test_a_draining_worker_is_acknowledged_after_the_run_commands_of_the_cycle_under_way(
        world: World, driver: dict, certs: DevCertificateAuthority, db_config: DatabaseConfig) -> None:
    """A cycle takes its live instances when it starts: one under way when the worker says it drains may
    still place a job there. The worker deactivates once its Draining is acknowledged and nothing runs, so
    the ack must come after that cycle's RunJob, or the attempt is lost with the worker (the fault
    database-restart saw 16 such, with SJ slow on a restarting database). Here the job's row is held so
    that the cycle waits in SJ while the Draining arrives."""
    refs = await driver["specs"].write_bunch(1, 1, 1, [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"]))])
    batch_id, _, job_id = await world.batch([{"spec_ref": refs[0]}])
    holder = await aiomysql.connect(**db_config.connect_kwargs())
    try:
        async with service_channel(certs.issue("worker-i1"), driver["port"]) as channel:
            call = await welcomed_session(world, driver, certs, channel)
            async with holder.cursor() as cursor:
                await cursor.execute("START TRANSACTION")
                await cursor.execute("SELECT * FROM jobs WHERE batch_id = %s AND job_id = %s FOR UPDATE",
                                     (batch_id, job_id))
                cycle = asyncio.ensure_future(driver["scheduler"].cycle())
                deadline = time.monotonic() + 15  # within the server's lock wait timeout
                while not await world.db.fetchall(
                        "SELECT id FROM information_schema.PROCESSLIST WHERE db = %s AND command = 'Query' "
                        "AND time_ms > 300 AND info NOT LIKE '%%PROCESSLIST%%'", (db_config.database,)):
                    assert not cycle.done(), cycle
                    assert time.monotonic() < deadline, "the cycle never waited for the job's row"
                    await asyncio.sleep(0.05)
                await call.write(pb.WorkerSessionRequest(event_id=5, draining=ws.Draining(
                    reason=ws.DRAIN_REASON_IDLE)))  # as the worker sends it: numbered, but not acknowledged
                await call.write(pb.WorkerSessionRequest(event_id=6, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
                with pytest.raises(TimeoutError):  # not acknowledged while the cycle may still place here
                    await asyncio.wait_for(asyncio.shield(reading := asyncio.ensure_future(call.read())), 1)
                await cursor.execute("ROLLBACK")
            first = await asyncio.wait_for(reading, 10)
            assert first.WhichOneof("payload") == "run_job" and first.run_job.attempt.job_id == job_id
            assert await read_acks(call, 1) == {6}  # the heartbeat sent after the Draining: the worker's sign
            await asyncio.wait_for(cycle, 10)
            call.cancel()
    finally:
        holder.close()
