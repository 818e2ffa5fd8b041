"""Each user's share of a frontend replica over real gRPC (services/frontend/quotas.py; docs/security.md,
*Limits*, the rows "Requests per user", "Reads running at once per user", "Submissions per user" and
"Database connections for the health probe"), and how the client honours a refusal's google.rpc.RetryInfo
(docs/client.md, *Your share of a frontend*). Issue 33's attack as a whole, on processes:
tests/service/test_tenant_abuse.py.

A read is held running by a write lock on the table it reads, taken from another session.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

import corral
from corral import aio
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.frontend.app import FrontendApp, FrontendConfig, start
from tests.conftest import service_url
from tests.service.conftest import limits_for_tests, person_channel
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import Env, make_env, refused, spec
from tests.service.test_limits import table_locked
from tests.world import FakeClock


@contextlib.asynccontextmanager
async def quota_env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
                    certs: DevCertificateAuthority, tmp_path: Path, pool_size: int = 10,
                    **limits) -> AsyncIterator[Env]:
    """A frontend whose users are held to the quotas named in `limits` (the others lifted), with a users'
    pool of `pool_size` connections, and the people of tests/service/test_jobs.py."""
    url = service_url(db_config, "frontend")
    url += ("&" if "?" in url else "?") + f"pool_size={pool_size}"
    frontend = await start(FrontendConfig(url, certs.directory, f"localhost:{auth_app.internal_port}",
                                          f"file://{tmp_path / 'blobs'}", limits=limits_for_tests(**limits)))
    try:
        async for env in make_env(frontend, auth_app, db, clock, certs, tmp_path / "blobs"):
            yield env
    finally:
        await frontend.stop()


@pytest.fixture
def start_env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
              certs: DevCertificateAuthority, tmp_path: Path):
    """`async with start_env(pool_size=N, LIMIT=VALUE, ...) as env`: a frontend holding users to those quotas."""
    return lambda **settings: quota_env(auth_app, db_config, db, clock, certs, tmp_path, **settings)


def details(error: grpc.aio.AioRpcError) -> tuple[float | None, list[tuple[str, str]]]:
    """A refusal's RetryInfo delay (seconds) and its QuotaFailure violations (subject, description)."""
    status = rpc_status.from_call(error)
    delay, quotas = None, []
    for detail in status.details if status is not None else ():
        info, failure = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
        if detail.Unpack(info):
            delay = info.retry_delay.ToNanoseconds() / 1e9
        elif detail.Unpack(failure):
            quotas += [(v.subject, v.description) for v in failure.violations]
    return delay, quotas


def reads_running(frontend: FrontendApp, who: str) -> int:
    limiter = frontend.servers.user_limiter
    assert limiter is not None
    return limiter.reads_running(who)


async def test_requests_past_a_users_rate_are_refused_with_when_to_retry_and_others_go_on(start_env) -> None:
    async with start_env(max_requests_per_user_per_s=2, max_request_burst_per_user=3) as env:
        batch_id = await env.submit(spec(), who="bob")
        alice, get = env.as_("alice"), bpb.GetBatchRequest(batch_id=batch_id)
        for _ in range(3):  # a burst of three at once
            await env.batches.GetBatch(get, metadata=alice)
        error = await refused(env.batches.GetBatch(get, metadata=alice))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_requests_per_user_per_s" in (error.details() or "")
        delay, quotas = details(error)
        assert delay is not None and 0 < delay <= 0.5  # one call every 0.5 s
        assert quotas == [("user:alice", "max_requests_per_user_per_s")]
        # Every kind of call counts, and a refusal takes nothing: still refused before the delay.
        assert (await refused(env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id), metadata=alice))).code() \
            == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The bucket is alice's alone.
        await env.batches.GetBatch(get, metadata=env.as_("bob"))
        # After the delay it said, the same call is taken.
        await asyncio.sleep(delay)
        await env.batches.GetBatch(get, metadata=alice)


async def test_reads_at_once_per_user_are_limited_and_given_back_however_they_end(
        start_env, db_config: DatabaseConfig) -> None:
    async with start_env(max_concurrent_reads_per_user=2, max_statement_time_s=60) as env:
        batch_id = await env.submit(spec(), who="bob")
        alice = env.as_("alice")
        with table_locked(db_config, "jobs"):
            held = [asyncio.ensure_future(env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id), metadata=alice))
                    for _ in range(2)]
            await eventually(lambda: reads_running(env.frontend, "alice") == 2)
            error = await refused(env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=alice))
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "max_concurrent_reads_per_user = 2" in (error.details() or "")
            delay, quotas = details(error)
            assert delay == 1.0 and quotas == [("user:alice", "max_concurrent_reads_per_user")]
            # Another user reads on.
            got = await env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=env.as_("bob"),
                                             timeout=10)
            assert got.batch.batch_id == batch_id
        assert all(len(r.jobs) == 1 for r in await asyncio.gather(*held))
        # The slot is given back as the call ends on the server, which may be just after the client has its answer.
        await eventually(lambda: reads_running(env.frontend, "alice") == 0)
        # A read that fails gives its slot back too.
        for _ in range(3):
            missing = await refused(env.batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id + 1000),
                                                         metadata=alice))
            assert missing.code() == grpc.StatusCode.NOT_FOUND
        await eventually(lambda: reads_running(env.frontend, "alice") == 0)


async def test_a_users_submissions_a_minute_are_limited_and_others_still_submit(start_env) -> None:
    async with start_env(max_submissions_per_user_per_minute=3) as env:
        for _ in range(3):
            await env.submit(spec())
        error = await refused(env.batches.SubmitBatch(bpb.SubmitBatchRequest(
            billing_project="proj", jobs=[spec()], idempotency_token="fourth"), metadata=env.as_("alice")))
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_submissions_per_user_per_minute" in (error.details() or "")
        delay, quotas = details(error)
        assert delay is not None and 19 < delay <= 20  # one more every 20 s
        assert quotas == [("user:alice", "max_submissions_per_user_per_minute")]
        for call in (env.batches.CreateBatch(bpb.CreateBatchRequest(billing_project="proj", n_jobs=1,
                                                                    idempotency_token="fifth"),
                                             metadata=env.as_("alice")),):
            assert (await refused(call)).code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Nothing was written for the refused ones; bob submits; alice still reads her batches.
        listed = await env.batches.ListBatches(bpb.ListBatchesRequest(), metadata=env.as_("alice"))
        assert len(listed.batches) == 3
        await env.submit(spec(), who="bob")


async def test_the_client_waits_out_a_rate_refusal_and_raises_one_it_should_not_wait_for(
        start_env, certs: DevCertificateAuthority) -> None:
    async with start_env(max_requests_per_user_per_s=5, max_request_burst_per_user=1,
                         max_submissions_per_user_per_minute=1) as env:
        batch_id = await env.submit(spec(), who="bob")
        address = f"localhost:{env.frontend.public_port}"
        async with aio.Client(address, env.tokens["alice"], certs.ca_cert_path) as client:
            began = time.monotonic()
            for _ in range(6):  # one every 0.2 s: five are refused once, then taken after the wait
                assert (await client.get_batch(batch_id)).batch_id == batch_id
            assert time.monotonic() - began >= 5 * 0.2
            first = corral.BatchBuilder("proj")
            first.job("busybox", ["true"])
            await client.submit(first)

        def second_submission() -> corral.ResourceExhausted:
            with corral.Client(address, env.tokens["alice"], certs.ca_cert_path) as blocking:
                builder = corral.BatchBuilder("proj")
                builder.job("busybox", ["true"])
                try:
                    blocking.submit(builder)
                except corral.ResourceExhausted as e:
                    return e
            raise AssertionError("a second submission within the minute was taken")

        began = time.monotonic()
        error = await asyncio.to_thread(second_submission)
        assert error.retry_after_s is not None and 30 < error.retry_after_s <= 60  # too long to wait: raised
        assert error.quotas == ("max_submissions_per_user_per_minute",)
        assert "retry in" in str(error)
        assert time.monotonic() - began < 10


async def test_health_answers_from_its_own_pool_while_a_users_reads_fill_theirs(
        start_env, db_config: DatabaseConfig, certs: DevCertificateAuthority) -> None:
    """The probe runs every 2 s and says NOT_SERVING when `SELECT 1` takes 2 s: on the users' pool it
    would wait behind the reads that fill it (issue 33: NOT_SERVING every 6 s)."""
    async with start_env(pool_size=2, max_concurrent_reads_per_user=2, max_statement_time_s=60) as env:
        batch_id = await env.submit(spec(), who="bob")
        alice = env.as_("alice")
        async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            with table_locked(db_config, "jobs"):
                held = [asyncio.ensure_future(env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id),
                                                                metadata=alice)) for _ in range(2)]
                await eventually(lambda: reads_running(env.frontend, "alice") == 2)
                statuses = []
                ends = time.monotonic() + 7.0  # three probes at least
                while time.monotonic() < ends:
                    answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
                    statuses.append(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
                    await asyncio.sleep(0.2)
                assert set(statuses) == {"SERVING"}, statuses
            await asyncio.gather(*held)
