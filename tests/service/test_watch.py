"""WatchBatch over real gRPC: the frontend as `services.frontend.app` wires
it, jobs driven through the store as the driver does, the driver's
EventPublisher loop numbering the events, and the clients' watch and wait
(resuming through a TCP proxy that drops connections)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

import corral
import corral.aio
from corral.batch.v1 import batch_event_pb2, batch_pb2, batch_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from corral.batch.v1 import job_state_pb2 as js
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.driver.events import EventPublisher
from services.frontend.app import FrontendApp
from tests.service.conftest import bearer, person_channel

Event = batch_event_pb2.BatchEvent
TIMEOUT_S = 30.0


@pytest.fixture
async def tokens(auth_app: AuthApp, db: Database) -> dict[str, str]:
    """alice and bob are users; only alice is a member of 'proj'."""
    store = AuthStore(auth_app.db)
    found = {}
    for name in ("alice", "bob"):
        await store.create_user(name)
        found[name] = (await store.create_token(name, "api"))[1]
    await JobStore(db).create_billing_project("proj", ["alice"])
    return found


@pytest.fixture
async def stub(frontend: FrontendApp, certs: DevCertificateAuthority) -> AsyncIterator:  # noqa: F811
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        yield batch_service_pb2_grpc.BatchServiceStub(channel)


class Driving:
    """Moves jobs through the store as the leading driver would, with its publisher loop running."""

    def __init__(self, store: JobStore, epoch: int, publisher: EventPublisher):
        self.store = store
        self.epoch = epoch
        self.publisher = publisher
        self._attempts = 0

    async def run(self, batch_id: int, job_id: int, state: str, exit_code: int | None = None) -> str:
        """SJ, MJS and MJC of one job on instance i1; returns the attempt id."""
        self._attempts += 1
        attempt = f"a{self._attempts}"
        ref = {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt}
        scheduled = await self.store.schedule_jobs(self.epoch, "i1", [ref])
        assert scheduled[0]["outcome"] == "scheduled", scheduled
        await self.store.mark_jobs_started(self.epoch, "i1", [{**ref, "start_time_ms": self.store.clock_ms()}])
        if exit_code is None:
            exit_code = 0 if state == "Success" else 1
        done = await self.store.mark_jobs_complete(self.epoch, "i1", [{**ref, "state": state, "exit_code": exit_code}])
        assert done[0]["outcome"] == "completed", done
        self.publisher.notify()
        return attempt


@pytest.fixture
async def driving(frontend: FrontendApp, db: Database) -> AsyncIterator[Driving]:  # noqa: F811
    store = JobStore(db)  # as the driver: the frontend's own account may not elect a leader
    epoch = await store.elect_leader("driver-test")
    await store.create_instance(epoch, "i1", "standard", 64_000, "tok")
    await store.activate_instance(epoch, "i1", "tok")
    publisher = EventPublisher(store, lambda: epoch, period_s=0.05, cost_period_s=None)
    task = asyncio.create_task(publisher.run())
    try:
        yield Driving(store, epoch, publisher)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def job(*parents: int, **attributes: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]), attributes=attributes,
                                parents=[job_spec_pb2.ParentRef(in_update_offset=p) for p in parents])


async def submit_dag(stub: Any, token: str) -> batch_pb2.Batch:
    """a; b after a; c after a and b."""
    submitted = await stub.SubmitBatch(pb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex,
        billing_project="proj", jobs=[job(name="a"), job(-1, name="b"), job(-2, -1, name="c")]),
        metadata=bearer(token))
    return submitted.batch


async def drive_dag(driving: Driving, batch: batch_pb2.Batch) -> None:
    """a and b succeed, c fails with exit code 2 (a batch's first update starts at job id 1)."""
    await driving.run(batch.batch_id, 1, "Success")
    await driving.run(batch.batch_id, 2, "Success")
    await driving.run(batch.batch_id, 3, "Failed", exit_code=2)


async def read_until(events: AsyncIterator[Any], stop: Callable[[Event], bool]) -> list[Event]:
    """Events (or responses carrying one) until `stop` holds for one, with a deadline."""
    found: list[Event] = []

    async def read() -> None:
        async for item in events:
            event = item.event if isinstance(item, pb.WatchBatchResponse) else item
            found.append(event)
            if stop(event):
                return

    await asyncio.wait_for(read(), TIMEOUT_S)
    return found


def completed(event: Event) -> bool:
    return event.HasField("batch_completed")


def describe(event: Event) -> tuple[Any, ...]:
    kind = event.WhichOneof("event")
    if kind == "job_state_changed":
        c = event.job_state_changed
        return kind, c.job_id, c.old_state, c.new_state, c.exit_code if c.HasField("exit_code") else None
    if kind == "update_committed":
        return kind, event.update_committed.n_jobs
    if kind == "batch_completed":
        c = event.batch_completed.counts
        return kind, c.n_jobs, c.n_succeeded, c.n_failed
    return (kind,)


DAG_EVENTS = [
    ("update_committed", 3),
    ("job_state_changed", 1, js.JOB_STATE_READY, js.JOB_STATE_RUNNING, None),
    ("job_state_changed", 1, js.JOB_STATE_RUNNING, js.JOB_STATE_SUCCEEDED, 0),
    ("job_state_changed", 2, js.JOB_STATE_PENDING, js.JOB_STATE_READY, None),
    ("job_state_changed", 2, js.JOB_STATE_READY, js.JOB_STATE_RUNNING, None),
    ("job_state_changed", 2, js.JOB_STATE_RUNNING, js.JOB_STATE_SUCCEEDED, 0),
    ("job_state_changed", 3, js.JOB_STATE_PENDING, js.JOB_STATE_READY, None),
    ("job_state_changed", 3, js.JOB_STATE_READY, js.JOB_STATE_RUNNING, None),
    ("job_state_changed", 3, js.JOB_STATE_RUNNING, js.JOB_STATE_FAILED, 2),
    ("batch_completed", 3, 2, 1),
]


async def test_events_of_a_dag_arrive_once_each_in_order(stub, tokens, frontend, driving) -> None:  # noqa: F811
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    # Nothing but, perhaps, its update_committed published yet (the publisher may run before the answer is read).
    assert batch.last_event_id <= 1
    call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id), metadata=alice)
    driven = asyncio.create_task(drive_dag(driving, batch))
    events = await read_until(call, completed)
    call.cancel()
    await driven
    assert [e.event_id for e in events] == list(range(1, len(DAG_EVENTS) + 1))
    assert {e.batch_id for e in events} == {batch.batch_id}
    assert [describe(e) for e in events] == DAG_EVENTS
    assert events[1].job_state_changed.attempt_id == "a1" and not events[3].job_state_changed.attempt_id
    got = await stub.GetBatch(pb.GetBatchRequest(batch_id=batch.batch_id), metadata=alice)
    assert (got.batch.state, got.batch.last_event_id) == (batch_pb2.BATCH_STATE_COMPLETE, len(DAG_EVENTS))


async def test_until_complete_ends_the_stream_after_the_batch_completed(stub, tokens, frontend,  # noqa: F811
                                                                         driving) -> None:  # noqa: F811
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    driven = asyncio.create_task(drive_dag(driving, batch))
    call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, until_complete=True), metadata=alice)
    events = [response.event async for response in call]  # ends by itself
    await driven
    assert [describe(e) for e in events] == DAG_EVENTS
    assert await call.code() == grpc.StatusCode.OK


@pytest.mark.parametrize("per_message", [2, 3, 1000])
async def test_events_come_several_to_a_message_when_asked_and_until_complete_still_ends_the_stream(
        stub, tokens, frontend, driving, per_message) -> None:  # noqa: F811
    """The same events, in order, at most `per_message` to a response, all in `events`; the stream ends
    with the message that holds batch_completed. Asked at 1000, events that were published together come
    in one message."""
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    await drive_dag(driving, batch)
    call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, until_complete=True,
                                                max_events_per_message=per_message), metadata=alice)
    responses = [response async for response in call]  # ends by itself
    assert all(not r.HasField("event") and 1 <= len(r.events) <= per_message for r in responses)
    assert [describe(e) for r in responses for e in r.events] == DAG_EVENTS
    if per_message == 1000:
        assert len(responses) == 1
    assert await call.code() == grpc.StatusCode.OK


async def test_resuming_from_last_plus_one_loses_and_repeats_nothing(stub, tokens, frontend, driving
                                                                     ) -> None:  # noqa: F811
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    driven = asyncio.create_task(drive_dag(driving, batch))
    first = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id), metadata=alice)
    before = await read_until(first, lambda e: e.event_id == 4)
    first.cancel()  # the client goes away mid-stream
    await driven
    second = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, from_event_id=before[-1].event_id + 1),
                             metadata=alice)
    after = await read_until(second, completed)
    second.cancel()
    assert [e.event_id for e in before + after] == list(range(1, len(DAG_EVENTS) + 1))
    assert [describe(e) for e in before + after] == DAG_EVENTS
    # From last_event_id + 1 of a complete batch: nothing older comes back.
    got = await stub.GetBatch(pb.GetBatchRequest(batch_id=batch.batch_id), metadata=alice)
    late = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, from_event_id=got.batch.last_event_id + 1),
                           metadata=alice)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(late.read(), 0.5)
    late.cancel()


class DroppingProxy:
    """A TCP proxy on loopback whose open connections a test can cut, as a network failure would."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = 0
        self.n_connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> DroppingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.n_connections += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, up_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def drop(self) -> None:
        """Abort every open connection (an RST, not a goodbye)."""
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


async def test_the_client_resumes_by_itself_after_the_connection_drops(stub, tokens, frontend, driving,  # noqa: F811
                                                                       certs) -> None:
    batch = await submit_dag(stub, tokens["alice"])
    proxy = await DroppingProxy(frontend.public_port).start()
    try:
        async with corral.aio.Client(f"localhost:{proxy.port}", tokens["alice"], ca_cert=certs.ca_cert_path) as client:
            watched = client.watch(batch.batch_id)
            async with contextlib.aclosing(watched):
                first = await read_until(watched, lambda e: e.event_id == 1)
                proxy.drop()
                driven = asyncio.create_task(drive_dag(driving, batch))
                rest = await read_until(watched, completed)
                await driven
        assert proxy.n_connections >= 2  # it did reconnect
        assert [e.event_id for e in first + rest] == list(range(1, len(DAG_EVENTS) + 1))
        assert [describe(e) for e in first + rest] == DAG_EVENTS
    finally:
        await proxy.stop()


async def test_a_query_filters_job_events_but_not_batch_events(stub, tokens, frontend, driving) -> None:  # noqa: F811
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    await drive_dag(driving, batch)
    failures = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, query="state=failed"), metadata=alice)
    found = await read_until(failures, completed)
    failures.cancel()
    assert [describe(e) for e in found] == [DAG_EVENTS[0], DAG_EVENTS[8], DAG_EVENTS[9]]
    assert [e.event_id for e in found] == [1, 9, 10]  # ids of filtered-out events are skipped
    named = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, query="name=b", from_event_id=2),
                            metadata=alice)
    found = await read_until(named, completed)
    named.cancel()
    assert [describe(e) for e in found] == [*DAG_EVENTS[3:6], DAG_EVENTS[9]]


@pytest.mark.parametrize("request_fields, field", [
    ({"query": "cost>>1"}, "query"), ({"query": "state=nonsense"}, "query"), ({"from_event_id": -1}, "from_event_id"),
    ({"max_events_per_message": -1}, "max_events_per_message"),
    ({"max_events_per_message": 1001}, "max_events_per_message"),
])
async def test_a_malformed_watch_is_invalid_argument_before_any_event(stub, tokens, frontend, driving,  # noqa: F811
                                                                      request_fields, field) -> None:
    alice = bearer(tokens["alice"])
    batch = await submit_dag(stub, tokens["alice"])
    await drive_dag(driving, batch)
    call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id, **request_fields), metadata=alice)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call.read(), TIMEOUT_S)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error.value)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    assert [v.field for v in details.field_violations] == [field]


async def test_only_those_who_may_read_the_batch_watch_it(stub, tokens, frontend, driving) -> None:  # noqa: F811
    batch = await submit_dag(stub, tokens["alice"])
    bob = bearer(tokens["bob"])
    for batch_id in (batch.batch_id, batch.batch_id + 100):
        with pytest.raises(grpc.aio.AioRpcError) as refused_get:
            await stub.GetBatch(pb.GetBatchRequest(batch_id=batch_id), metadata=bob)
        call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch_id), metadata=bob)
        with pytest.raises(grpc.aio.AioRpcError) as refused_watch:
            await asyncio.wait_for(call.read(), TIMEOUT_S)
        # The same answer as GetBatch, and as for a missing batch: NOT_FOUND.
        assert refused_watch.value.code() == refused_get.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as anonymous:
        await asyncio.wait_for(stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id)).read(), TIMEOUT_S)
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def started_waiting(capsys: pytest.CaptureFixture[str], batch_id: int) -> str:
    """Poll stderr until wait() showed its first progress line: it found the batch running."""
    seen = ""
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while f"batch {batch_id} [" not in seen:
        assert asyncio.get_running_loop().time() < deadline, "wait() showed no progress"
        await asyncio.sleep(0.01)
        seen += capsys.readouterr().err
    return seen


async def test_wait_returns_the_batch_at_completion(stub, tokens, frontend, driving, certs,  # noqa: F811
                                                    capsys) -> None:
    batch = await submit_dag(stub, tokens["alice"])
    address = f"localhost:{frontend.public_port}"
    async with corral.aio.Client(address, tokens["alice"], ca_cert=certs.ca_cert_path) as client:
        waiting = asyncio.create_task(client.wait(batch.batch_id, progress=True))
        shown = await started_waiting(capsys, batch.batch_id)
        await drive_dag(driving, batch)
        done = await asyncio.wait_for(waiting, TIMEOUT_S)
        assert (done.state, done.counts.n_succeeded, done.counts.n_failed) == (batch_pb2.BATCH_STATE_COMPLETE, 2, 1)
        assert done.last_event_id == len(DAG_EVENTS)
        again = await asyncio.wait_for(client.wait(batch.batch_id), TIMEOUT_S)  # already complete
        assert again.batch_id == batch.batch_id
    shown += capsys.readouterr().err
    assert " 0/3 done" in shown and "3/3 done: 2 succeeded, 1 failed" in shown

    # The blocking client, in a thread, for a second batch.
    second = await submit_dag(stub, tokens["alice"])
    with corral.Client(address, tokens["alice"], ca_cert=certs.ca_cert_path) as blocking:
        waiting = asyncio.create_task(asyncio.to_thread(blocking.wait, second.batch_id, True))
        await started_waiting(capsys, second.batch_id)
        await drive_dag(driving, second)
        done = await asyncio.wait_for(waiting, TIMEOUT_S)
    assert (done.state, done.counts.n_jobs) == (batch_pb2.BATCH_STATE_COMPLETE, 3)


async def test_corral_wait_prints_the_final_batch(stub, tokens, frontend, driving, certs,  # noqa: F811
                                                  tmp_path: Path) -> None:
    batch = await submit_dag(stub, tokens["alice"])
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": f"localhost:{frontend.public_port}", "auth": "localhost:1",
                                  "ca_cert": str(certs.ca_cert_path), "token": tokens["alice"]}))
    env = {**os.environ, "CORRAL_CONFIG": str(config)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "corral.cli", "wait", str(batch.batch_id), "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stderr is not None
        first_line = await asyncio.wait_for(process.stderr.readline(), 60)  # it is waiting
        assert b" 0/3 done" in first_line, first_line
        await drive_dag(driving, batch)
        stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 3, stderr  # completed, but a job failed
    printed = json.loads(stdout)[0]
    assert (printed["batchId"], printed["state"]) == (str(batch.batch_id), "BATCH_STATE_COMPLETE")
    assert b"3/3 done: 2 succeeded, 1 failed" in stderr


async def test_a_watch_the_client_cancels_ends_without_an_error_on_the_server(stub, tokens, frontend,  # noqa: F811
                                                                            driving) -> None:
    """The server closes the handler's stream from another task than the
    one that served it; nothing may fail there (it used to log 'Task
    exception was never retrieved' for every cancelled watch)."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        batch = await submit_dag(stub, tokens["alice"])
        driven = asyncio.create_task(drive_dag(driving, batch))
        call = stub.WatchBatch(pb.WatchBatchRequest(batch_id=batch.batch_id), metadata=bearer(tokens["alice"]))
        await read_until(call, lambda e: e.event_id == 2)
        call.cancel()
        await driven
        for _ in range(20):  # the server's task is reported when it is collected
            await asyncio.sleep(0.05)
            gc.collect()
    finally:
        loop.set_exception_handler(previous)
    assert [context.get("message") for context in errors] == []
