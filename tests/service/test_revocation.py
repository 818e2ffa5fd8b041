"""A revoked token stops working everywhere within the stated bound
(docs/security.md, "Token caches and revocation delay").

Auth runs with a small `token_cache_ttl_s` (the bound) and a frontend with a
much longer `token_cache_s`, so the answer auth allows is what bounds the
frontend's cache. alice warms every cache: a call to each public service of
the frontend, and two server streams (WatchBatch, WatchSpend) held open.
She then revokes her token through auth's public API, and each service is
polled until it refuses the token: auth's own listener at once, every
frontend service and both streams (which end with UNAUTHENTICATED) within
the bound plus slack for a loaded machine. Drivers and workers take no
bearer token at all (mutual TLS only: tests/service/test_security.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import batch_service_pb2_grpc, job_group_service_pb2_grpc, job_service_pb2_grpc
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.app import AuthApp, AuthConfig
from services.auth.app import start as start_auth
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.app import FrontendApp, FrontendConfig
from services.frontend.app import start as start_frontend
from tests.conftest import service_url
from tests.service.conftest import bearer, limits_for_tests, person_channel
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import spec

pytestmark = pytest.mark.timeout(120)

BOUND_S = 1.0
"""auth's token_cache_ttl_s in this test: the revocation delay it states."""
FRONTEND_CACHE_S = 60.0
"""The frontend's own token_cache_s: longer, so auth's answer is what bounds it."""
SLACK_S = 5.0
"""Room for a loaded 2-core machine (a VerifyToken round trip, the event loop's delays)."""
POLL_S = 0.05

Call = Callable[[], Awaitable[object]]


@pytest.fixture
async def services(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                   tmp_path: Path) -> AsyncIterator[tuple[AuthApp, FrontendApp]]:
    auth = await start_auth(AuthConfig(service_url(db_config, "auth"), certs.directory, token_cache_ttl_s=BOUND_S))
    try:
        frontend = await start_frontend(FrontendConfig(
            service_url(db_config, "frontend"), certs.directory, f"localhost:{auth.internal_port}",
            f"file://{tmp_path / 'blobs'}", token_cache_s=FRONTEND_CACHE_S, limits=limits_for_tests()))
        try:
            yield auth, frontend
        finally:
            await frontend.stop()
    finally:
        await auth.stop()


async def refused_within(call: Call, limit_s: float) -> float:
    """Poll `call` until it is refused UNAUTHENTICATED; the seconds that took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while True:
        try:
            await call()
        except grpc.aio.AioRpcError as error:
            assert error.code() == grpc.StatusCode.UNAUTHENTICATED, (error.code(), error.details())
            return loop.time() - started
        assert loop.time() - started < limit_s, f"still accepted after {limit_s} s"
        await asyncio.sleep(POLL_S)


async def stream_ends_within(stream: grpc.aio.UnaryStreamCall, limit_s: float) -> float:
    """Wait for an open stream to end, which must be UNAUTHENTICATED; the seconds that took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(grpc.aio.AioRpcError) as error:
        async with asyncio.timeout(limit_s):
            async for _ in stream:
                pass
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED, (error.value.code(), error.value.details())
    return loop.time() - started


async def test_a_revoked_token_is_refused_everywhere_within_the_bound(
        services: tuple[AuthApp, FrontendApp], certs: DevCertificateAuthority, db: Database) -> None:
    auth, frontend = services
    people = AuthStore(auth.db)
    await people.create_user("alice")
    token, secret = await people.create_token("alice", "api")
    await JobStore(db).create_billing_project("proj", ["alice"])
    alice = bearer(secret)
    tls = certs.issue("someone")
    async with person_channel(tls, auth.public_port) as auth_channel, \
            person_channel(tls, frontend.public_port) as channel:
        auth_stub = auth_service_pb2_grpc.AuthServiceStub(auth_channel)
        batches = batch_service_pb2_grpc.BatchServiceStub(channel)
        jobs = job_service_pb2_grpc.JobServiceStub(channel)
        groups = job_group_service_pb2_grpc.JobGroupServiceStub(channel)
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        batch_id = (await batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                     billing_project="proj", jobs=[spec()]),
                                              metadata=alice)).batch.batch_id
        calls: dict[str, Call] = {
            "BatchService.GetBatch": lambda: batches.GetBatch(bpb.GetBatchRequest(batch_id=batch_id), metadata=alice),
            "JobService.ListJobs": lambda: jobs.ListJobs(jpb.ListJobsRequest(batch_id=batch_id), metadata=alice),
            "JobGroupService.ListJobGroups": lambda: groups.ListJobGroups(
                gpb.ListJobGroupsRequest(batch_id=batch_id), metadata=alice),
            "BillingService.ListBillingProjects": lambda: billing.ListBillingProjects(
                cpb.ListBillingProjectsRequest(), metadata=alice),
        }
        for call in calls.values():  # every cache holds the token now
            await call()
        watch = batches.WatchBatch(bpb.WatchBatchRequest(batch_id=batch_id), metadata=alice)
        spend = billing.WatchSpend(cpb.WatchSpendRequest(billing_project="proj"), metadata=alice)
        slots = frontend.servers.stream_slots
        assert slots is not None
        await eventually(lambda: slots.open_streams("alice") == 2)  # both are being served

        await auth_stub.RevokeToken(apb.RevokeTokenRequest(token_id=token.token_id), metadata=alice)
        # Auth's own listener keeps no cache: refused on the first try.
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await auth_stub.WhoAmI(apb.WhoAmIRequest(), metadata=alice)
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED

        limit_s = BOUND_S + SLACK_S
        took = await asyncio.gather(*(refused_within(call, limit_s) for call in calls.values()),
                                    stream_ends_within(watch, limit_s), stream_ends_within(spend, limit_s))
        names = [*calls, "BatchService.WatchBatch (open stream)", "BillingService.WatchSpend (open stream)"]
        print("refused after: " + ", ".join(f"{name} {s:.2f} s" for name, s in zip(names, took)))


async def test_a_stream_ends_when_its_token_expires(services: tuple[AuthApp, FrontendApp],
                                                    certs: DevCertificateAuthority, db: Database) -> None:
    """The cached answer ends at the token's expiry; so does a stream opened with it."""
    auth, frontend = services
    people = AuthStore(auth.db)
    await people.create_user("alice")
    _, secret = await people.create_token("alice", "api", ttl_ms=1_500)
    await JobStore(db).create_billing_project("proj", ["alice"])
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        spend = billing.WatchSpend(cpb.WatchSpendRequest(billing_project="proj"), metadata=bearer(secret))
        await stream_ends_within(spend, 1.5 + BOUND_S + SLACK_S)


async def test_an_unreachable_auth_service_refuses_tokens_as_unavailable(
        db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """Not INTERNAL (it was), and not let through: the token may have been revoked meanwhile."""
    auth = await start_auth(AuthConfig(service_url(db_config, "auth"), certs.directory))
    frontend = await start_frontend(FrontendConfig(
        service_url(db_config, "frontend"), certs.directory, f"localhost:{auth.internal_port}",
        f"file://{tmp_path / 'blobs'}", limits=limits_for_tests()))
    try:
        people = AuthStore(auth.db)
        await people.create_user("alice")
        _, secret = await people.create_token("alice", "api")
        await auth.stop()
        async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
            billing = billing_service_pb2_grpc.BillingServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await billing.ListBillingProjects(cpb.ListBillingProjectsRequest(), metadata=bearer(secret))
        assert error.value.code() == grpc.StatusCode.UNAVAILABLE, error.value.details()
        assert "cannot be verified now" in (error.value.details() or "")
    finally:
        await frontend.stop()


def test_the_bound_is_a_setting_of_both_services() -> None:
    """python -m services.auth --token-cache-ttl-s and python -m services.frontend --token-cache-s."""
    for module, flag in (("services.auth", "--token-cache-ttl-s"), ("services.frontend", "--token-cache-s")):
        shown = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=True,
                               cwd=Path(__file__).resolve().parents[2])
        assert flag in shown.stdout, module
