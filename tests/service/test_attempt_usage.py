"""GetAttemptUsage over real gRPC: an ended attempt's series as its worker
stored it (written here with the worker's own functions, at the worker's
own path), a running attempt's last reported sample, who may read it, and
refusals of bad requests."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path

import grpc
import pytest

from corral import Client, aio
from corral.batch.v1 import job_spec_pb2
from corral.errors import InvalidArgument, NotFound
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.driver.app import DriverConfig
from services.driver.app import start as start_driver
from services.driver.servicer import SessionSettings
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from services.worker.runtime import ProcessRuntime
from tests.conftest import service_url
from tests.world import FakeClock

from corral.batch.v1 import job_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.usage_series import UsageHeader, UsageReading, UsageSample, encode
from services.worker.attempts import log_url, usage_url
from services.worker.logs import put_bytes
from tests.service.test_cli_jobs import corral, logged_in, out
from tests.service.test_worker import eventually
from tests.service.test_jobs import (Env, complete, env, make_env, refused, spec, start_frontend,  # noqa: F401
                                     violations)

pytestmark = pytest.mark.timeout(120)

MIB = 2**20
HOUR_MS = 3_600_000


def store_series(env: Env, batch_id: int, job_id: int, attempt: str, samples: list[UsageSample]) -> None:
    """What a worker does at the end of an attempt, where it does it."""
    ref = ws.AttemptRef(batch_id=batch_id, job_id=job_id, attempt_id=attempt)
    put_bytes(encode(UsageHeader("oci", 250, 2, ""), samples), usage_url(log_url(f"file://{env.blobs}", ref)))


async def test_the_owner_and_members_read_an_ended_attempts_series(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec())
    attempt = await w.run(batch_id, 1)
    start = w.clock()
    samples = [UsageSample(start + 250 * i, UsageReading(cpu_time_ms=200 * i, memory_bytes=(i + 1) * 16 * MIB,
                                                          peak_memory_bytes=(i + 1) * 16 * MIB, io_read_bytes=0,
                                                          io_write_bytes=4096 * i)) for i in range(4)]
    samples.append(UsageSample(start + 1000, UsageReading(cpu_time_ms=900, peak_memory_bytes=64 * MIB)))
    store_series(env, batch_id, 1, attempt, samples)
    await complete(env, batch_id, 1, attempt, "Success", exit_code=0, cpu_time_ms=900, peak_memory_bytes=64 * MIB)

    for who in ("alice", "bob", "root"):
        usage = await env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1),
                                               metadata=env.as_(who))
        assert (usage.attempt_id, usage.complete, usage.runtime, usage.note) == (attempt, True, "oci", "")
        assert usage.interval.ToMilliseconds() == 250
        assert (usage.summary.cpu_time.ToMilliseconds(), usage.summary.peak_memory_bytes) == (900, 64 * MIB)
        assert [s.at.ToMilliseconds() - start for s in usage.samples] == [0, 250, 500, 750, 1000]
        assert [s.cpu_time.ToMilliseconds() for s in usage.samples] == [0, 200, 400, 600, 900]
        assert [s.memory_bytes for s in usage.samples[:-1]] == [16 * MIB, 32 * MIB, 48 * MIB, 64 * MIB]
        final = usage.samples[-1]
        assert not final.HasField("memory_bytes") and not final.HasField("io_read_bytes")  # unknown, not 0
        assert final.peak_memory_bytes == 64 * MIB
        assert usage.samples[0].HasField("io_read_bytes") and usage.samples[0].io_read_bytes == 0
    by_id = await env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1,
                                                                     attempt_id=attempt), metadata=env.as_("alice"))
    assert len(by_id.samples) == 5


async def test_a_running_attempt_has_no_series_yet_and_one_never_stored_says_so(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(), spec())
    running = await w.run(batch_id, 1)
    await w.store.add_attempt_resources(w.epoch, [{"batch_id": batch_id, "job_id": 1, "attempt_id": running,
                                                   "resource": "cpu/local/1", "quantity": 1000}])
    # The heartbeat's rollup carries the worker's latest sample: shown while it runs, billed on the reservation.
    w.clock.advance(HOUR_MS)
    await w.store.heartbeat_rollup(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 1, "attempt_id": running,
                                                    "rollup_time_ms": w.clock(), "cpu_time_ms": 30_000,
                                                    "peak_memory_bytes": 3 * MIB}])
    usage = await env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1),
                                           metadata=env.as_("alice"))
    assert (usage.attempt_id, usage.complete, list(usage.samples), usage.runtime) == (running, False, [], "")
    assert "running" in usage.note
    assert (usage.summary.cpu_time.ToMilliseconds(), usage.summary.peak_memory_bytes) == (30_000, 3 * MIB)
    [attempt] = (await env.jobs.GetJobAttempts(pb.GetJobAttemptsRequest(batch_id=batch_id, job_id=1),
                                               metadata=env.as_("alice"))).attempts
    assert attempt.resources_used.peak_memory_bytes == 3 * MIB
    assert attempt.cost_micro_usd == 40_000  # one reserved core for an hour at $0.04, whatever it used
    # A series a worker could not store (or one from before series existed): the summary, and why.
    lost = await w.run(batch_id, 2)
    await complete(env, batch_id, 2, lost, "Success", exit_code=0, cpu_time_ms=5, peak_memory_bytes=7)
    usage = await env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=2),
                                           metadata=env.as_("alice"))
    assert (usage.complete, list(usage.samples), usage.summary.peak_memory_bytes) == (True, [], 7)
    assert "no usage series was stored" in usage.note


async def test_others_are_told_what_missing_ids_get_and_bad_requests_are_refused(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(), spec())
    attempt = await w.run(batch_id, 1)
    await complete(env, batch_id, 1, attempt, "Success", exit_code=0)
    store_series(env, batch_id, 1, attempt, [UsageSample(1, UsageReading(cpu_time_ms=1))])
    alice, carol = env.as_("alice"), env.as_("carol")

    for id_ in (batch_id, batch_id + 100):  # someone else's batch is a missing one
        error = await refused(env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=id_, job_id=1),
                                                       metadata=carol))
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, f"no batch {id_}")
    error = await refused(env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1)))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED

    for request in (pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=2),  # never ran
                    pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=3),  # no such job
                    pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1, attempt_id="nope")):
        assert (await refused(env.jobs.GetAttemptUsage(request, metadata=alice))).code() == grpc.StatusCode.NOT_FOUND

    for attempt_id in ("../1", "a/b", "x" * 41, "é"):  # an attempt id also names a path in storage
        error = await refused(env.jobs.GetAttemptUsage(
            pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1, attempt_id=attempt_id), metadata=alice))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(error) == ["attempt_id"]
    error = await refused(env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=2**40),
                                                   metadata=alice))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(error) == ["job_id"]

    # A stored blob that is not a series is data lost, said as such (not an empty answer).
    ref = ws.AttemptRef(batch_id=batch_id, job_id=1, attempt_id=attempt)
    put_bytes(b"not json\n", usage_url(log_url(f"file://{env.blobs}", ref)))
    error = await refused(env.jobs.GetAttemptUsage(pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1),
                                                   metadata=alice))
    assert error.code() == grpc.StatusCode.DATA_LOSS


async def test_the_clients_and_the_cli_show_usage(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                                  tmp_path: Path) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec())
    attempt = await w.run(batch_id, 1)
    start = w.clock()
    store_series(env, batch_id, 1, attempt, [
        UsageSample(start, UsageReading(cpu_time_ms=0, memory_bytes=MIB, peak_memory_bytes=MIB)),
        UsageSample(start + 1500, UsageReading(cpu_time_ms=1500, peak_memory_bytes=64 * MIB))])
    await complete(env, batch_id, 1, attempt, "Success", exit_code=0, cpu_time_ms=1500, peak_memory_bytes=64 * MIB)
    address = f"localhost:{env.frontend.public_port}"
    async with aio.Client(address, env.tokens["alice"], certs.ca_cert_path) as client:
        usage = await client.attempt_usage(batch_id, 1)
        assert [s.cpu_time.ToMilliseconds() for s in usage.samples] == [0, 1500]
        with pytest.raises(NotFound):
            await client.attempt_usage(batch_id, 1, "nope")
        with pytest.raises(InvalidArgument):
            await client.attempt_usage(batch_id, 1, "../x")

    def blocking_call() -> object:  # in a thread: the frontend answers on this test's loop
        with Client(address, env.tokens["alice"], certs.ca_cert_path) as blocking:
            return blocking.attempt_usage(batch_id, 1, attempt)

    assert await asyncio.to_thread(blocking_call) == usage

    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    shown = out(await corral(alice, "job", str(batch_id), "1"))
    assert "    used: cpu time 1.5 s, peak memory 64 MiB\n" in shown
    series = out(await corral(alice, "job", str(batch_id), "1", "--usage"))
    assert series.splitlines()[-4:-1] == [
        "      at_s   cpu_s    memory      peak   io_read  io_write",
        "       0.0     0.0     1 MiB     1 MiB         -         -",
        "       1.5     1.5         -    64 MiB         -         -"]
    as_json = json.loads(out(await corral(alice, "job", str(batch_id), "1", "--usage", "--json")))
    assert len(as_json[2]["samples"]) == 2


class SampledProcessRuntime(ProcessRuntime):
    """The process runtime, with counters it makes up while a job runs (the process runtime reads none; the
    OCI runtime's real ones are tested in tests/oci and test_worker_oci.py): 100 ms of cpu more each time."""

    usage_note = ""

    def __init__(self) -> None:
        super().__init__()
        self._ticks = itertools.count(1)

    def sample(self, attempt_id: str) -> UsageReading | None:
        tick = next(self._ticks)
        return UsageReading(cpu_time_ms=100 * tick, memory_bytes=MIB, peak_memory_bytes=tick * MIB)


async def test_a_running_attempts_series_is_read_from_its_worker_then_from_storage(
        auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
        certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """A real driver and worker run a job that waits for a file; its usage is read while it waits, and after."""
    await db.execute("UPDATE instance_collections SET max_instances = 0")  # no worker processes
    blobs = tmp_path / "blobs"
    driver = await start_driver(DriverConfig(
        service_url(db_config, "driver"), certs.directory, f"file://{blobs}", tmp_path / "driver",
        session=SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0, idle_timeout_s=30.0)))
    address = f"localhost:{driver.port}"
    frontend = await start_frontend(auth_app, db_config, certs, blobs, driver_addresses=(address,))
    worker = None
    try:
        await eventually(lambda: driver.election.is_leader)
        assert driver.election.state.epoch is not None
        await JobStore(db).create_instance(driver.election.state.epoch, "w-use", "standard", 2000, "activate")
        certs.issue("worker-w-use")
        worker = await start_worker(WorkerConfig("w-use", "activate", 2000, (address,), certs.directory,
                                                 tmp_path / "scratch", f"file://{blobs}", heartbeat_interval_s=0.2,
                                                 unisolated_dev=os.geteuid() != 0, usage_interval_s=0.1),
                                    SampledProcessRuntime())  # type: ignore[arg-type]
        async for env in make_env(frontend, auth_app, db, clock, certs, blobs, elect=False):
            batch_id = await env.submit(job_spec_pb2.JobSpec(
                image="docker.io/library/busybox:1.36", script="while [ ! -e go ]; do sleep 0.05; done"))
            request = pb.GetAttemptUsageRequest(batch_id=batch_id, job_id=1)

            async def live_samples() -> pb.GetAttemptUsageResponse | None:
                try:
                    usage = await env.jobs.GetAttemptUsage(request, metadata=env.as_("bob"))
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.NOT_FOUND  # not scheduled yet
                    return None
                reported = usage.summary.HasField("cpu_time")  # a heartbeat's sample reached the database
                return usage if len(usage.samples) >= 3 and reported and not usage.complete else None

            live = await eventually(live_samples, what="samples of the running attempt from its worker")
            assert (live.runtime, live.interval.ToMilliseconds()) == ("process", 100)
            cpu = [s.cpu_time.ToMilliseconds() for s in live.samples]
            assert cpu == sorted(cpu) and all(s.memory_bytes == MIB for s in live.samples)
            (tmp_path / "scratch" / f"{batch_id}-1-{live.attempt_id}" / "work" / "go").touch()

            async def succeeded() -> bool:
                return await env.world.state(batch_id, 1) == "Success"

            await eventually(succeeded, what="the job's success")
            stored = await env.jobs.GetAttemptUsage(request, metadata=env.as_("alice"))
            assert (stored.attempt_id, stored.complete, stored.runtime) == (live.attempt_id, True, "process")
            assert len(stored.samples) > len(live.samples)
            assert [s.cpu_time.ToMilliseconds() for s in stored.samples[:len(cpu)]] == cpu
            final = stored.samples[-1]  # the end reading: the process runtime's rusage, no memory now
            assert not final.HasField("memory_bytes")
            assert final.peak_memory_bytes == stored.summary.peak_memory_bytes
    finally:
        if worker is not None:
            await worker.stop()
        await frontend.stop()
        await driver.stop()
