"""The frontend's limits over real gRPC (services/frontend/limits.py): the
query's size, the statement time limit of reads, the server's deadline of
unary calls, server streams per user, and the size of a request.

A read is made slow on purpose by holding a write lock on the table it
reads from another session: MariaDB's statement limit (and the call's
deadline) interrupt the wait as they would a slow plan.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pymysql
import pytest
from grpc_status import rpc_status

from corral.auth.v1 import auth_service_pb2, auth_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_spec_pb2
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.frontend.app import FrontendApp
from services.frontend.limits import Limits
from tests.service.conftest import limits_for_tests, person_channel
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import Env, make_env, refused, spec, start_frontend, violations
from tests.world import FakeClock


@contextlib.asynccontextmanager
async def limited_env(limits: Limits, auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
                      certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[Env]:
    """A frontend with these limits, and the people of tests/service/test_jobs.py."""
    frontend = await start_frontend(auth_app, db_config, certs, tmp_path / "blobs", limits=limits)
    try:
        async for env in make_env(frontend, auth_app, db, clock, certs, tmp_path / "blobs"):
            yield env
    finally:
        await frontend.stop()


@pytest.fixture
def start_env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
              certs: DevCertificateAuthority, tmp_path: Path):
    return lambda **limits: limited_env(limits_for_tests(**limits), auth_app, db_config, db, clock, certs, tmp_path)


@contextlib.contextmanager
def table_locked(db_config: DatabaseConfig, table: str) -> Iterator[None]:
    """Another session holds a write lock on `table`: every read of it waits."""
    holder = pymysql.connect(**db_config.connect_kwargs(with_database=False), database=db_config.database)
    try:
        with holder.cursor() as cursor:
            cursor.execute(f"LOCK TABLES `{table}` WRITE")
        yield
    finally:
        holder.close()


def message(error: grpc.aio.AioRpcError) -> str:
    return error.details() or ""


def descriptions(error: grpc.aio.AioRpcError) -> dict[str, str]:
    from google.rpc import error_details_pb2

    status = rpc_status.from_call(error)
    assert status is not None
    details = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(details)
    return {v.field: v.description for v in details.field_violations}


def open_streams(frontend: FrontendApp, who: str) -> int:
    slots = frontend.servers.stream_slots
    assert slots is not None
    return slots.open_streams(who)


# ---------------------------------------------------------------- queries


async def test_queries_over_their_limits_are_invalid_argument_naming_the_limit(start_env) -> None:
    async with start_env(max_query_bytes=64, max_query_terms=3) as env:
        batch_id = await env.submit(spec())
        alice = env.as_("alice")
        long, many, nested = "x" * 65, "a b c d", "(" * 10_000 + ")" * 10_000
        cases = [
            (env.batches.ListBatches(bpb.ListBatchesRequest(query=long), metadata=alice), "max_query_bytes"),
            (env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=long), metadata=alice),
             "max_query_bytes"),
            (env.batches.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id, query=long), metadata=alice).read(),
             "max_query_bytes"),
            (env.batches.ListBatches(bpb.ListBatchesRequest(query=many), metadata=alice), "max_query_terms"),
            (env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id, query=many), metadata=alice),
             "max_query_terms"),
            (env.batches.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id, query=many), metadata=alice).read(),
             "max_query_terms"),
            (env.batches.ListBatches(bpb.ListBatchesRequest(query=nested), metadata=alice), "max_query_bytes"),
            (env.batches.ListBatches(bpb.ListBatchesRequest(query="(a)"), metadata=alice), "parentheses"),
        ]
        for call, named in cases:
            error = await refused(call)
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert list(descriptions(error)) == ["query"]
            assert named in descriptions(error)["query"]
        answered = await env.batches.ListBatches(bpb.ListBatchesRequest(query="x" * 64), metadata=alice)
        assert list(answered.batches) == []
        answered = await env.batches.ListBatches(bpb.ListBatchesRequest(query="a b c"), metadata=alice)
        assert list(answered.batches) == []


# ---------------------------------------------------------------- time


async def test_a_read_past_the_statement_limit_is_resource_exhausted_and_the_frontend_goes_on(
        start_env, db_config: DatabaseConfig) -> None:
    async with start_env(max_statement_time_s=0.3) as env:
        batch_id = await env.submit(spec())
        alice = env.as_("alice")
        with table_locked(db_config, "batches"):
            for call in (env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=alice),
                         env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=alice),
                         env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id), metadata=alice)):
                error = await refused(call)
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                assert "max_statement_time_s" in message(error) and "0.3 s" in message(error)
        listed = await env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=alice)
        assert [b.batch_id for b in listed.batches] == [batch_id]


async def test_a_watch_whose_poll_runs_past_the_statement_limit_ends_resource_exhausted(
        start_env, db_config: DatabaseConfig) -> None:
    async with start_env(max_statement_time_s=0.3) as env:
        batch_id = await env.submit(spec())
        stream = env.batches.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id), metadata=env.as_("alice"))
        await eventually(lambda: open_streams(env.frontend, "alice") == 1)  # polling (no driver publishes)
        with table_locked(db_config, "batch_event_sequences"):
            error = await refused(stream.read())
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert open_streams(env.frontend, "alice") == 0


async def test_a_unary_call_past_the_servers_deadline_is_deadline_exceeded(
        start_env, db_config: DatabaseConfig) -> None:
    async with start_env(max_statement_time_s=60, rpc_deadline_s=0.3) as env:
        batch_id = await env.submit(spec())
        alice = env.as_("alice")
        with table_locked(db_config, "batches"):
            error = await refused(env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=alice))
        assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "rpc_deadline_s" in message(error) and "0.3 s" in message(error)
        listed = await env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=alice)
        assert [b.batch_id for b in listed.batches] == [batch_id]


# ---------------------------------------------------------------- streams


async def test_streams_per_user_are_limited_and_released_however_they_end(start_env) -> None:
    async with start_env(max_streams_per_user=2) as env:
        batch_id = await env.submit(spec())
        request = bpb.WatchBatchRequest(batch_id=batch_id)
        alice, bob = env.as_("alice"), env.as_("bob")
        # No driver publishes events here: the streams stay open, polling.
        first = env.batches.WatchBatch(request, metadata=alice)
        second = env.batches.WatchBatch(request, metadata=alice)
        await eventually(lambda: open_streams(env.frontend, "alice") == 2)
        error = await refused(env.batches.WatchBatch(request, metadata=alice).read())
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_streams_per_user = 2" in message(error)
        # The limit is per user: bob, a member too, still may.
        other = env.batches.WatchBatch(request, metadata=bob)
        await eventually(lambda: open_streams(env.frontend, "bob") == 1)
        # A stream the client cancels gives its slot back.
        first.cancel()
        await eventually(lambda: open_streams(env.frontend, "alice") == 1)
        third = env.batches.WatchBatch(request, metadata=alice)
        await eventually(lambda: open_streams(env.frontend, "alice") == 2)
        # So does a stream that ends in an error (carol may not read the batch: to her it does
        # not exist), and one refused for a field: none keeps a slot.
        for _ in range(3):
            assert (await refused(env.batches.WatchBatch(request, metadata=env.as_("carol")).read())).code() \
                == grpc.StatusCode.NOT_FOUND
            bad = bpb.WatchBatchRequest(batch_id=batch_id, query="(")
            assert (await refused(env.batches.WatchBatch(bad, metadata=bob).read())).code() \
                == grpc.StatusCode.INVALID_ARGUMENT
        assert open_streams(env.frontend, "carol") == 0 and open_streams(env.frontend, "bob") == 1
        # Every kind of server stream counts: StreamJobLog following a job that never ran (it waits for it), and
        # one refused (no such attempt) holds no slot.
        for stream in (second, other, third):
            stream.cancel()
        await eventually(lambda: open_streams(env.frontend, "alice") == open_streams(env.frontend, "bob") == 0)
        log = env.jobs.StreamJobLog(jpb.StreamJobLogRequest(batch_id=batch_id, job_id=1), metadata=alice)
        assert await log.read() == jpb.StreamJobLogResponse()  # not run yet: waiting
        assert open_streams(env.frontend, "alice") == 1
        log.cancel()
        await eventually(lambda: open_streams(env.frontend, "alice") == 0)
        missing = env.jobs.StreamJobLog(jpb.StreamJobLogRequest(batch_id=batch_id, job_id=1, attempt_id="nope"),
                                        metadata=alice)
        assert (await refused(missing.read())).code() == grpc.StatusCode.NOT_FOUND
        assert open_streams(env.frontend, "alice") == 0


# ---------------------------------------------------------------- message sizes


async def test_a_request_over_the_message_size_is_resource_exhausted(start_env) -> None:
    async with start_env(max_request_bytes=64 * 1024) as env:
        big = job_spec_pb2.JobSpec(image="busybox", script="x" * (100 * 1024))
        error = await refused(env.batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                             billing_project="proj", jobs=[big]),
                                                      metadata=env.as_("alice")))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await env.world.db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 0}
        small = job_spec_pb2.JobSpec(image="busybox", script="x" * (32 * 1024))
        await env.batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                             billing_project="proj", jobs=[small]),
                                      metadata=env.as_("alice"))


async def test_every_server_sets_its_message_size_explicitly(auth_app: AuthApp,
                                                             certs: DevCertificateAuthority) -> None:
    """The default of services.common.server.serve (gRPC's 4 MiB, now a decision): auth's public port."""
    async with person_channel(certs.issue("someone"), auth_app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        error = await refused(stub.Login(auth_service_pb2.LoginRequest(username="root", password="x" * (5 << 20))))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_bytes_that_are_no_message_of_the_requests_type_are_invalid_argument(
        auth_app: AuthApp, certs: DevCertificateAuthority, admin_token: str) -> None:
    """A request grpc cannot decode (corrupt wire format: a truncated field) is the caller's error, not a
    server error; the server goes on serving."""
    async with person_channel(certs.issue("someone"), auth_app.public_port) as channel:
        whoami = channel.unary_unary("/corral.auth.v1.AuthService/WhoAmI", request_serializer=None,
                                     response_deserializer=auth_service_pb2.WhoAmIResponse.FromString)
        corrupt = b"\x0a\xff\xff\xff\x0f"  # field 1, length-delimited, longer than the message
        error = await refused(whoami(corrupt, metadata=(("authorization", f"Bearer {admin_token}"),)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
        assert "not a well-formed message" in (error.details() or "")
        answer = await whoami(b"", metadata=(("authorization", f"Bearer {admin_token}"),))
        assert answer.user.username == "root"
