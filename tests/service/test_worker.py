"""The worker against a real driver, in-process: real gRPC with mutual TLS on
loopback, the real database, real subprocesses for the jobs.

The driver is `services.driver.app.start` (its loops run: the scheduler
places the jobs); workers are `services.worker.app.start`. The pools'
max_instances is 0 here so the autoscaler never starts worker processes
of its own (tests/service/test_worker_process.py covers that path).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiomysql
import grpc
import pytest

from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.driver.v1 import worker_session_pb2 as ws
from corral.worker.v1 import worker_service_pb2 as wpb
from corral.worker.v1 import worker_service_pb2_grpc, worker_status_pb2
from services.common.tls import DevCertificateAuthority, WorkerIssuer
from services.db.database import DatabaseConfig
from services.common.usage_series import decode
from services.db.invariants import check_invariants
from services.db.store import JobStore
from services.driver.app import DriverApp, DriverConfig, start as start_driver
from services.driver import servicer as servicer_module
from services.driver import sessions as sessions_module
from services.driver.scheduler import Placement
from services.driver.servicer import SessionSettings
from services.common.specs import SpecStore
from services.worker import agent as agent_module
from services.worker.app import WorkerApp, start as start_worker
from services.worker.config import WorkerConfig
from services.worker.runtime import ProcessRuntime, can_isolate
from tests.conftest import service_url
from tests.job_processes import marked, processes_marked
from tests.world import World

pytestmark = pytest.mark.timeout(60)

SETTINGS = SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0, idle_timeout_s=30.0)
FINAL = ("Success", "Failed", "Error", "Cancelled")


async def eventually(predicate: Callable[[], Any], timeout_s: float = 20.0, what: str = "condition") -> Any:
    """Poll `predicate` (sync or async) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.05)


def script(text: str, **fields: Any) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="docker.io/library/busybox:1.36", script=text, **fields)


WAIT_FOR_GO = "while [ ! -f go ]; do sleep 0.05; done"
"""Shell that waits until the test calls `Cluster.go` (a file in the job's own working directory)."""


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie not yet reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


@dataclasses.dataclass
class Cluster:
    """A leading driver, the test's world, and the workers started in it."""

    world: World
    driver: DriverApp
    certs: DevCertificateAuthority
    tmp_path: Path
    specs: SpecStore
    workers: list[WorkerApp] = dataclasses.field(default_factory=list)
    drivers: list[DriverApp] = dataclasses.field(default_factory=list)
    _refs: int = 0

    @property
    def driver_data_dir(self) -> Path:
        """The first driver's data directory, where the workers its local provider starts keep their scratch."""
        return self.tmp_path / "driver-a"

    @property
    def blobs(self) -> Path:
        return self.tmp_path / "blobs"

    @property
    def store(self) -> JobStore:
        return JobStore(self.driver.db)

    @property
    def epoch(self) -> int:
        epoch = self.driver.election.state.epoch
        assert epoch is not None
        return epoch

    def worker_certs(self, name: str) -> Path:
        """The worker's own certificate directory, as the local provider makes it."""
        return WorkerIssuer(self.certs.directory).provision_worker(name, self.tmp_path / "worker-certs" / name).key.parent
    def work_dir(self, scratch: Path, attempt: dict[str, Any]) -> Path:
        """The working directory of an attempt (a row of `attempts`) on the worker with this scratch root:
        the test, as root, may write there to tell the job something; a job sees nothing outside it."""
        return scratch / f"{attempt['batch_id']}-{attempt['job_id']}-{attempt['attempt_id']}" / "work"

    async def go(self, attempt: dict[str, Any], worker: str = "w1") -> None:
        """Let a job waiting with WAIT_FOR_GO go on (an in-process worker's attempt)."""
        (self.work_dir(self.tmp_path / "scratch" / worker, attempt) / "go").touch()

    async def instance(self, name: str, cores_mcpu: int = 2000, token: str = "", **overrides: Any) -> WorkerConfig:
        """Record a pending instance as the autoscaler would; the config its worker runs with."""
        token = token or f"activate-{name}"
        await self.store.create_instance(self.epoch, name, "standard", cores_mcpu, token)
        fields = dict(instance_name=name, activation_token=token, cores_mcpu=cores_mcpu,
                      driver_addresses=tuple(f"localhost:{d.port}" for d in self.drivers),
                      certs_dir=self.worker_certs(name), scratch_dir=self.tmp_path / "scratch" / name,
                      log_root_url=f"file://{self.blobs}", heartbeat_interval_s=0.2,
                      unisolated_dev=not can_isolate())
        fields.update(overrides)
        return WorkerConfig(**fields)  # type: ignore[arg-type]

    async def worker(self, name: str, cores_mcpu: int = 2000, runtime: ProcessRuntime | None = None,
                     **overrides: Any) -> WorkerApp:
        """An in-process worker on a new instance, activated and connected."""
        app = await start_worker(await self.instance(name, cores_mcpu, **overrides), runtime)
        self.workers.append(app)
        await eventually(lambda: app.worker.connected or app.agent.done(), what="worker connected")
        return app

    async def submit(self, *specs: job_spec_pb2.JobSpec, **job_fields: Any) -> tuple[int, list[int]]:
        """A committed batch of one job per spec (1 core each); its id and the job ids."""
        self._refs += 1
        refs = await self.specs.write_bunch(10_000 + self._refs, 1, 1, list(specs))
        batch_id, _, first = await self.world.batch([{"spec_ref": ref, **job_fields} for ref in refs])
        return batch_id, [first + i for i in range(len(specs))]

    async def job(self, batch_id: int, job_id: int) -> dict[str, Any]:
        row = await self.driver.db.fetchone("SELECT * FROM jobs WHERE batch_id = %s AND job_id = %s",
                                            (batch_id, job_id))
        assert row is not None
        return row

    async def final(self, batch_id: int, job_id: int, timeout_s: float = 30.0) -> dict[str, Any]:
        """The job's row once it is final."""
        async def done() -> dict[str, Any] | None:
            row = await self.job(batch_id, job_id)
            return row if row["state"] in FINAL else None
        return await eventually(done, timeout_s, f"job {batch_id}/{job_id} final")

    async def attempts(self, batch_id: int, job_id: int) -> list[dict[str, Any]]:
        return await self.driver.db.fetchall(
            "SELECT * FROM attempts WHERE batch_id = %s AND job_id = %s ORDER BY COALESCE(start_time_ms, 0), "
            "attempt_id", (batch_id, job_id))

    async def started(self, batch_id: int, job_id: int) -> dict[str, Any]:
        """The job's current attempt once MJS recorded its start."""
        async def attempt() -> dict[str, Any] | None:
            job = await self.job(batch_id, job_id)
            rows = [a for a in await self.attempts(batch_id, job_id)
                    if a["attempt_id"] == job["attempt_id"] and a["start_time_ms"] is not None]
            return rows[0] if rows else None
        return await eventually(attempt, what=f"job {batch_id}/{job_id} started")

    async def instance_row(self, name: str) -> dict[str, Any]:
        row = await self.driver.db.fetchone("SELECT * FROM instances WHERE name = %s", (name,))
        assert row is not None
        return row


async def leading_driver(db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path, name: str,
                         session: SessionSettings = SETTINGS, **config: Any) -> DriverApp:
    app = await start_driver(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                          tmp_path / name, session=session, **config))
    return app


ClusterFactory = Callable[..., Awaitable[Cluster]]


@pytest.fixture
async def make_cluster(world: World, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                       tmp_path: Path) -> AsyncIterator[ClusterFactory]:
    """`await make_cluster(session=..., autoscale=False)`: a leading driver on the test's database."""
    clusters: list[Cluster] = []

    async def make(session: SessionSettings = SETTINGS, autoscale: bool = False, **config: Any) -> Cluster:
        if not autoscale:
            await world.db.execute("UPDATE instance_collections SET max_instances = 0")
        driver = await leading_driver(db_config, certs, tmp_path, "driver-a", session, **config)
        cluster = Cluster(world, driver, certs, tmp_path, SpecStore(f"file://{tmp_path / 'blobs'}"),
                          drivers=[driver])
        clusters.append(cluster)
        await eventually(lambda: driver.election.is_leader, what="driver leading")
        return cluster

    try:
        yield make
    finally:
        for cluster in clusters:
            for worker in cluster.workers:  # before the drivers: they deactivate through them
                if not worker.agent.done():
                    await worker.stop()
                else:
                    await worker.wait()
            for driver in cluster.drivers:
                await driver.stop()


@pytest.fixture
async def cluster(make_cluster: ClusterFactory) -> Cluster:
    return await make_cluster()


def worker_stub(cluster: Cluster, address: str, identity: str = "frontend",
                with_client_cert: bool = True) -> tuple[grpc.aio.Channel, worker_service_pb2_grpc.WorkerServiceStub]:
    """What the frontend opens to a worker at instances.ip_address."""
    credentials = cluster.certs.issue(identity).channel_credentials(with_client_cert=with_client_cert)
    channel = grpc.aio.secure_channel(address, credentials)
    return channel, worker_service_pb2_grpc.WorkerServiceStub(channel)


# ---------------------------------------------------------------- running jobs


async def test_a_job_runs_and_its_log_is_uploaded(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    assert (await cluster.instance_row("w1"))["ip_address"] == worker.address
    batch_id, [job_id] = await cluster.submit(script("echo hello; echo to stderr >&2"))
    job = await cluster.final(batch_id, job_id)
    assert (job["state"], job["exit_code"]) == ("Success", 0)
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["instance_name"] == "w1"
    assert (attempt["exit_code"], attempt["error_message"], attempt["reason"]) == (0, None, "exited")
    assert "no container isolated this job" in attempt["isolation"]
    assert "busybox:1.36" in attempt["isolation"]
    assert attempt["cpu_time_ms"] is not None and attempt["peak_memory_bytes"] > 0
    assert attempt["start_time_ms"] <= attempt["end_time_ms"]
    uploaded = cluster.blobs / "logs" / str(batch_id) / str(job_id) / attempt["attempt_id"] / "main.log"
    assert uploaded.read_bytes() == b"hello\nto stderr\n"
    # Its usage series beside the log: the process runtime samples nothing while a job runs, and says so.
    header, [final] = decode((uploaded.parent / "usage.jsonl").read_bytes())
    assert (header.runtime, header.interval_ms, "does not sample" in header.note) == ("process", 0, True)
    assert (final.at_ms, final.reading.cpu_time_ms, final.reading.peak_memory_bytes) == (
        attempt["end_time_ms"], attempt["cpu_time_ms"], attempt["peak_memory_bytes"])
    assert (await cluster.world.batch_row(batch_id))["state"] == "complete"
    assert await check_invariants(cluster.driver.db) == []


async def test_a_failing_job_records_its_exit_code_and_message(cluster: Cluster) -> None:
    await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script("echo doomed; exit 3"))
    job = await cluster.final(batch_id, job_id)
    assert (job["state"], job["exit_code"]) == ("Failed", 3)
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert (attempt["exit_code"], attempt["error_message"], attempt["reason"]) == (3, "exited with code 3", "exited")
    assert await check_invariants(cluster.driver.db) == []


async def test_a_spec_the_runtime_refuses_is_an_error_that_says_why(cluster: Cluster) -> None:
    await cluster.worker("w1")
    refused = script("echo never", network_mode=job_spec_pb2.NETWORK_MODE_PRIVATE)
    batch_id, [job_id] = await cluster.submit(refused)
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Error"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["reason"] == "refused"  # not retried: the spec has to change
    assert "network_mode NETWORK_MODE_PRIVATE cannot be enforced" in attempt["error_message"]
    assert await check_invariants(cluster.driver.db) == []


async def test_a_job_that_does_not_fit_the_worker_now_ends_as_a_system_error_and_runs_elsewhere(
        cluster: Cluster) -> None:
    """The scheduler places by the database's view of a worker, which may be stale; the worker holds each
    RunJob to what it has free now (memory and scratch storage too) and ends one that does not fit as a
    system error: not the job's failure, and the job runs again on another worker."""
    gib = 2**30
    await cluster.worker("w1", memory_bytes=gib, storage_bytes=gib)
    await cluster.worker("w2", memory_bytes=8 * gib, storage_bytes=8 * gib)
    assert (await cluster.instance_row("w2"))["storage_bytes"] == 8 * gib  # the storage the worker reported
    # The database no longer knows w1's memory or storage (stale), so the planner places on it first-fit.
    await cluster.world.db.execute("UPDATE instances SET memory_bytes = 0, storage_bytes = 0 WHERE name = 'w1'")
    disk_hungry, [disk_job] = await cluster.submit(script("echo stored"), storage_bytes=2 * gib)
    memory_hungry, [memory_job] = await cluster.submit(script("echo remembered"), memory_bytes=2 * gib)
    words = {(disk_hungry, disk_job): "2 GiB of scratch storage asked, 1 GiB of 1 GiB free",
             (memory_hungry, memory_job): "2 GiB of memory asked, 1 GiB of 1 GiB free"}
    for (batch_id, job_id), said in words.items():
        job = await cluster.final(batch_id, job_id)
        assert (job["state"], job["n_failed_retries"]) == ("Success", 0)
        first, second = sorted(await cluster.attempts(batch_id, job_id), key=lambda a: a["end_time_ms"])
        assert (first["instance_name"], first["reason"], first["start_time_ms"]) == ("w1", "system_error", None)
        assert said in first["error_message"] and "not the job's failure" in first["error_message"]
        assert first["retry_reason"] == "system error on w1: not a failure; the next attempt runs elsewhere"
        assert (second["instance_name"], second["reason"]) == ("w2", "exited")
    assert await check_invariants(cluster.driver.db) == []


async def test_the_worker_copies_files_only_under_the_projects_storage_roots(make_cluster: ClusterFactory,
                                                                            tmp_path: Path) -> None:
    """Defence in depth: the worker checks each file URL against the roots the driver sent with the
    job before copying anything (here the spec never went through the frontend's check)."""
    storage = tmp_path / "storage"
    cluster = await make_cluster(storage_roots=(f"file://{storage}/{{project}}/",))
    await cluster.worker("w1")
    (storage / "proj").mkdir(parents=True)
    (storage / "proj" / "in.txt").write_text("data")
    ca_key = cluster.certs.directory / "ca.key"
    fine = script("cp in/in.txt out.txt", input_files=[job_spec_pb2.InputFile(
        from_url=f"file://{storage}/proj/in.txt", to_path="/in/in.txt")], output_files=[job_spec_pb2.OutputFile(
            from_path="/out.txt", to_url=f"file://{storage}/proj/result/out.txt")])
    stolen = script("true", input_files=[job_spec_pb2.InputFile(from_url=f"file://{ca_key}", to_path="/in/ca.key")])
    planted = script("echo x > x", output_files=[job_spec_pb2.OutputFile(
        from_path="/x", to_url=f"file://{storage}/other/x")])
    batch_id, job_ids = await cluster.submit(fine, stolen, planted)
    rows = [await cluster.final(batch_id, job_id) for job_id in job_ids]
    assert [r["state"] for r in rows] == ["Success", "Error", "Error"]
    assert (storage / "proj" / "result" / "out.txt").read_text() == "data"
    [_, stolen_attempt, planted_attempt] = [(await cluster.attempts(batch_id, j))[0] for j in job_ids]
    assert stolen_attempt["error_message"] == (
        f"input URL 'file://{ca_key}' refused: not under a storage root of the billing project "
        f"(file://{storage}/proj/)")
    assert planted_attempt["reason"] == "refused"
    assert planted_attempt["start_time_ms"] is None  # the command never ran
    assert not (storage / "other").exists()
    assert await check_invariants(cluster.driver.db) == []


async def test_cancel_job_stops_a_running_job_and_its_processes(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    job_spec, mark = marked(script("sleep 60 & wait"))
    batch_id, [job_id] = await cluster.submit(job_spec)
    attempt = await cluster.started(batch_id, job_id)
    await eventually(lambda: len(processes_marked(mark)) == 2, what="the job's processes")
    assert cluster.driver.sessions is not None
    assert cluster.driver.sessions.cancel("w1", batch_id, job_id, attempt["attempt_id"], "the test says so")
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Cancelled"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["reason"] == "cancelled"
    assert "cancelled while running" in attempt["error_message"]
    await eventually(lambda: not processes_marked(mark), what="job processes gone")
    assert not worker.worker.attempts.running()
    assert await check_invariants(cluster.driver.db) == []


async def test_a_start_in_a_cancelled_batch_is_stopped_at_once(cluster: Cluster) -> None:
    """The batch is cancelled while the RunJob is in flight: MJS refuses the start
    and the driver answers with CancelJob, so the job does not run on."""
    runtime = GatedRuntime()
    await cluster.worker("w1", runtime=runtime)
    go = cluster.tmp_path / "go"
    batch_id, [job_id] = await cluster.submit(script(f"while [ ! -f {go} ]; do sleep 0.05; done; echo ran"))
    job = await eventually(lambda: _running(cluster, batch_id, job_id), what="job scheduled")
    await cluster.world.store.cancel_job_group(batch_id, 0, "alice", "changed my mind")
    runtime.go.set()  # the RunJob "arrives" now: the command starts, then MJS says cancelled
    final = await cluster.final(batch_id, job_id)
    assert final["state"] == "Cancelled"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["attempt_id"] == job["attempt_id"]
    assert attempt["isolation"] is None  # MJS recorded no start
    assert attempt["reason"] == "cancelled"
    assert await check_invariants(cluster.driver.db) == []


class GatedRuntime(ProcessRuntime):
    """The process runtime, whose attempts start only once the test says go: it stands for
    a RunJob still in flight (the real one runs the command as usual)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def run(self, job: Any, log: Any, on_started: Any) -> Any:
        await self.go.wait()
        return await super().run(job, log, on_started)


async def _running(cluster: Cluster, batch_id: int, job_id: int) -> dict[str, Any] | None:
    job = await cluster.job(batch_id, job_id)
    return job if job["state"] == "Running" else None


class _row_lock:
    """Holds a job's row lock on a connection of its own, so procedures that need it wait."""

    def __init__(self, cluster: Cluster, batch_id: int, job_id: int):
        self._config = cluster.world.db.config
        self._key = (batch_id, job_id)
        self._conn: aiomysql.Connection | None = None

    async def __aenter__(self) -> None:
        self._conn = await aiomysql.connect(**self._config.connect_kwargs())
        async with self._conn.cursor() as cursor:
            await cursor.execute("START TRANSACTION")
            await cursor.execute("SELECT job_id FROM jobs WHERE batch_id = %s AND job_id = %s FOR UPDATE", self._key)

    async def __aexit__(self, *exc: object) -> None:
        assert self._conn is not None
        await self._conn.rollback()
        self._conn.close()


async def _completion_waiting(cluster: Cluster) -> int:
    """How many completions wait on complete_jobs_core's job row locks (the statement shows in
    the process list while it waits)."""
    row = await cluster.world.db.fetchone(  # the administrator sees every account's statements
        "SELECT COUNT(*) AS n FROM information_schema.PROCESSLIST "
        "WHERE INFO LIKE '%%FROM tmp_job_completions t%%JOIN jobs j%%FOR UPDATE%%' "
        "AND INFO NOT LIKE '%%PROCESSLIST%%'")
    return int(row["n"]) if row else 0


# ---------------------------------------------------------------- the session


async def test_events_are_resent_after_a_session_break_and_recorded_once(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(f"{WAIT_FOR_GO}; echo done"))
    attempt = await cluster.started(batch_id, job_id)
    async with _row_lock(cluster, batch_id, job_id):
        await cluster.go(attempt)
        # The worker reported the end; the driver's MJC waits for the lock, so no ack came back.
        await eventually(lambda: _completion_waiting(cluster), what="MJC waiting")
        assert any(e.WhichOneof("payload") == "job_completed" for e in worker.worker.unacked.values())
        worker.worker.drop_session()
        await eventually(lambda: worker.worker.sessions_opened >= 2 and worker.worker.connected,
                         what="a new session")
    await eventually(lambda: not worker.worker.unacked, what="every event acknowledged")
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Success"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["exit_code"] == 0
    counts = await cluster.driver.db.fetchone(
        "SELECT SUM(n_completed) AS n, SUM(n_succeeded) AS s FROM job_groups_n_jobs_in_complete_states "
        "WHERE batch_id = %s AND job_group_id = 0", (batch_id,))
    assert (counts["n"], counts["s"]) == (1, 1)
    assert await check_invariants(cluster.driver.db) == []


async def test_heartbeats_roll_up_billing_while_a_job_runs(cluster: Cluster) -> None:
    await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(WAIT_FOR_GO))
    attempt = await cluster.started(batch_id, job_id)

    async def rolled_up() -> bool:
        row = (await cluster.attempts(batch_id, job_id))[0]
        return row["rollup_time_ms"] > attempt["start_time_ms"]

    await eventually(rolled_up, what="a rollup past the start")
    assert (await cluster.instance_row("w1"))["last_heartbeat_ms"] >= attempt["start_time_ms"]
    await cluster.go(attempt)
    await cluster.final(batch_id, job_id)
    assert await check_invariants(cluster.driver.db) == []


# ---------------------------------------------------------------- WorkerService


async def test_a_running_jobs_log_is_readable_over_worker_service(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(f"echo line one; {WAIT_FOR_GO}; echo line two"))
    attempt = await cluster.started(batch_id, job_id)
    attempt_id = attempt["attempt_id"]
    address = (await cluster.instance_row("w1"))["ip_address"]
    channel, stub = worker_stub(cluster, address)
    async with channel:
        request = wpb.GetJobLogRequest(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id)

        async def first_line() -> wpb.GetJobLogResponse | None:
            response = await stub.GetJobLog(request)
            return response if response.data == b"line one\n" else None

        response = await eventually(first_line, what="the first line")
        assert (response.start_byte, response.total_bytes, response.complete) == (0, 9, False)

        status = await stub.GetStatus(wpb.GetStatusRequest())
        assert (status.instance_name, status.runtime_kind, status.isolated, status.connected) == (
            "w1", worker_status_pb2.RUNTIME_KIND_PROCESS, False, True)
        assert [a.attempt_id for a in status.running_attempts] == [attempt_id]
        assert status.free_cores_mcpu == 1000
        assert list((await stub.ListImages(wpb.ListImagesRequest())).images) == []

        stream = stub.StreamJobLog(wpb.StreamJobLogRequest(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id))
        chunks = [await stream.read()]
        await cluster.go(attempt)
        while (chunk := await stream.read()) is not grpc.aio.EOF:
            chunks.append(chunk)
        assert b"".join(c.data for c in chunks) == b"line one\nline two\n"
        assert [c.start_byte for c in chunks][0] == 0

        await cluster.final(batch_id, job_id)
        tail = await stub.GetJobLog(wpb.GetJobLogRequest(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id,
                                                         start_byte=-9))
        assert (tail.data, tail.start_byte, tail.total_bytes, tail.complete) == (b"line two\n", 9, 18, True)

        for bad, code in [
            (wpb.GetJobLogRequest(batch_id=batch_id, job_id=job_id, attempt_id="unknown"), grpc.StatusCode.NOT_FOUND),
            (wpb.GetJobLogRequest(batch_id=batch_id, job_id=job_id), grpc.StatusCode.INVALID_ARGUMENT),
            (wpb.GetJobLogRequest(batch_id=batch_id, job_id=job_id, attempt_id=attempt_id, max_bytes=-1),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.GetJobLog(bad)
            assert error.value.code() == code
    assert worker.worker.attempts.get((batch_id, job_id, attempt_id)) is not None


async def test_worker_service_refuses_callers_that_are_not_corral_services(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    anonymous, stub = worker_stub(cluster, worker.address, with_client_cert=False)
    async with anonymous:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.GetStatus(wpb.GetStatusRequest(), timeout=5)
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
    other_worker, stub = worker_stub(cluster, worker.address, identity="worker-w2")
    async with other_worker:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.GetJobLog(wpb.GetJobLogRequest(batch_id=1, job_id=1, attempt_id="a"))
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED


# ---------------------------------------------------------------- leaving


async def test_an_idle_worker_deactivates_itself_and_exits_0(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0,
                                                 idle_timeout_s=1.0))
    batch_id, [job_id] = await cluster.submit(script("true"))
    worker = await cluster.worker("w1")
    await cluster.final(batch_id, job_id)
    assert await asyncio.wait_for(worker.wait(), 20) == 0
    row = await cluster.instance_row("w1")
    assert (row["state"], row["deactivation_reason"]) == ("inactive", "worker deactivated itself")
    assert await check_invariants(cluster.driver.db) == []


def intercept_the_first_run(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                            first: Callable[[Callable[[list[Placement]], Awaitable[None]], list[Placement]],
                                            Awaitable[None]]) -> list[Placement]:
    """The driver's first Run commands go to `first(send_for_real, placements)` instead; later ones as usual.
    Returns the first placements (filled once the scheduler sends them)."""
    assert cluster.driver.sessions is not None
    sessions, seen = cluster.driver.sessions, []
    send_for_real = sessions.run

    async def run(placements: list[Placement]) -> None:
        if seen:
            await send_for_real(placements)
            return
        seen.extend(placements)
        await first(send_for_real, placements)

    monkeypatch.setattr(sessions, "run", run)
    return seen


async def test_a_runjob_that_never_arrived_is_sent_again_on_the_next_session(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RunJob lost with its session (or never sent: a leader paused after its scheduler committed)
    would leave the attempt open, and its job waiting, until the worker left. The next session starts
    with it again; the attempt runs once, under the attempt id it was scheduled with."""
    worker = await cluster.worker("w1")

    async def lose(send_for_real: Callable[[list[Placement]], Awaitable[None]], placements: list[Placement]) -> None:
        pass

    lost = intercept_the_first_run(cluster, monkeypatch, lose)
    batch_id, [job_id] = await cluster.submit(script("true"))
    await eventually(lambda: lost, what="the scheduler placing the job")
    await asyncio.sleep(1.0)
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["start_time_ms"] is None  # the worker never heard of it
    worker.worker.drop_session()
    assert (await cluster.final(batch_id, job_id))["state"] == "Success"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["attempt_id"] == lost[0].attempt_id and attempt["reason"] != "worker_lost"
    # A later session has nothing to send again: the attempt has ended.
    worker.worker.drop_session()
    await eventually(lambda: worker.worker.sessions_opened >= 3, what="a third session")
    await asyncio.sleep(0.5)
    assert len(await cluster.attempts(batch_id, job_id)) == 1
    assert await check_invariants(cluster.driver.db) == []


async def test_a_runjob_refused_after_its_deadline_ends_its_attempt_at_once_and_the_job_runs_again(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A RunJob the worker refuses (it came after its deadline, or while the worker leaves) used to leave its
    attempt open until the worker was declared gone, minutes later for an idle one. The worker now ends it
    at once as a system error: the job runs again under a new attempt, not counted as a failure."""
    await cluster.worker("w1")

    async def send_late(send_for_real: Callable[[list[Placement]], Awaitable[None]],
                        placements: list[Placement]) -> None:
        monkeypatch.setattr(sessions_module, "RUN_DEADLINE_MS", -60_000)  # its deadline has passed
        try:
            await send_for_real(placements)
        finally:
            monkeypatch.setattr(sessions_module, "RUN_DEADLINE_MS", 60_000)

    late = intercept_the_first_run(cluster, monkeypatch, send_late)
    batch_id, [job_id] = await cluster.submit(script("true"))

    async def refused() -> list[dict[str, Any]]:
        return [a for a in await cluster.attempts(batch_id, job_id) if a["reason"] == "system_error"]

    job = await cluster.final(batch_id, job_id)
    assert (job["state"], job["n_failed_retries"]) == ("Success", 0)
    [first] = await refused()
    assert first["attempt_id"] == late[0].attempt_id
    assert first["start_time_ms"] is None and first["end_time_ms"] is not None
    assert "the RunJob arrived after its deadline: not the job's failure" in first["error_message"]
    assert [a["reason"] for a in await cluster.attempts(batch_id, job_id)][-1] == "exited"
    assert await check_invariants(cluster.driver.db) == []


async def test_run_commands_that_cannot_be_made_end_their_attempts_and_the_jobs_run_again(
        cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """After SJ committed, the Run commands could not be made (a spec unreadable for a moment): the attempts
    end at once as system errors and their jobs run on the next cycle, instead of waiting for their idle
    worker to be declared gone."""
    await cluster.worker("w1")

    async def fail(send_for_real: Callable[[list[Placement]], Awaitable[None]], placements: list[Placement]) -> None:
        raise OSError("the spec store is away")

    failed = intercept_the_first_run(cluster, monkeypatch, fail)
    batch_id, [job_id] = await cluster.submit(script("true"))
    job = await cluster.final(batch_id, job_id)
    assert (job["state"], job["n_failed_retries"]) == ("Success", 0)
    first, second = sorted(await cluster.attempts(batch_id, job_id), key=lambda a: a["end_time_ms"])
    assert first["attempt_id"] == failed[0].attempt_id
    assert (first["reason"], first["start_time_ms"]) == ("system_error", None)
    assert "its Run command could not be sent: OSError: the spec store is away" in first["error_message"]
    assert second["reason"] == "exited"
    assert await check_invariants(cluster.driver.db) == []


async def test_a_runjob_for_an_attempt_whose_completion_waits_for_its_ack_is_ignored(cluster: Cluster) -> None:
    """Ended long ago (gone from the attempt table) but its completion not yet recorded: a RunJob sent
    again for it must not run it a second time."""
    worker = await cluster.worker("w1")
    ref = ws.AttemptRef(batch_id=99, job_id=1, attempt_id="ran-already")
    worker.worker.unacked[10**9] = pb.WorkerSessionRequest(
        event_id=10**9, job_completed=ws.JobCompleted(attempt=ref))
    assert worker.worker._start(ws.RunJob(attempt=ref, spec=script("true"), cores_mcpu=1000)) == ""
    assert worker.worker.attempts.get((99, 1, "ran-already")) is None
    del worker.worker.unacked[10**9]


async def test_a_job_sent_before_the_driver_heard_of_an_idle_drain_still_runs(
        make_cluster: ClusterFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race behind attempts 'lost' at an idle worker's exit: the scheduler read which workers take
    jobs before the worker's Draining reached it, and sent a RunJob after the worker began to leave. The
    worker runs it (it has not deactivated yet) and leaves after; the attempt is not ended by the
    deactivation, and the job does not run twice."""
    monkeypatch.setattr(agent_module, "DRAIN_SETTLE_S", 10.0)  # the scheduler's next cycle lands in it
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0,
                                                 idle_timeout_s=1.0))
    worker = await cluster.worker("w1")
    await eventually(lambda: worker.worker.draining, what="the idle worker draining")
    assert cluster.driver.sessions is not None
    await eventually(lambda: "w1" not in cluster.driver.sessions.live_instances(), what="the driver hearing it")
    # A scheduler cycle that read the live workers before it heard the Draining.
    monkeypatch.setattr(cluster.driver.sessions, "live_instances", lambda: {"w1"})
    batch_id, [job_id] = await cluster.submit(script("true"))
    assert (await cluster.final(batch_id, job_id))["state"] == "Success"
    assert await asyncio.wait_for(worker.wait(), 30) == 0
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["reason"] != "worker_lost"
    assert (await cluster.instance_row("w1"))["deactivation_reason"] == "worker deactivated itself"
    assert await check_invariants(cluster.driver.db) == []


async def test_sigterm_kills_running_jobs_which_go_back_to_ready(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    job_spec, mark = marked(script("sleep 60 & wait"))
    batch_id, [job_id] = await cluster.submit(job_spec)
    first = await cluster.started(batch_id, job_id)
    await eventually(lambda: len(processes_marked(mark)) == 2, what="the job's processes")
    assert await worker.stop() == 0
    await eventually(lambda: not processes_marked(mark), what="job processes gone")
    assert (await cluster.job(batch_id, job_id))["state"] == "Ready"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert (attempt["attempt_id"], attempt["reason"]) == (first["attempt_id"], "worker_lost")
    assert (await cluster.instance_row("w1"))["state"] == "inactive"
    # It runs again as a new attempt on the next worker.
    await cluster.worker("w2")
    await eventually(lambda: _running(cluster, batch_id, job_id), what="a second attempt")
    assert len(await cluster.attempts(batch_id, job_id)) == 2
    assert await check_invariants(cluster.driver.db) == []


async def test_a_shutdown_bills_the_jobs_it_kills_up_to_the_kill(make_cluster: ClusterFactory) -> None:
    """Deactivation bills an attempt only up to its worker's last report (what nobody reported is not
    billed): so a worker shutting down reports its running attempts once more before killing them.
    Heartbeats here are 30 s apart: without that last report the attempt would be billed nothing."""
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=30.0, heartbeat_timeout_s=120.0,
                                                 idle_timeout_s=60.0))
    worker = await cluster.worker("w1")
    job_spec, mark = marked(script("sleep 60 & wait"))
    batch_id, [job_id] = await cluster.submit(job_spec)
    first = await cluster.started(batch_id, job_id)
    await eventually(lambda: len(processes_marked(mark)) == 2, what="the job's processes")
    await eventually(lambda: time.time() * 1000 > first["start_time_ms"] + 200, what="the job running a while")
    assert await worker.stop() == 0
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["reason"] == "worker_lost"
    assert attempt["start_time_ms"] + 200 <= attempt["rollup_time_ms"] <= attempt["end_time_ms"]
    usage = await cluster.driver.db.fetchone(
        "SELECT a.`usage` FROM aggregated_job_resources a JOIN resources r USING (resource_id) "
        "WHERE a.batch_id = %s AND a.job_id = %s AND r.name = 'cpu/local/1'", (batch_id, job_id))
    assert usage["usage"] == 1000 * (attempt["rollup_time_ms"] - attempt["start_time_ms"])
    assert await check_invariants(cluster.driver.db) == []


async def test_drain_finishes_running_jobs_then_deactivates(cluster: Cluster) -> None:
    worker = await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(WAIT_FOR_GO))
    attempt = await cluster.started(batch_id, job_id)
    assert cluster.driver.sessions is not None
    cluster.driver.sessions.send("w1", pb.WorkerSessionResponse(drain=ws.Drain(reason="maintenance")))
    await eventually(lambda: worker.worker.draining, what="draining")
    assert "w1" not in cluster.driver.sessions.live_instances()  # nothing new is scheduled there
    assert "w1" in cluster.driver.sessions.connected_instances()  # but commands still reach it
    assert not worker.agent.done()
    await cluster.go(attempt)
    assert await asyncio.wait_for(worker.wait(), 20) == 0
    assert (await cluster.job(batch_id, job_id))["state"] == "Success"
    assert (await cluster.instance_row("w1"))["state"] == "inactive"
    assert await check_invariants(cluster.driver.db) == []


# ---------------------------------------------------------------- activation


async def test_a_worker_newer_than_its_driver_leaves_saying_why(cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """A driver from before session protocols were numbered welcomes with 0 (protocol 1): this worker, of a
    newer protocol, does not work for it (drivers are upgraded first). It leaves and exits as refused."""
    monkeypatch.setattr(servicer_module, "PROTOCOL", 0)
    app = await cluster.worker("w1")
    assert await asyncio.wait_for(app.wait(), 20) == agent_module.EXIT_DEACTIVATED
    assert not app.worker.sessions_opened
    assert (f"leaving the session: the driver speaks session protocol 1, older than this worker's "
            f"{agent_module.PROTOCOL}: upgrade the drivers before the workers") in caplog.text


async def test_a_wrong_activation_token_exits_2(cluster: Cluster) -> None:
    config = dataclasses.replace(await cluster.instance("w1"), activation_token="forged")
    app = await start_worker(config)
    cluster.workers.append(app)
    assert await asyncio.wait_for(app.wait(), 20) == 2
    assert (await cluster.instance_row("w1"))["state"] == "pending"


async def test_a_malformed_worker_address_is_refused_and_writes_nothing(cluster: Cluster) -> None:
    await cluster.instance("w1")
    async with grpc.aio.secure_channel(f"localhost:{cluster.driver.port}",
                                       cluster.certs.issue("worker-w1").channel_credentials()) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="w1", activation_token="activate-w1",
                                                               address="no port here"))
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    row = await cluster.instance_row("w1")
    assert (row["state"], row["ip_address"]) == ("pending", None)


# ---------------------------------------------------------------- failover


async def test_after_failover_the_worker_reports_to_the_new_leader(cluster: Cluster, db_config: DatabaseConfig,
                                                                  tmp_path: Path) -> None:
    standby = await leading_driver(db_config, cluster.certs, tmp_path, "driver-b")
    cluster.drivers.append(standby)
    await eventually(lambda: standby.election.state.leader == f"localhost:{cluster.driver.port}", what="standby")
    worker = await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(script(f"{WAIT_FOR_GO}; echo survived"))
    running = await cluster.started(batch_id, job_id)
    old = cluster.driver
    await old.stop()
    cluster.drivers.remove(old)
    cluster.driver = standby
    await eventually(lambda: standby.election.is_leader, what="the standby leads")
    await cluster.go(running)
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Success"
    await eventually(lambda: not worker.worker.unacked and worker.worker.connected, what="acknowledged by the new leader")
    assert worker.worker.sessions_opened >= 2
    assert standby.sessions is not None and "w1" in standby.sessions.live_instances()
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["exit_code"] == 0
    log = cluster.blobs / "logs" / str(batch_id) / str(job_id) / attempt["attempt_id"] / "main.log"
    assert log.read_bytes() == b"survived\n"
    assert await check_invariants(standby.db) == []
