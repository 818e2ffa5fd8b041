"""JobService over real gRPC: jobs, attempts, logs from storage and from a
running worker, the query language with pages, and ExplainJob.

Jobs are submitted through BatchService (so their specs are in blob
storage) and moved through their states with the driver's procedures on the
same database (`tests.world.World`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.aio import Client
from corral.batch.v1 import (
    batch_service_pb2_grpc,
    job_explanation_pb2,
    job_group_pb2,
    job_group_service_pb2_grpc,
    job_pb2,
    job_service_pb2_grpc,
    job_spec_pb2,
    job_state_pb2,
    secret_service_pb2_grpc,
)
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as pb
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.sealing import ensure_key_files
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.driver.app import DriverConfig
from services.driver.app import start as start_driver
from services.driver.servicer import SessionSettings
from services.frontend.app import FrontendApp, FrontendConfig, start
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from services.worker.logs import LogSink
from tests.conftest import service_url
from tests.service.conftest import bearer, limits_for_tests, person_channel
from tests.service.test_driver_app import eventually
from tests.world import FakeClock, World

HOUR_MS = 3_600_000


@dataclasses.dataclass
class Env:
    """A frontend, people with tokens, stubs, and the driver's procedures on the same database."""

    frontend: FrontendApp
    world: World
    blobs: Path
    tokens: dict[str, str]
    """alice owns the batches, bob is another member of 'proj', carol is outside it, root is an admin."""
    batches: batch_service_pb2_grpc.BatchServiceStub
    jobs: job_service_pb2_grpc.JobServiceStub
    groups: job_group_service_pb2_grpc.JobGroupServiceStub
    secrets: secret_service_pb2_grpc.SecretServiceStub | None = None
    secrets_key: Path | None = None
    """The private key that opens the secrets the frontend sealed (what a driver is given), if it has one."""

    def as_(self, who: str) -> tuple[tuple[str, str], ...]:
        return bearer(self.tokens[who])

    async def submit(self, *specs: job_spec_pb2.JobSpec, groups: tuple = (), who: str = "alice",
                     token: str = "") -> int:
        response = await self.batches.SubmitBatch(bpb.SubmitBatchRequest(
            billing_project="proj", jobs=list(specs), job_groups=list(groups),
            idempotency_token=token or uuid.uuid4().hex),
            metadata=self.as_(who))
        return response.batch.batch_id


def spec(*parents: int, name: str = "", **kwargs) -> job_spec_pb2.JobSpec:
    """A job; parents are relative offsets within its update."""
    return job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                attributes={"name": name} if name else {},
                                parents=[job_spec_pb2.ParentRef(in_update_offset=p) for p in parents], **kwargs)


async def start_frontend(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, blobs: Path,
                         **config) -> FrontendApp:
    """A frontend on port 0, its users' quotas lifted unless `config` gives limits (tests.service.conftest)."""
    config.setdefault("limits", limits_for_tests())
    return await start(FrontendConfig(service_url(db_config, "frontend"), certs.directory, f"localhost:{auth_app.internal_port}",
                                      f"file://{blobs}", **config))


async def make_env(frontend: FrontendApp, auth_app: AuthApp, db: Database, clock: FakeClock,
                   certs: DevCertificateAuthority, blobs: Path, elect: bool = True,
                   secrets_key: Path | None = None) -> AsyncIterator[Env]:
    """People, projects and stubs; with `elect`, a leader epoch of the test's own (without a real driver)."""
    people = AuthStore(auth_app.db)
    tokens = {}
    for name in ("alice", "bob", "carol"):
        await people.create_user(name)
        tokens[name] = (await people.create_token(name, "api"))[1]
    tokens["root"] = (await people.ensure_admin("root"))[1]
    store = JobStore(db, clock)
    await store.create_billing_project("proj", ["alice", "bob"])
    await store.create_billing_project("elsewhere", ["carol"])
    world = World(db, store, clock)
    if elect:
        world.epoch = await store.elect_leader("driver-0")
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        yield Env(frontend, world, blobs, tokens, batch_service_pb2_grpc.BatchServiceStub(channel),
                  job_service_pb2_grpc.JobServiceStub(channel), job_group_service_pb2_grpc.JobGroupServiceStub(channel),
                  secret_service_pb2_grpc.SecretServiceStub(channel), secrets_key)


def secrets_key_pair(directory: Path) -> tuple[Path, Path]:
    """A deployment's key pair for job secrets (private, public), made in `directory`."""
    private, public = directory / "secrets.key", directory / "secrets.pub"
    ensure_key_files(private, public)
    return private, public


@pytest.fixture
async def env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
              certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[Env]:
    private, public = secrets_key_pair(tmp_path)
    frontend = await start_frontend(auth_app, db_config, certs, tmp_path / "blobs", secrets_public_key_file=public)
    try:
        async for value in make_env(frontend, auth_app, db, clock, certs, tmp_path / "blobs", secrets_key=private):
            yield value
    finally:
        await frontend.stop()


async def refused(call) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    return error.value


def violations(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)
    assert status is not None
    details = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(details)
    return [v.field for v in details.field_violations]


async def complete(env: Env, batch_id: int, job_id: int, attempt: str, state: str, **outcome) -> None:
    w = env.world
    await w.store.mark_jobs_complete(w.epoch, "i1", [{
        "batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "state": state,
        "start_time_ms": w.clock(), "end_time_ms": w.clock(), **outcome}])


async def test_get_job_with_spec_attempts_outcome_and_cost(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(name="fetch"), spec(-1, name="align", env={"K": "v"}))
    attempt = await w.run(batch_id, 1)
    await w.store.add_attempt_resources(w.epoch, [{"batch_id": batch_id, "job_id": 1, "attempt_id": attempt,
                                                   "resource": "cpu/local/1", "quantity": 1000}])
    w.clock.advance(HOUR_MS)
    await w.store.heartbeat_rollup(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 1, "attempt_id": attempt,
                                                    "rollup_time_ms": w.clock()}])
    await complete(env, batch_id, 1, attempt, "Failed", exit_code=3, reason="exited", error_message="boom",
                   cpu_time_ms=1500, peak_memory_bytes=4096)

    job = (await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=env.as_("bob"))).job
    assert (job.state, job.exit_code, job.error_message, job.attributes["name"]) == (
        job_state_pb2.JOB_STATE_FAILED, 3, "boom", "fetch")
    assert (job.user, job.billing_project, job.spec.image, list(job.spec.argv.args)) == (
        "alice", "proj", "busybox", ["true"])
    assert job.cost_micro_usd == 40_000  # one core for an hour at $0.04
    assert job.HasField("created_at") and job.HasField("started_at") and job.HasField("completed_at")
    [a] = job.attempts
    assert (a.attempt_id, a.instance_name, a.cores_mcpu, a.exit_code, a.error_message, a.cost_micro_usd) == (
        attempt, "i1", 1000, 3, "boom", 40_000)
    assert (a.end_reason, a.resources_used.cpu_time.ToMilliseconds(), a.resources_used.peak_memory_bytes) == (
        job_pb2.ATTEMPT_END_REASON_EXITED, 1500, 4096)

    # The child: its relative parent reads back as the absolute id, its group as the root.
    child = (await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=2), metadata=env.as_("alice"))).job
    assert [p.job_id for p in child.spec.parents] == [1]
    assert list(child.spec.parents[0].accepted_states) == [job_state_pb2.JOB_STATE_SUCCEEDED]
    assert child.spec.job_group.job_group_id == 0 and child.spec.env["K"] == "v"
    assert (child.state, list(child.attempts), child.HasField("exit_code")) == (
        job_state_pb2.JOB_STATE_READY, [], False)
    assert (await refused(env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=3),
                                          metadata=env.as_("alice")))).code() == grpc.StatusCode.NOT_FOUND


async def test_attempts_oldest_first_after_a_lost_worker(env: Env) -> None:
    w = env.world
    await w.instance()
    await w.instance("i2")
    batch_id = await env.submit(spec())
    first = await w.run(batch_id, 1)
    await w.store.deactivate_instance(w.epoch, "i1", "gone")
    w.clock.advance(1000)
    second = await w.run(batch_id, 1, instance="i2")
    response = await env.jobs.GetJobAttempts(pb.GetJobAttemptsRequest(batch_id=batch_id, job_id=1),
                                             metadata=env.as_("alice"))
    assert [(a.attempt_id, a.instance_name) for a in response.attempts] == [(first, "i1"), (second, "i2")]
    assert response.attempts[0].end_reason == job_pb2.ATTEMPT_END_REASON_WORKER_LOST
    assert response.attempts[1].end_reason == job_pb2.ATTEMPT_END_REASON_UNSPECIFIED


async def test_list_jobs_with_parents_and_attempts(env: Env, certs: DevCertificateAuthority,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for, each job of a page comes with its parents' ids and with the attempts GetJobAttempts gives."""
    w = env.world
    await w.instance()
    await w.instance("i2")
    batch_id = await env.submit(spec(name="a"), spec(-1), spec(-2, -1), spec(), spec(-4, -2))
    lost = await w.run(batch_id, 1)
    await w.store.deactivate_instance(w.epoch, "i1", "gone")
    w.clock.advance(1000)
    await complete(env, batch_id, 1, await w.run(batch_id, 1, instance="i2"), "Success", exit_code=0)
    await w.run(batch_id, 4, instance="i2")

    async def listed(**flags: bool) -> list[job_pb2.Job]:
        found, token = [], ""
        while True:
            page = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, page_size=2, page_token=token,
                                                              **flags), metadata=env.as_("bob"))
            found += page.jobs
            token = page.next_page_token
            if not token:
                return found

    jobs = await listed(with_parents=True, with_attempts=True)
    assert [(j.job_id, list(j.parent_job_ids)) for j in jobs] == [(1, []), (2, [1]), (3, [1, 2]), (4, []),
                                                                  (5, [1, 3])]
    for job in jobs:
        one = await env.jobs.GetJobAttempts(pb.GetJobAttemptsRequest(batch_id=batch_id, job_id=job.job_id),
                                            metadata=env.as_("bob"))
        assert list(job.attempts) == list(one.attempts)
        assert not job.HasField("spec")
    assert [len(j.attempts) for j in jobs] == [2, 0, 0, 1, 0] and jobs[0].attempts[0].attempt_id == lost
    assert jobs[0].attributes["name"] == "a"
    async with Client(f"localhost:{env.frontend.public_port}", env.tokens["bob"], certs.ca_cert_path) as client:
        assert [j async for j in client.jobs(batch_id, page_size=2, with_parents=True, with_attempts=True)] == jobs
    # A page costs the same statements however many jobs it holds: parents and attempts one each.
    named: list[str] = []
    original = Database.fetchall

    def counting(self, sql, params=(), name="query"):  # type: ignore[no-untyped-def]
        named.append(name)  # every read goes through fetchall (fetchone too)
        return original(self, sql, params, name)

    monkeypatch.setattr(Database, "fetchall", counting)
    for size in (1, 5):
        named.clear()
        page = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, page_size=size, with_parents=True,
                                                          with_attempts=True), metadata=env.as_("bob"))
        assert len(page.jobs) == size
        assert [n for n in named if n.startswith(("list_jobs", "job_", "page_job_"))] == [
            "list_jobs", "job_attributes", "page_job_parents", "page_job_attempts"], named
    monkeypatch.undo()
    # Each flag alone fills only its own field; neither, neither.
    assert all(j.parent_job_ids and not j.attempts for j in await listed(with_parents=True) if j.job_id in (2, 3))
    assert all(j.attempts and not j.parent_job_ids for j in await listed(with_attempts=True) if j.job_id == 1)
    assert all(not j.attempts and not j.parent_job_ids for j in await listed())


@pytest.mark.slow
async def test_pages_of_a_large_dag_with_parents_and_attempts(env: Env, record_property) -> None:
    """10,000 jobs in ten layers of 1,000, each job after the first layer waiting on two of the layer before
    (a chain and a fan-in), each run once through the procedures: every page of 1,000, with parents and
    attempts, says each job's parents and its one attempt. The time of each page is recorded (the figure
    docs/performance.md quotes), not asserted."""
    w = env.world
    await w.instance("big", cores_mcpu=10_000_000)
    width, layers = 1000, 10
    created = await w.store.create_batch("alice", "proj")
    batch_id = int(created["batch_id"])
    update = await w.store.create_update(batch_id, width * layers)
    first = int(update["start_job_id"])

    def parents(job_id: int) -> list[int]:
        i = job_id - first
        if i < width:
            return []
        above = job_id - width
        return sorted({above, first + (i - width + 1) % width + (i // width - 1) * width})

    rows = [{"job_id": first + i, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0,
             "parents": [{"job_id": p} for p in parents(first + i)]} for i in range(width * layers)]
    for start in range(0, len(rows), 5000):
        await w.store.insert_jobs(batch_id, update["update_id"], rows[start:start + 5000])
    await w.store.commit_update(batch_id, update["update_id"])
    for layer in range(layers):
        ids = range(first + layer * width, first + (layer + 1) * width)
        runs = [{"batch_id": batch_id, "job_id": j, "attempt_id": f"a{j}"} for j in ids]
        assert {o["outcome"] for o in await w.store.schedule_jobs(w.epoch, "big", runs)} == {"scheduled"}
        await w.store.mark_jobs_started(w.epoch, "big", [{**r, "start_time_ms": w.clock()} for r in runs])
        w.clock.advance(1000)
        await w.store.mark_jobs_complete(w.epoch, "big", [
            {**r, "state": "Success", "exit_code": 0, "start_time_ms": w.clock() - 1000, "end_time_ms": w.clock()}
            for r in runs])
        while (await w.store.release_children(w.epoch, 5000, 5000))["n_children"]:
            pass

    async def pages(flags: bool) -> list[float]:
        """Each full page's time, in ms."""
        took_ms, seen, token = [], 0, ""
        while True:
            started = time.perf_counter()
            page = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, page_size=1000, page_token=token,
                                                              with_parents=flags, with_attempts=flags),
                                           metadata=env.as_("alice"))
            if page.jobs:
                took_ms.append((time.perf_counter() - started) * 1000)
            for job in page.jobs:
                assert list(job.parent_job_ids) == (parents(job.job_id) if flags else [])
                assert [a.attempt_id for a in job.attempts] == ([f"a{job.job_id}"] if flags else [])
                assert job.state == job_state_pb2.JOB_STATE_SUCCEEDED
            seen += len(page.jobs)
            token = page.next_page_token
            if not token:
                assert seen == width * layers and len(took_ms) == layers
                return sorted(took_ms)

    for flags in (False, True):
        took_ms = await pages(flags)
        record_property(f"list_jobs_page_ms{'_with_parents_and_attempts' if flags else ''}", took_ms)
        print(f"ListJobs pages of 1,000, flags {flags} (ms): {[round(t) for t in took_ms]}")


async def test_list_jobs_with_queries_and_pages(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(*[spec(name=f"j{i}") for i in range(1, 6)])
    for job_id, state in ((1, "Success"), (2, "Failed"), (3, "Failed")):
        await complete(env, batch_id, job_id, await w.run(batch_id, job_id), state,
                       exit_code=0 if state == "Success" else 2)
    # An update that is not committed yet is invisible.
    created = await env.batches.CreateUpdate(bpb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                                     batch_id=batch_id, n_jobs=1),
                                             metadata=env.as_("alice"))
    await env.batches.AddJobs(bpb.AddJobsRequest(batch_id=batch_id, update_id=created.update.update_id,
                                                 jobs=[spec()]), metadata=env.as_("alice"))

    async def ids(query: str = "", page_size: int = 0, who: str = "alice") -> list[int]:
        found, token = [], ""
        while True:
            page = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, query=query, page_size=page_size,
                                                              page_token=token), metadata=env.as_(who))
            found += [j.job_id for j in page.jobs]
            assert all(not j.HasField("spec") and not j.attempts for j in page.jobs)
            token = page.next_page_token
            if not token:
                return found

    assert await ids() == [1, 2, 3, 4, 5]
    assert await ids(page_size=2) == [1, 2, 3, 4, 5]
    assert await ids(page_size=5000, who="root") == [1, 2, 3, 4, 5]
    assert await ids("state=failed") == [2, 3]
    assert await ids("state=live name!=j5") == [4]
    assert await ids("exit_code>0 job_id>=3") == [3]
    assert await ids("name=~j1") == [1]
    listed = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, query="name=j2"), metadata=env.as_("bob"))
    assert (listed.jobs[0].attributes["name"], listed.jobs[0].state) == ("j2", job_state_pb2.JOB_STATE_FAILED)

    bad = await refused(env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, query="state=sleeping"),
                                          metadata=env.as_("alice")))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and violations(bad) == ["query"]
    bad = await refused(env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, page_size=-1),
                                          metadata=env.as_("alice")))
    assert violations(bad) == ["page_size"]
    bad = await refused(env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, page_token="%%"),
                                          metadata=env.as_("alice")))
    assert violations(bad) == ["page_token"]


async def test_logs_of_finished_attempts_come_from_storage(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(), spec())
    attempt = await w.run(batch_id, 1)
    # What the worker does at the end of an attempt: close its log and upload it.
    sink = LogSink(env.blobs.parent / "worker" / "main.log")
    text = b"".join(f"line {i}\n".encode() for i in range(20_000))
    sink.write(text)
    sink.close()
    await sink.upload(f"file://{env.blobs}/logs/{batch_id}/1/{attempt}/main.log")
    await complete(env, batch_id, 1, attempt, "Success", exit_code=0)

    alice = env.as_("alice")
    whole = await env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1), metadata=alice)
    assert (whole.attempt_id, whole.data, whole.total_bytes, whole.complete) == (attempt, text, len(text), True)
    tail = await env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1, attempt_id=attempt,
                                                        start_byte=-8), metadata=alice)
    assert (tail.data, tail.start_byte) == (text[-8:], len(text) - 8)
    middle = await env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1, start_byte=10, max_bytes=5),
                                      metadata=alice)
    assert (middle.data, middle.start_byte) == (text[10:15], 10)

    messages = [c async for c in env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1,
                                                                                start_byte=100), metadata=alice)]
    # Following the job: a message naming its attempt, the log, one with the state the job ended in.
    assert (messages[0].attempt_id, messages[0].attempt_number, messages[0].data) == (attempt, 1, b"")
    assert (messages[-1].job_state, messages[-1].data) == (job_state_pb2.JOB_STATE_SUCCEEDED, b"")
    chunks = messages[1:-1]
    assert b"".join(c.data for c in chunks) == text[100:]
    assert len(chunks) > 1 and all(len(c.data) <= 64 * 1024 for c in chunks)
    assert [c.start_byte for c in chunks][:2] == [100, 100 + len(chunks[0].data)]

    for request in (pb.GetJobLogRequest(batch_id=batch_id, job_id=2),  # never ran
                    pb.GetJobLogRequest(batch_id=batch_id, job_id=1, attempt_id="nope"),
                    pb.GetJobLogRequest(batch_id=batch_id, job_id=1, step=job_pb2.JOB_STEP_INPUT)):
        assert (await refused(env.jobs.GetJobLog(request, metadata=alice))).code() == grpc.StatusCode.NOT_FOUND
    bad = await refused(env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1, max_bytes=-1, step=9),
                                           metadata=alice))
    assert sorted(violations(bad)) == ["max_bytes", "step"]


async def test_an_unreachable_worker_is_unavailable_not_missing(env: Env) -> None:
    w = env.world
    await w.instance()
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    await w.db.execute("UPDATE instances SET ip_address = %s WHERE name = 'i1'", (address,))
    batch_id = await env.submit(spec())
    attempt = await w.run(batch_id, 1)
    # (Following the job instead of one attempt waits for the worker, or for the attempt to end.)
    for call in (env.jobs.GetJobLog(pb.GetJobLogRequest(batch_id=batch_id, job_id=1), metadata=env.as_("alice")),
                 env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1, attempt_id=attempt),
                                       metadata=env.as_("alice")).read()):
        assert (await refused(call)).code() == grpc.StatusCode.UNAVAILABLE

async def test_explain_job(env: Env) -> None:
    w = env.world
    batch_id = await env.submit(spec(name="a"), spec(-1), spec(),
                                spec(locks=[job_spec_pb2.JobLock(level="db", mode=job_spec_pb2.LOCK_MODE_EXCLUSIVE,
                                                                 names=["x"])]),
                                spec(locks=[job_spec_pb2.JobLock(level="db", mode=job_spec_pb2.LOCK_MODE_SHARED,
                                                                 names=["x"])]))

    async def reasons(job_id: int) -> list[tuple[int, str]]:
        answer = await env.jobs.ExplainJob(pb.ExplainJobRequest(batch_id=batch_id, job_id=job_id),
                                           metadata=env.as_("bob"))
        explanation = answer.explanation
        assert (explanation.batch_id, explanation.job_id) == (batch_id, job_id)
        return [(r.code, r.detail) for r in explanation.reasons]

    codes = job_explanation_pb2
    # Nothing is running: no machine has room for the ready jobs.
    assert [c for c, _ in await reasons(1)] == [codes.WAIT_REASON_CODE_NO_CAPACITY_IN_REGIONS]
    [(code, detail)] = await reasons(2)
    assert code == codes.WAIT_REASON_CODE_WAITING_ON_PARENTS and "1" in detail

    await w.instance(cores_mcpu=8000)  # default jobs' pool: standard
    attempt = await w.run(batch_id, 1)
    assert [c for c, _ in await reasons(1)] == [codes.WAIT_REASON_CODE_RUNNING]
    assert [c for c, _ in await reasons(3)] == []  # ready, room, nothing in the way

    # Job 4 holds db/x exclusively: job 5 waits for it.
    await w.run(batch_id, 4)
    answer = await env.jobs.ExplainJob(pb.ExplainJobRequest(batch_id=batch_id, job_id=5), metadata=env.as_("bob"))
    [blocked] = answer.explanation.reasons  # the first rule that stops it, as the scheduler decides
    assert (blocked.code, [(j.batch_id, j.job_id) for j in blocked.jobs]) == (
        codes.WAIT_REASON_CODE_BLOCKED_BY_LOCK, [(batch_id, 4)])
    assert (blocked.lock.level, list(blocked.lock.names)) == ("db", ["x"])

    await complete(env, batch_id, 1, attempt, "Failed", exit_code=1)
    assert [c for c, _ in await reasons(1)] == [codes.WAIT_REASON_CODE_FINISHED]
    assert [c for c, _ in await reasons(2)] == [codes.WAIT_REASON_CODE_PARENT_FAILED]

    # The billing project is closed: ready jobs wait for it.
    await w.db.execute("UPDATE billing_projects SET state = 'closed' WHERE name = 'proj'")
    assert codes.WAIT_REASON_CODE_BILLING_LIMIT_REACHED in [c for c, _ in await reasons(3)]
    await env.batches.CancelBatch(bpb.CancelBatchRequest(batch_id=batch_id, reason="stop"), metadata=env.as_("alice"))
    [(code, detail)] = await reasons(3)
    assert code == codes.WAIT_REASON_CODE_BATCH_CANCELLED and "alice: stop" in detail


async def test_outsiders_are_told_what_missing_ids_get(env: Env) -> None:
    batch_id = await env.submit(spec())
    carol = env.as_("carol")
    requests = [(env.jobs.GetJob, pb.GetJobRequest(batch_id=batch_id, job_id=1)),
                (env.jobs.ListJobs, pb.ListJobsRequest(batch_id=batch_id)),
                (env.jobs.GetJobAttempts, pb.GetJobAttemptsRequest(batch_id=batch_id, job_id=1)),
                (env.jobs.GetJobLog, pb.GetJobLogRequest(batch_id=batch_id, job_id=1)),
                (env.jobs.ExplainJob, pb.ExplainJobRequest(batch_id=batch_id, job_id=1))]
    for method, request in requests:
        for id_ in (batch_id, batch_id + 100):
            request.batch_id = id_
            error = await refused(method(request, metadata=carol))
            assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, f"no batch {id_}")
    stream = env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1), metadata=carol)
    assert (await refused(stream.read())).code() == grpc.StatusCode.NOT_FOUND


async def test_deleted_batches_disappear_and_reruns_copy_failed_jobs(env: Env) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(name="a"), spec(-1, name="b"), spec(name="c"))
    await complete(env, batch_id, 1, await w.run(batch_id, 1), "Failed", exit_code=1)
    await complete(env, batch_id, 3, await w.run(batch_id, 3), "Success", exit_code=0)
    assert await w.drain(batch_id) == 1  # job 2: its parent failed
    alice = env.as_("alice")

    rerun = bpb.RerunFailedJobsRequest(batch_id=batch_id, idempotency_token="again",
                                       states=[job_state_pb2.JOB_STATE_FAILED])
    # A member may read but not change; to an outsider the batch does not exist.
    for who, code in (("bob", grpc.StatusCode.PERMISSION_DENIED), ("carol", grpc.StatusCode.NOT_FOUND)):
        assert (await refused(env.batches.RerunFailedJobs(rerun, metadata=env.as_(who)))).code() == code
    first = await env.batches.RerunFailedJobs(rerun, metadata=alice)
    again = await env.batches.RerunFailedJobs(rerun, metadata=alice)
    assert first.update == again.update
    assert (first.update.start_job_id, first.update.n_jobs, first.update.state) == (4, 2, 2)
    copies = await env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id, query="job_id>3"), metadata=alice)
    assert [(j.job_id, j.rerun_of_job_id, j.attributes["name"], j.state) for j in copies.jobs] == [
        (4, 1, "a", job_state_pb2.JOB_STATE_READY), (5, 2, "b", job_state_pb2.JOB_STATE_PENDING)]
    copy = (await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=5), metadata=alice)).job
    assert [p.job_id for p in copy.spec.parents] == [4]
    nothing = await env.batches.RerunFailedJobs(bpb.RerunFailedJobsRequest(batch_id=batch_id, idempotency_token="x"),
                                                metadata=alice)
    assert not nothing.HasField("update")
    bad = await refused(env.batches.RerunFailedJobs(bpb.RerunFailedJobsRequest(
        batch_id=batch_id, states=[job_state_pb2.JOB_STATE_RUNNING]), metadata=alice))
    assert sorted(violations(bad)) == ["idempotency_token", "states[0]"]

    assert (await refused(env.batches.DeleteBatch(bpb.DeleteBatchRequest(batch_id=batch_id),
                                                  metadata=env.as_("bob")))).code() == \
        grpc.StatusCode.PERMISSION_DENIED
    await env.batches.DeleteBatch(bpb.DeleteBatchRequest(batch_id=batch_id), metadata=alice)
    await env.batches.DeleteBatch(bpb.DeleteBatchRequest(batch_id=batch_id), metadata=alice)
    cancelled = await w.db.fetchone("SELECT cancelled_by, reason FROM job_groups_cancelled WHERE batch_id = %s",
                                    (batch_id,))
    assert cancelled == {"cancelled_by": "alice", "reason": "batch deleted"}
    for call in (env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=alice),
                 env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=alice),
                 env.jobs.ListJobs(pb.ListJobsRequest(batch_id=batch_id), metadata=alice)):
        assert (await refused(call)).code() == grpc.StatusCode.NOT_FOUND
    assert (await env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=alice)).batches == []
    assert (await refused(env.batches.DeleteBatch(bpb.DeleteBatchRequest(batch_id=batch_id + 1),
                                                  metadata=alice))).code() == grpc.StatusCode.NOT_FOUND



async def test_a_running_jobs_log_is_read_from_its_worker_then_from_storage(
        auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
        certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """A real driver and worker run a job that prints, waits for a file, prints again."""
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
        await JobStore(db).create_instance(driver.election.state.epoch, "w-log", "standard", 2000, "activate")
        certs.issue("worker-w-log")
        worker = await start_worker(WorkerConfig("w-log", "activate", 2000, (address,), certs.directory,
                                                 tmp_path / "scratch", f"file://{blobs}", heartbeat_interval_s=0.2,
                                                 unisolated_dev=os.geteuid() != 0))
        async for env in make_env(frontend, auth_app, db, clock, certs, blobs, elect=False):
            batch_id = await env.submit(job_spec_pb2.JobSpec(
                image="docker.io/library/busybox:1.36",
                script="echo first; while [ ! -e go ]; do sleep 0.05; done; echo second"))
            request = pb.GetJobLogRequest(batch_id=batch_id, job_id=1)
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                try:
                    live = await env.jobs.GetJobLog(request, metadata=env.as_("bob"))
                    if live.data == b"first\n":
                        break
                except grpc.aio.AioRpcError as e:
                    assert e.code() == grpc.StatusCode.NOT_FOUND  # not started yet
                assert asyncio.get_running_loop().time() < deadline, "the job's first line never came"
                await asyncio.sleep(0.05)
            assert (live.complete, live.total_bytes) == (False, 6)
            stream = env.jobs.StreamJobLog(pb.StreamJobLogRequest(batch_id=batch_id, job_id=1),
                                           metadata=env.as_("alice"))
            header = await asyncio.wait_for(stream.read(), 10)
            assert (header.data, header.attempt_id, header.instance_name) == (b"", live.attempt_id, "w-log")
            first = await asyncio.wait_for(stream.read(), 10)
            assert (first.data, first.start_byte, first.attempt_id) == (b"first\n", 0, live.attempt_id)
            # The job waits for a file in its own working directory (all it sees of the host's scratch).
            (tmp_path / "scratch" / f"{batch_id}-1-{live.attempt_id}" / "work" / "go").touch()
            rest, last = b"", None
            while (chunk := await asyncio.wait_for(stream.read(), 20)) != grpc.aio.EOF:
                rest, last = rest + chunk.data, chunk
            assert rest == b"second\n"  # and the stream ended with the job
            assert last is not None and last.job_state == job_state_pb2.JOB_STATE_SUCCEEDED
            deadline = asyncio.get_running_loop().time() + 30
            while await env.world.state(batch_id, 1) != "Success":
                assert asyncio.get_running_loop().time() < deadline, "the job did not succeed"
                await asyncio.sleep(0.05)
            stored = await env.jobs.GetJobLog(request, metadata=env.as_("alice"))
            assert (stored.data, stored.complete, stored.attempt_id) == (b"first\nsecond\n", True, live.attempt_id)
    finally:
        if worker is not None:
            await worker.stop()
        await frontend.stop()
        await driver.stop()



async def test_retry_policies_are_checked_and_the_attempt_chain_is_shown(env: Env) -> None:
    bad = job_spec_pb2.RetryPolicy(retry_oom_with_memory_factor=0.5, max_failed_retries=101,
                                   retry_exit_codes=[0, 3], retry_delay=duration_pb2.Duration(seconds=-1))
    group = job_group_pb2.JobGroupSpec(retry_policy=job_spec_pb2.RetryPolicy(max_preemptions_before_on_demand=-1))
    error = await refused(env.submit(spec(retry_policy=bad), groups=(group,)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert sorted(violations(error)) == [
        "job_groups[0].retry_policy.max_preemptions_before_on_demand", "jobs[0].retry_policy.max_failed_retries",
        "jobs[0].retry_policy.retry_delay", "jobs[0].retry_policy.retry_exit_codes",
        "jobs[0].retry_policy.retry_oom_with_memory_factor"]
    assert await env.world.db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 0}  # nothing written

    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(retry_policy=job_spec_pb2.RetryPolicy(retry_oom_with_memory_factor=2.0),
                                     resources=job_spec_pb2.ResourceRequest(memory_bytes=2**30)))
    first = await w.run(batch_id, 1)
    await complete(env, batch_id, 1, first, "Failed", exit_code=137, reason="out_of_memory")
    second = await w.run(batch_id, 1)
    job = (await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=env.as_("alice"))).job
    assert [(a.attempt_id, a.end_reason, a.retry_reason) for a in job.attempts] == [
        (first, job_pb2.ATTEMPT_END_REASON_OUT_OF_MEMORY, "out of memory at 1024 MiB: retried with 2048 MiB"),
        (second, job_pb2.ATTEMPT_END_REASON_UNSPECIFIED, "")]
    assert job.state == job_state_pb2.JOB_STATE_RUNNING


async def test_a_job_larger_than_its_pools_machine_is_refused_and_memory_0_means_the_pools_share(env: Env) -> None:
    gib = 2**30
    # The local pools (migration 0002): highmem machines of 2 cores and 16 GiB, standard 2 cores and 8 GiB.
    huge = spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=1000, memory_bytes=250 * gib))
    wide = spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=16000))
    error = await refused(env.submit(spec(), huge, wide))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    assert [(v.field, v.description) for v in details.field_violations] == [
        ("jobs[1].resources.memory_bytes", "250 GiB is more than the largest highmem machine has (16 GiB)"),
        ("jobs[2].resources.cores_mcpu", "16 cores is more than the largest standard machine has (2)")]
    assert await env.world.db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 0}  # nothing written

    # Memory 0 is the standard pool's memory per core: 4 GiB a core, so a quarter core gets 1 GiB.
    batch_id = await env.submit(spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=250)), spec())
    rows = await env.world.db.fetchall("SELECT job_id, inst_coll, memory_bytes FROM jobs WHERE batch_id = %s "
                                       "ORDER BY job_id", (batch_id,))
    assert [(r["inst_coll"], r["memory_bytes"]) for r in rows] == [("standard", gib), ("standard", 4 * gib)]


async def test_storage_larger_than_its_pools_machine_is_refused_and_0_reserves_the_pools_share(env: Env) -> None:
    gib, pib = 2**30, 2**50
    # The local pools' machines have 16 GiB of scratch storage (migration 0017), the standard one 2 cores.
    huge = spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=1000, storage_bytes=10 * pib))
    error = await refused(env.submit(spec(), huge))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    assert [(v.field, v.description) for v in details.field_violations] == [
        ("jobs[1].resources.storage_bytes", "10 PiB is more than the largest standard machine has (16 GiB)")]
    for table in ("batches", "batch_updates", "jobs"):  # nothing written
        assert await env.world.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}") == {"n": 0}

    # Storage 0 is the pool's storage per core: 8 GiB a core, so a quarter core gets 2 GiB; what a job asks
    # for is what it reserves. GetJob shows the reservation.
    batch_id = await env.submit(spec(resources=job_spec_pb2.ResourceRequest(cores_mcpu=250)),
                                spec(resources=job_spec_pb2.ResourceRequest(storage_bytes=gib)))
    rows = await env.world.db.fetchall("SELECT inst_coll, storage_bytes FROM jobs WHERE batch_id = %s "
                                       "ORDER BY job_id", (batch_id,))
    assert [(r["inst_coll"], r["storage_bytes"]) for r in rows] == [("standard", 2 * gib), ("standard", gib)]
    job = (await env.jobs.GetJob(pb.GetJobRequest(batch_id=batch_id, job_id=1), metadata=env.as_("alice"))).job
    assert job.resources == job_pb2.JobResources(cores_mcpu=250, memory_bytes=gib, storage_bytes=2 * gib,
                                                 pool="standard")


async def test_hold_and_release_over_grpc(env: Env) -> None:
    """HoldJobs and ReleaseJobs of a batch, a job group and a job, each way, with what ExplainJob says, and
    who may: the batch's owner (bob, a member, may not; carol, an outsider, finds nothing)."""
    w = env.world
    # Groups 1 and 2, 2 under 1; job 3 in group 2.
    groups = (job_group_pb2.JobGroupSpec(), job_group_pb2.JobGroupSpec(parent=job_spec_pb2.JobGroupRef(
        in_update_index=0)))
    batch_id = await env.submit(spec(), spec(), spec(job_group=job_spec_pb2.JobGroupRef(in_update_index=1)),
                                groups=groups)
    await w.instance(cores_mcpu=8000)

    async def codes_of(job_id: int) -> list[str]:
        answer = await env.jobs.ExplainJob(pb.ExplainJobRequest(batch_id=batch_id, job_id=job_id),
                                           metadata=env.as_("alice"))
        return [job_explanation_pb2.WaitReasonCode.Name(r.code).removeprefix("WAIT_REASON_CODE_")
                for r in answer.explanation.reasons]

    async def hold(who: str = "alice", **target: int) -> int:
        return (await env.batches.HoldJobs(bpb.HoldJobsRequest(batch_id=batch_id, **target),
                                           metadata=env.as_(who))).change

    async def release(**target: int) -> int:
        return (await env.batches.ReleaseJobs(bpb.ReleaseJobsRequest(batch_id=batch_id, **target),
                                              metadata=env.as_("alice"))).change

    assert await hold() == bpb.HOLD_CHANGE_HELD
    assert await hold() == bpb.HOLD_CHANGE_ALREADY_HELD

    async def batch_hold() -> tuple[str, bool] | None:
        batch = (await env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=env.as_("bob"))).batch
        return (batch.hold.held_by, batch.hold.HasField("held_at")) if batch.HasField("hold") else None

    assert await batch_hold() == ("alice", True)  # shown to whoever reads the batch
    answer = await env.jobs.ExplainJob(pb.ExplainJobRequest(batch_id=batch_id, job_id=1), metadata=env.as_("alice"))
    [reason] = answer.explanation.reasons
    assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_HELD
    assert reason.detail.startswith(f"batch {batch_id} was held by alice at ")
    assert await release() == bpb.HOLD_CHANGE_RELEASED
    assert await release() == bpb.HOLD_CHANGE_NOT_HELD
    assert await codes_of(1) == [] and await batch_hold() is None
    # A job group (with the group under it), then one job.
    assert await hold(job_group_id=1) == bpb.HOLD_CHANGE_HELD
    assert [await codes_of(j) for j in (1, 2, 3)] == [[], [], ["HELD"]]
    assert await hold(job_id=2) == bpb.HOLD_CHANGE_HELD
    assert await codes_of(2) == ["HELD"]
    assert await release(job_group_id=1) == bpb.HOLD_CHANGE_RELEASED
    assert await release(job_id=2) == bpb.HOLD_CHANGE_RELEASED
    assert [await codes_of(j) for j in (1, 2, 3)] == [[], [], []]
    # A final job has nothing to hold.
    attempt = await w.run(batch_id, 1)
    await complete(env, batch_id, 1, attempt, "Success")
    assert await hold(job_id=1) == bpb.HOLD_CHANGE_COMPLETE
    # Refusals: what does not exist, and who may not.
    for target in ({"job_id": 99}, {"job_group_id": 77}):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await hold(**target)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await release(**target)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND, e.value.details()
    for who, code in (("bob", grpc.StatusCode.PERMISSION_DENIED), ("carol", grpc.StatusCode.NOT_FOUND)):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await hold(who)
        assert e.value.code() == code
    assert await w.db.fetchone("SELECT 1 FROM job_groups_held WHERE batch_id = %s", (batch_id,)) is None
