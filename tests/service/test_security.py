"""Every public RPC refuses who it must, and a refused call writes nothing.

The RPCs come from the service descriptors, so a new RPC without a case
here fails `test_every_rpc_has_a_case`. Each case is a request a member
(alice, the batch's owner) could make; it is sent
  (a) without a token and (b) with an expired token -> UNAUTHENTICATED,
  (c) by carol, a user outside the batch's billing project, and by a
      service identity's token (which acts as a user, never as a corral
      service) -> the case's `outsider` code: NOT_FOUND for a project's
      batches, jobs, groups and the project itself, exactly what a missing
      one gets (`test_outsiders_get_the_answer_of_a_missing_batch_or_project`),
      PERMISSION_DENIED for admin-only actions; None where carol may make
      the call,
  (d) by bob, a member of the project who does not own the batch -> the
      case's `member` code: PERMISSION_DENIED for changes (he may know the
      batch exists), None for what he may do,
and after each refused call every table's row count and checksum are what
they were before. A client stream's request is its messages, in order
(ImageService.ImportImage: a header, then the archive); the frontend here
keeps images in a real registry with a push login, as a deployment that
keeps images does. Malformed input is INVALID_ARGUMENT with a BadRequest
naming the field, also writing nothing; and the internal (mutual TLS)
listeners of auth, the driver and a worker refuse a caller without a client
certificate.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message

from corral.calls import CLIENT_WRITE_RACE
from corral.auth.v1 import auth_service_pb2_grpc
from corral.auth.v1 import auth_service_pb2 as apb
from corral.batch.v1 import job_group_pb2, job_spec_pb2, job_state_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import fleet_service_pb2 as fpb
from corral.batch.v1 import fleet_service_pb2_grpc
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import image_service_pb2 as ipb
from corral.batch.v1 import image_service_pb2_grpc
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import lock_service_pb2 as lpb
from corral.batch.v1 import lock_service_pb2_grpc
from corral.batch.v1 import secret_service_pb2 as spb
from corral.billing.v1 import billing_service_pb2_grpc
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.billing.v1 import quota_pb2
from corral.driver.v1 import driver_service_pb2 as dpb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.worker.v1 import worker_service_pb2 as wpb
from corral.worker.v1 import worker_service_pb2_grpc
from services.auth.app import AuthApp
from services.auth.servicer import ANONYMOUS_METHODS
from services.auth.store import AuthStore
from services.common.authz import allowed_callers
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.driver.app import DriverConfig
from services.driver.app import start as start_driver
from services.frontend.limits import Limits
from services.registry.server import RegistryServer
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from tests.conftest import service_url
from tests.service.conftest import person_channel, service_channel
from tests.service.test_driver_app import eventually
from tests.service.test_images_service import archive, push_login_file, push_registry  # noqa: F401 - a fixture
from tests.service.test_jobs import Env, make_env, refused, secrets_key_pair, spec, start_frontend, violations
from tests.world import FakeClock

PD, NF = grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND
MISSING_BATCH_ID = 987_654_321
SERVICES = (bpb.DESCRIPTOR.services_by_name["BatchService"], jpb.DESCRIPTOR.services_by_name["JobService"],
            gpb.DESCRIPTOR.services_by_name["JobGroupService"], lpb.DESCRIPTOR.services_by_name["LockService"],
            fpb.DESCRIPTOR.services_by_name["FleetService"],
            spb.DESCRIPTOR.services_by_name["SecretService"], ipb.DESCRIPTOR.services_by_name["ImageService"],
            cpb.DESCRIPTOR.services_by_name["BillingService"], apb.DESCRIPTOR.services_by_name["AuthService"])
EARLY_ANSWER_S = 0.3
"""How long a client stream waits, after its first message, for the server to refuse it before sending the others
(`client_stream`); a refusal that comes later is asked for again with the first message alone."""
OPEN_S = 1.0
"""How long a server stream that says nothing must stay open to have been accepted (`call_method`)."""


@dataclasses.dataclass(frozen=True)
class World:
    """What the cases refer to: alice's batch, its open update, alice's token id, the project, an image."""

    batch_id: int
    update_id: int
    alice_token_id: str
    alice_token: str
    project: str = "proj"
    image_archive: bytes = b""
    """A `docker save` archive of busybox: what ImportImage's chunks carry."""


Request = message.Message | tuple[message.Message, ...]
"""A unary or server-streaming method's request; a client-streaming method's messages, in order."""


def import_image(project: str, name: str, archive: bytes, chunk_bytes: int = 1 << 20) -> tuple[message.Message, ...]:
    """ImportImage's messages: the header, then the archive in chunks."""
    return (ipb.ImportImageRequest(header=ipb.ImportImageHeader(billing_project=project, name=name)),
            *(ipb.ImportImageRequest(chunk=archive[i:i + chunk_bytes]) for i in range(0, len(archive), chunk_bytes)))


@dataclasses.dataclass(frozen=True)
class Case:
    request: Callable[[World], Request]
    outsider: grpc.StatusCode | None = NF
    """What carol gets; None: she may make this call (it is not sent as carol)."""
    member: grpc.StatusCode | None = None
    """What bob (a member, not the batch's owner, not an administrator) gets; None: he may."""


# Full method name -> a request alice could make, and what carol and bob get.
CASES: dict[str, Case] = {
    "/corral.batch.v1.BatchService/CreateBatch": Case(lambda w: bpb.CreateBatchRequest(
        billing_project=w.project, idempotency_token="sec", n_jobs=1)),
    "/corral.batch.v1.BatchService/GetBatch": Case(lambda w: bpb.GetBatchRequest(batch_id=w.batch_id)),
    "/corral.batch.v1.BatchService/ListBatches": Case(lambda w: bpb.ListBatchesRequest(), outsider=None),
    "/corral.batch.v1.BatchService/ListRegions": Case(lambda w: bpb.ListRegionsRequest(), outsider=None),
    "/corral.batch.v1.BatchService/CancelBatch": Case(lambda w: bpb.CancelBatchRequest(batch_id=w.batch_id),
                                                      member=PD),
    "/corral.batch.v1.BatchService/DeleteBatch": Case(lambda w: bpb.DeleteBatchRequest(batch_id=w.batch_id),
                                                      member=PD),
    "/corral.batch.v1.BatchService/HoldJobs": Case(lambda w: bpb.HoldJobsRequest(batch_id=w.batch_id), member=PD),
    "/corral.batch.v1.BatchService/ReleaseJobs": Case(lambda w: bpb.ReleaseJobsRequest(batch_id=w.batch_id),
                                                      member=PD),
    "/corral.batch.v1.BatchService/WatchBatch": Case(lambda w: bpb.WatchBatchRequest(batch_id=w.batch_id)),
    "/corral.batch.v1.BatchService/CreateUpdate": Case(lambda w: bpb.CreateUpdateRequest(
        batch_id=w.batch_id, n_jobs=1, idempotency_token="sec"), member=PD),
    "/corral.batch.v1.BatchService/CreateJobGroups": Case(lambda w: bpb.CreateJobGroupsRequest(
        batch_id=w.batch_id, update_id=w.update_id, job_groups=[job_group_pb2.JobGroupSpec()]), member=PD),
    "/corral.batch.v1.BatchService/AddJobs": Case(lambda w: bpb.AddJobsRequest(
        batch_id=w.batch_id, update_id=w.update_id, jobs=[spec()]), member=PD),
    "/corral.batch.v1.BatchService/CommitUpdate": Case(lambda w: bpb.CommitUpdateRequest(
        batch_id=w.batch_id, update_id=w.update_id), member=PD),
    "/corral.batch.v1.BatchService/SubmitBatch": Case(lambda w: bpb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex, billing_project=w.project, jobs=[spec()])),
    "/corral.batch.v1.BatchService/EstimateBatch": Case(lambda w: bpb.EstimateBatchRequest(
        billing_project=w.project, jobs=[spec()])),
    "/corral.batch.v1.BatchService/RerunFailedJobs": Case(lambda w: bpb.RerunFailedJobsRequest(
        batch_id=w.batch_id, idempotency_token="sec"), member=PD),
    "/corral.batch.v1.JobService/GetJob": Case(lambda w: jpb.GetJobRequest(batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobService/ListJobs": Case(lambda w: jpb.ListJobsRequest(batch_id=w.batch_id)),
    "/corral.batch.v1.JobService/GetJobAttempts": Case(lambda w: jpb.GetJobAttemptsRequest(
        batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobService/GetJobLog": Case(lambda w: jpb.GetJobLogRequest(batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobService/StreamJobLog": Case(lambda w: jpb.StreamJobLogRequest(
        batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobService/GetAttemptUsage": Case(lambda w: jpb.GetAttemptUsageRequest(
        batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobService/ExplainJob": Case(lambda w: jpb.ExplainJobRequest(batch_id=w.batch_id, job_id=1)),
    "/corral.batch.v1.JobGroupService/GetJobGroup": Case(lambda w: gpb.GetJobGroupRequest(
        batch_id=w.batch_id, job_group_id=1)),
    "/corral.batch.v1.JobGroupService/ListJobGroups": Case(lambda w: gpb.ListJobGroupsRequest(batch_id=w.batch_id)),
    "/corral.batch.v1.JobGroupService/CancelJobGroup": Case(lambda w: gpb.CancelJobGroupRequest(
        batch_id=w.batch_id, job_group_id=1), member=PD),
    # The fleet is for administrators: refused before any field is read.
    "/corral.batch.v1.FleetService/ListPools": Case(lambda w: fpb.ListPoolsRequest(), outsider=PD, member=PD),
    "/corral.batch.v1.FleetService/ListInstances": Case(lambda w: fpb.ListInstancesRequest(pool="standard"),
                                                        outsider=PD, member=PD),
    "/corral.batch.v1.FleetService/PausePool": Case(lambda w: fpb.PausePoolRequest(pool="standard"),
                                                    outsider=PD, member=PD),
    "/corral.batch.v1.FleetService/ResumePool": Case(lambda w: fpb.ResumePoolRequest(pool="standard"),
                                                     outsider=PD, member=PD),
    "/corral.batch.v1.LockService/ListLocks": Case(lambda w: lpb.ListLocksRequest(billing_project=w.project)),
    # A project's secrets: its members (and administrators) change them, whoever reads the project lists them.
    "/corral.batch.v1.SecretService/CreateSecret": Case(lambda w: spb.CreateSecretRequest(
        billing_project=w.project, name="db", files={"password": b"hunter2"})),
    "/corral.batch.v1.SecretService/ListSecrets": Case(lambda w: spb.ListSecretsRequest(billing_project=w.project)),
    "/corral.batch.v1.SecretService/DeleteSecret": Case(lambda w: spb.DeleteSecretRequest(
        billing_project=w.project, name="db")),
    # A project's images: the same rule as its secrets.
    "/corral.batch.v1.ImageService/ImportImage": Case(lambda w: import_image(w.project, "tool", w.image_archive)),
    "/corral.batch.v1.ImageService/ListImages": Case(lambda w: ipb.ListImagesRequest(billing_project=w.project)),
    "/corral.batch.v1.ImageService/DeleteImage": Case(lambda w: ipb.DeleteImageRequest(
        billing_project=w.project, name="tool")),
    "/corral.billing.v1.BillingService/CreateBillingProject": Case(lambda w: cpb.CreateBillingProjectRequest(
        name="new-lab"), outsider=PD, member=PD),
    "/corral.billing.v1.BillingService/GetBillingProject": Case(lambda w: cpb.GetBillingProjectRequest(
        billing_project=w.project)),
    "/corral.billing.v1.BillingService/ListBillingProjects": Case(lambda w: cpb.ListBillingProjectsRequest(),
                                                                  outsider=None),
    "/corral.billing.v1.BillingService/AddMember": Case(lambda w: cpb.AddMemberRequest(
        billing_project=w.project, username="carol"), member=PD),
    "/corral.billing.v1.BillingService/RemoveMember": Case(lambda w: cpb.RemoveMemberRequest(
        billing_project=w.project, username="alice"), member=PD),
    "/corral.billing.v1.BillingService/SetLimit": Case(lambda w: cpb.SetLimitRequest(
        billing_project=w.project, limit_micro_usd=1), member=PD),
    "/corral.billing.v1.BillingService/CloseBillingProject": Case(lambda w: cpb.CloseBillingProjectRequest(
        billing_project=w.project), member=PD),
    "/corral.billing.v1.BillingService/ReopenBillingProject": Case(lambda w: cpb.ReopenBillingProjectRequest(
        billing_project=w.project), member=PD),
    "/corral.billing.v1.BillingService/DeleteBillingProject": Case(lambda w: cpb.DeleteBillingProjectRequest(
        billing_project=w.project), member=PD),
    "/corral.billing.v1.BillingService/GetSpend": Case(lambda w: cpb.GetSpendRequest(billing_project=w.project)),
    # Quotas: administrators set them; anyone lists those they may see (their projects' and their own).
    "/corral.billing.v1.BillingService/SetQuota": Case(lambda w: cpb.SetQuotaRequest(
        kind=quota_pb2.QUOTA_KIND_PROJECT, name=w.project, max_running_jobs=1), outsider=PD, member=PD),
    "/corral.billing.v1.BillingService/ListQuotas": Case(lambda w: cpb.ListQuotasRequest(), outsider=None),
    "/corral.billing.v1.BillingService/WatchSpend": Case(lambda w: cpb.WatchSpendRequest(
        billing_project=w.project)),
    # Logout and WhoAmI concern only the caller's own session.
    "/corral.auth.v1.AuthService/Logout": Case(lambda w: apb.LogoutRequest(), outsider=None),
    "/corral.auth.v1.AuthService/WhoAmI": Case(lambda w: apb.WhoAmIRequest(), outsider=None),
    # Administration: refused before any name is looked up, so nothing is revealed.
    "/corral.auth.v1.AuthService/CreateUser": Case(lambda w: apb.CreateUserRequest(username="mallory"),
                                                   outsider=PD, member=PD),
    "/corral.auth.v1.AuthService/GetUser": Case(lambda w: apb.GetUserRequest(username="alice"), outsider=PD,
                                                member=PD),
    "/corral.auth.v1.AuthService/ListUsers": Case(lambda w: apb.ListUsersRequest(), outsider=PD, member=PD),
    "/corral.auth.v1.AuthService/DeactivateUser": Case(lambda w: apb.DeactivateUserRequest(username="alice"),
                                                       outsider=PD, member=PD),
    "/corral.auth.v1.AuthService/CreateToken": Case(lambda w: apb.CreateTokenRequest(name="x", username="alice"),
                                                    outsider=PD, member=PD),
    "/corral.auth.v1.AuthService/ListTokens": Case(lambda w: apb.ListTokensRequest(username="alice"), outsider=PD,
                                                   member=PD),
    # Auth does not tell people whether someone else's token id exists.
    "/corral.auth.v1.AuthService/RevokeToken": Case(lambda w: apb.RevokeTokenRequest(token_id=w.alice_token_id),
                                                    member=NF),
}
# Internal methods served on public listeners (VerifyToken) are refused to every token: tests/service/test_authz.py.


def all_methods() -> dict[str, Any]:
    return {f"/{service.full_name}/{method.name}": method for service in SERVICES for method in service.methods}


def test_every_rpc_has_a_case() -> None:
    methods = all_methods()
    assert ANONYMOUS_METHODS == {"/corral.auth.v1.AuthService/Login"}
    internal = {m for m in methods if allowed_callers(m)}
    assert internal == {"/corral.auth.v1.AuthService/VerifyToken"}
    assert set(CASES) == set(methods) - ANONYMOUS_METHODS - internal
    assert all(isinstance(CASES[m].request(World(1, 1, "t", "t")), tuple) == methods[m].client_streaming
               for m in CASES)  # a client stream's request is its messages


async def snapshot(db: Database) -> dict[str, tuple[int, int]]:
    """Row count and checksum of every table of the test's database."""
    tables = [r["name"] for r in await db.fetchall(
        "SELECT table_name AS name FROM information_schema.tables WHERE table_schema = DATABASE()"
        " AND table_type = 'BASE TABLE' ORDER BY table_name")]
    checksums = {r["Table"].split(".", 1)[1]: r["Checksum"] for r in await db.fetchall(
        "CHECKSUM TABLE " + ", ".join(f"`{t}`" for t in tables))}
    counts = await db.fetchone("SELECT " + ", ".join(f"(SELECT COUNT(*) FROM `{t}`) AS `{t}`" for t in tables))
    assert counts is not None
    return {t: (int(counts[t]), int(checksums[t] or 0)) for t in tables}



async def client_stream(stub_method: Any, requests: Sequence[message.Message], metadata: tuple) -> message.Message:
    """A client-streaming call's response: its first message is sent, then, unless the server has answered within
    EARLY_ANSWER_S, the others and the end of the stream. corral's servicers refuse on the first message (a header)
    or read the stream to its end; and grpcio may report INTERNAL "Internal error from Core" instead of the
    server's answer when the server refuses while the client still writes (grpc/grpc#36066), so the stream stays
    open, its first message alone sent, until the server has had time to refuse it."""
    answered = asyncio.Event()

    async def messages() -> AsyncIterator[message.Message]:
        yield requests[0]
        try:
            await asyncio.wait_for(answered.wait(), EARLY_ANSWER_S)
        except TimeoutError:
            for request in requests[1:]:
                yield request

    call = stub_method(messages(), metadata=metadata)
    call.add_done_callback(lambda _: answered.set())
    try:
        return await call
    except grpc.aio.AioRpcError as race:
        if race.code() != grpc.StatusCode.INTERNAL or race.details() != CLIENT_WRITE_RACE:
            raise
    # The refusal came while the chunks were being written, after EARLY_ANSWER_S (a loaded machine): as corral's
    # client does, ask with the first message alone, whose refusal is the answer; a stream refused only later
    # (its first message taken, "chunk" refused) keeps grpcio's INTERNAL.
    async def first_only() -> AsyncIterator[message.Message]:
        yield requests[0]

    try:
        return await stub_method(first_only(), metadata=metadata)
    except grpc.aio.AioRpcError as refusal:
        if refusal.code() == grpc.StatusCode.INVALID_ARGUMENT and "chunk" in (refusal.details() or ""):
            raise race from None
        raise


async def call_method(stub: Any, method: Any, request: Request, metadata: tuple) -> None:
    """Make the call `method` (a method's descriptor) on `stub`, raising AioRpcError if it fails: a server stream
    succeeds once it sends something or stays open OPEN_S (then it is cancelled), a client stream is sent as
    `client_stream` sends it."""
    stub_method = getattr(stub, method.name)
    if method.client_streaming:
        assert isinstance(request, tuple)
        await client_stream(stub_method, request, metadata)
    elif method.server_streaming:
        stream = stub_method(request, metadata=metadata)
        try:
            await asyncio.wait_for(stream.read(), timeout=OPEN_S)
        except TimeoutError:
            pass  # open and waiting for something to say
        finally:
            stream.cancel()
    else:
        await stub_method(request, metadata=metadata)


@dataclasses.dataclass
class Callers:
    """Stubs by service name, on the frontend's or auth's public listener."""

    stubs: dict[str, Any]

    async def call(self, method: str, request: Request, metadata: tuple) -> grpc.StatusCode:
        """The status the call ends with (OK when it succeeds)."""
        return (await self.answer(method, request, metadata))[0]

    async def answer(self, method: str, request: Request, metadata: tuple) -> tuple[grpc.StatusCode, str]:
        """The status the call ends with and its message."""
        service, name = method.strip("/").split("/")
        descriptor = all_methods()[method]
        try:
            if descriptor.server_streaming:
                stream = getattr(self.stubs[service], name)(request, metadata=metadata)
                try:
                    await stream.read()
                finally:
                    stream.cancel()
            elif descriptor.client_streaming:
                assert isinstance(request, tuple)
                await client_stream(getattr(self.stubs[service], name), request, metadata)
            else:
                await getattr(self.stubs[service], name)(request, metadata=metadata)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        return grpc.StatusCode.OK, ""


@pytest.fixture(scope="module")
def image_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """The registry of the module's frontends, behind a push login. Each test has a database of its own, but the
    registry keeps what a test imports: a test that needs an image (or its absence) names it uniquely."""
    with push_registry(tmp_path_factory.mktemp("registry")) as server:
        yield server


@pytest.fixture
async def env(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
              certs: DevCertificateAuthority, tmp_path: Path, image_registry: RegistryServer) -> AsyncIterator[Env]:
    """tests.service.test_jobs's env, its frontend keeping images in `image_registry` (ImageService answers as in
    a deployment that keeps images, not FAILED_PRECONDITION)."""
    private, public = secrets_key_pair(tmp_path)
    frontend = await start_frontend(auth_app, db_config, certs, tmp_path / "blobs", secrets_public_key_file=public,
                                    own_registry_push=image_registry.url,
                                    own_registry_push_login_file=push_login_file(tmp_path))
    try:
        async for value in make_env(frontend, auth_app, db, clock, certs, tmp_path / "blobs", secrets_key=private):
            yield value
    finally:
        await frontend.stop()


@pytest.fixture
async def callers(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority) -> AsyncIterator[Callers]:
    async with person_channel(certs.issue("someone"), auth_app.public_port) as auth_channel, \
            person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        yield Callers({
            "corral.batch.v1.BatchService": env.batches, "corral.batch.v1.JobService": env.jobs,
            "corral.batch.v1.JobGroupService": env.groups,
            "corral.batch.v1.LockService": lock_service_pb2_grpc.LockServiceStub(channel),
            "corral.batch.v1.FleetService": fleet_service_pb2_grpc.FleetServiceStub(channel),
            "corral.batch.v1.SecretService": env.secrets,
            "corral.batch.v1.ImageService": image_service_pb2_grpc.ImageServiceStub(channel),
            "corral.billing.v1.BillingService": billing_service_pb2_grpc.BillingServiceStub(channel),
            "corral.auth.v1.AuthService": auth_service_pb2_grpc.AuthServiceStub(auth_channel)})


@pytest.fixture
async def world(env: Env, auth_app: AuthApp, archive: Path) -> World:
    """alice's batch (job 1 failed, job 2 cancelled, group 1), an open update, an expired token."""
    w = env.world
    await w.instance()
    group = job_spec_pb2.JobSpec()
    group.CopyFrom(spec())
    group.job_group.in_update_index = 0
    batch_id = await env.submit(group, spec(-1), groups=(job_group_pb2.JobGroupSpec(),))
    attempt = await w.run(batch_id, 1)
    await w.store.mark_jobs_complete(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 1, "attempt_id": attempt,
                                                      "state": "Failed", "exit_code": 1}])
    await w.drain(batch_id)
    update = await env.batches.CreateUpdate(bpb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                                    batch_id=batch_id, n_jobs=1, n_job_groups=1),
                                            metadata=env.as_("alice"))
    people = AuthStore(auth_app.db)
    token, secret = await people.create_token("alice", "api", name="expiring")
    await auth_app.db.execute("UPDATE tokens SET time_expires_ms = 1 WHERE token_id = %s", (token.token_id,))
    env.tokens["expired"] = secret
    alice_token = await auth_app.db.fetchone("SELECT token_id FROM tokens WHERE username = 'alice' AND name = ''")
    assert alice_token is not None
    # A service identity with the user role and no billing project: an outsider like carol.
    await people.create_user("pipeline", kind="service")
    env.tokens["service identity"] = (await people.create_token("pipeline", "api", name="ci"))[1]
    return World(batch_id, update.update.update_id, alice_token["token_id"], env.tokens["alice"],
                 image_archive=archive.read_bytes())


def expected_code(case: Case, who: str) -> grpc.StatusCode | None:
    """What `who` gets for the case; None: not sent (they may make the call)."""
    if who in ("outsider", "service identity"):
        return case.outsider
    if who == "member":
        return case.member
    return grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.parametrize("who", ["anonymous", "expired", "outsider", "service identity", "member"])
async def test_refused_calls_are_refused_and_write_nothing(env: Env, callers: Callers, world: World,
                                                           who: str) -> None:
    before = await snapshot(env.world.db)
    token = {"outsider": "carol", "member": "bob"}.get(who, who)
    checked = 0
    for method, case in sorted(CASES.items()):
        expected = expected_code(case, who)
        if expected is None:
            continue
        metadata = () if who == "anonymous" else env.as_(token)
        code = await callers.call(method, case.request(world), metadata)
        assert code == expected, f"{method} as {who}: {code.name}"
        assert await snapshot(env.world.db) == before, f"{method} as {who} wrote something"
        checked += 1
    assert checked == len([c for c in CASES.values() if expected_code(c, who) is not None])


async def test_outsiders_get_the_answer_of_a_missing_batch_or_project(env: Env, callers: Callers,
                                                                      world: World) -> None:
    """Same code, same message but for the id or name: an outsider cannot tell another project's
    batch (or the project) from one that does not exist."""
    missing = dataclasses.replace(world, batch_id=MISSING_BATCH_ID, project="no-such-project")
    compared = 0
    for method, case in sorted(CASES.items()):
        if case.outsider != NF or method.endswith("/RevokeToken"):
            continue
        answers = []
        for w in (world, missing):
            code, text = await callers.answer(method, case.request(w), env.as_("carol"))
            text = re.sub(rf"\b{w.batch_id}\b", "<batch>", text)
            answers.append((code, re.sub(rf"\b{re.escape(w.project)}\b", "<project>", text)))
        assert answers[0] == answers[1], method
        assert answers[0][0] == NF and ("no batch <batch>" in answers[0][1] or
                                        "no billing project <project>" in answers[0][1]), (method, answers[0])
        compared += 1
    assert compared == len([c for c in CASES.values() if c.outsider == NF]) - 1


async def test_the_snapshot_sees_a_write_that_keeps_the_row_count(env: Env, world: World) -> None:
    before = await snapshot(env.world.db)
    await env.world.db.execute("UPDATE jobs SET priority = priority + 1 WHERE batch_id = %s AND job_id = 2",
                               (world.batch_id,))
    after = await snapshot(env.world.db)
    assert after["jobs"][0] == before["jobs"][0] and after["jobs"][1] != before["jobs"][1]


async def test_the_cases_are_calls_alice_may_make(env: Env, callers: Callers, world: World) -> None:
    """So refusals above are about the caller, not about a broken request (reads only)."""
    reads = [m for m in CASES if m.split("/")[-1].startswith(("Get", "List", "Explain", "WhoAmI"))
             and "User" not in m and "Token" not in m and CASES[m].member is None]  # not administrators' only
    for method in reads:
        code = await callers.call(method, CASES[method].request(world), env.as_("alice"))
        # alice's job 1 ran on no real worker: its log is simply not there.
        allowed = {grpc.StatusCode.OK} | ({grpc.StatusCode.NOT_FOUND} if "Log" in method else set())
        assert code in allowed, f"{method}: {code.name}"


def bad_job(**fields: Any) -> job_spec_pb2.JobSpec:
    job = spec()
    for name, value in fields.items():
        if name == "no_image":
            job.image = ""
        elif name == "no_command":
            job.ClearField("argv")
        else:
            setattr(job, name, value) if not isinstance(value, message.Message) else getattr(job, name).CopyFrom(value)
    return job


MALFORMED = {
    "jobs[0].image": lambda w: [bad_job(no_image=True)],
    "jobs[0].command": lambda w: [bad_job(no_command=True)],
    "jobs[0].parents[0].job_id": lambda w: [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"]), parents=[job_spec_pb2.ParentRef(job_id=w)])],
    "jobs[0].resources.cores_mcpu": lambda w: [bad_job(resources=job_spec_pb2.ResourceRequest(cores_mcpu=-1))],
    "jobs[0].resources.memory_bytes": lambda w: [bad_job(resources=job_spec_pb2.ResourceRequest(memory_bytes=-1))],
    "jobs[0].parents[0].accepted_states": lambda w: [job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
        parents=[job_spec_pb2.ParentRef(job_id=1, accepted_states=[job_state_pb2.JOB_STATE_RUNNING])])],
}


@pytest.mark.parametrize("field", sorted(MALFORMED))
async def test_malformed_jobs_name_the_field_and_write_nothing(env: Env, world: World, field: str) -> None:
    update = await env.world.db.fetchone("SELECT start_job_id FROM batch_updates WHERE batch_id = %s AND update_id = %s",
                                         (world.batch_id, world.update_id))
    assert update is not None
    before = await snapshot(env.world.db)
    error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(
        batch_id=world.batch_id, update_id=world.update_id, jobs=MALFORMED[field](update["start_job_id"])),
        metadata=env.as_("alice")))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert violations(error) == [field]
    assert await snapshot(env.world.db) == before


async def test_oversize_bunches_and_bad_queries_name_the_field(env: Env, world: World) -> None:
    before = await snapshot(env.world.db)
    calls = [
        ("jobs", env.batches.AddJobs(bpb.AddJobsRequest(batch_id=world.batch_id, update_id=world.update_id,
                                                        jobs=[spec()] * (Limits().max_jobs_per_bunch + 1)),
                                     metadata=env.as_("alice"))),
        ("jobs", env.batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                billing_project="proj",
                                                                jobs=[spec()] * (Limits().max_jobs_per_bunch + 1)),
                                         metadata=env.as_("alice"))),
        ("query", env.jobs.ListJobs(jpb.ListJobsRequest(batch_id=world.batch_id, query="cost>>1"),
                                    metadata=env.as_("alice"))),
        ("query", env.batches.ListBatches(bpb.ListBatchesRequest(query='name="open'), metadata=env.as_("alice"))),
    ]
    for field, call in calls:
        error = await refused(call)
        assert (error.code(), violations(error)) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
    assert await snapshot(env.world.db) == before


async def test_internal_listeners_refuse_callers_without_a_certificate(
        auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    frontend_tls, person_tls = certs.issue("frontend"), certs.issue("someone")
    certs.issue("worker-w-sec")
    driver = await start_driver(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                             tmp_path / "driver", autoscaler_period_s=3600))
    worker = await start_worker(WorkerConfig(
        "w-sec", "wrong-token", 1000, (f"localhost:{driver.port}",), certs.directory, tmp_path / "worker",
        f"file://{tmp_path / 'blobs'}", rpc_timeout_s=1, reconnect_max_backoff_s=0.2, deactivate_timeout_s=1))
    try:
        await eventually(lambda: driver.election.is_leader)
        worker_port = int(worker.address.rsplit(":", 1)[1])

        async def status(channel: grpc.aio.Channel, call: Callable[[grpc.aio.Channel], Any]) -> grpc.StatusCode:
            try:
                await call(channel)
            except grpc.aio.AioRpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        async def refused_unless_certified(port: int, call: Callable[[grpc.aio.Channel], Any],
                                           served: grpc.StatusCode) -> None:
            async with person_channel(person_tls, port) as channel:
                assert await status(channel, call) == grpc.StatusCode.UNAVAILABLE  # the TLS handshake fails
            async with service_channel(frontend_tls, port) as channel:
                assert await status(channel, call) == served  # the same call with a service certificate

        await refused_unless_certified(auth_app.internal_port, lambda ch: auth_service_pb2_grpc.AuthServiceStub(
            ch).VerifyToken(apb.VerifyTokenRequest(token="x"), timeout=5), grpc.StatusCode.UNAUTHENTICATED)
        await refused_unless_certified(driver.port, lambda ch: driver_service_pb2_grpc.DriverServiceStub(
            ch).GetLeader(dpb.GetLeaderRequest(), timeout=5), grpc.StatusCode.OK)
        await refused_unless_certified(worker_port, lambda ch: worker_service_pb2_grpc.WorkerServiceStub(
            ch).GetStatus(wpb.GetStatusRequest(), timeout=5), grpc.StatusCode.OK)
    finally:
        await worker.stop()
        await driver.stop()
