"""Every public RPC × every kind of user, with the exact code of each cell.

The RPCs come from the descriptor set shipped with the package
(`corral/descriptors.binpb`): every method of every service with REST
annotations, so a new RPC, or a new public service, fails
`test_every_public_rpc_is_in_the_table` until it has a row. The callers:

  anonymous   no token
  expired     alice's token past its expiry
  revoked     alice's token, revoked
  non_member  carol, a user outside the billing project 'proj'
  member      bob, a member of 'proj' who owns none of its batches
  owner       alice, a member of 'proj' who owns its batches
  admin       root, an administrator (a member of no project)

Each column runs on a world of its own (a fresh database) and every call
targets objects of its own where calls change things (a batch to cancel,
another to delete, a project to close...), so no call depends on the
order. Every refused call leaves every table as it was. A client
stream's request is its messages (ImportImage: a header, then a real
archive), sent as tests.service.test_security.client_stream sends them;
the frontend keeps images in a real registry behind a push login (one
per module: each column imports and deletes images of its own names).
Internal methods
by service identity: tests/service/test_authz.py; an outsider's answer
equal to a missing object's: tests/service/test_security.py.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import fleet_service_pb2 as fpb
from corral.batch.v1 import fleet_service_pb2_grpc
from corral.batch.v1 import image_service_pb2 as ipb
from corral.batch.v1 import image_service_pb2_grpc
from corral.batch.v1 import job_group_pb2, job_spec_pb2
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import lock_service_pb2 as lpb
from corral.batch.v1 import lock_service_pb2_grpc
from corral.batch.v1 import secret_service_pb2 as spb
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.billing.v1 import billing_service_pb2_grpc
from corral.billing.v1 import quota_pb2
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import person_channel
from tests.service.test_jobs import Env, spec
from tests.service.test_security import (  # noqa: F401 - archive, env and image_registry are fixtures
    Request,
    archive,
    call_method,
    client_stream,
    env,
    image_registry,
    import_image,
    snapshot,
)

pytestmark = pytest.mark.timeout(300)

DESCRIPTORS = Path(__file__).resolve().parents[2] / "corral" / "descriptors.binpb"
CALLERS = ("anonymous", "expired", "revoked", "non_member", "member", "owner", "admin")
PASSWORD = "dave's password"

OK = grpc.StatusCode.OK
UA, PD, NF = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND


def public_methods() -> dict[str, descriptor_pb2.MethodDescriptorProto]:
    """Every method of every service that has a REST annotation, by full name."""
    files = descriptor_pb2.FileDescriptorSet.FromString(DESCRIPTORS.read_bytes()).file
    methods = {}
    for file in files:
        for service in file.service:
            if any(m.options.HasExtension(annotations_pb2.http) for m in service.method):
                for method in service.method:
                    methods[f"/{file.package}.{service.name}/{method.name}"] = method
    return methods


@dataclasses.dataclass(frozen=True)
class World:
    """What the requests name; each call that changes something has its own target."""

    batch_id: int
    """alice's batch in 'proj': job 1 failed, job 2 cancelled, job group 1."""
    cancel_batch_id: int
    delete_batch_id: int
    update_ids: dict[str, int]
    """An open update of `batch_id` per method that uses one (AddJobs, CreateJobGroups, CommitUpdate)."""
    alice_token_id: str
    """A token of alice's to revoke."""
    image_archive: bytes
    """busybox, `docker save`d: what ImportImage imports."""
    image_name: str
    """A name of this world's own in 'proj' (the registry outlives the world): `NAME:latest` is there to delete,
    `NAME-new` is where ImportImage imports."""


def unauthenticated(rest: grpc.StatusCode, *, member: grpc.StatusCode, owner: grpc.StatusCode,
                    admin: grpc.StatusCode, non_member: grpc.StatusCode | None = None) -> dict[str, grpc.StatusCode]:
    """A row: UNAUTHENTICATED without a valid token, then the given codes."""
    return {"anonymous": UA, "expired": UA, "revoked": UA, "non_member": non_member or rest, "member": member,
            "owner": owner, "admin": admin}


@dataclasses.dataclass(frozen=True)
class Row:
    request: Callable[[World], Request]
    codes: dict[str, grpc.StatusCode]


B, J, G, L, C, A = ("/corral.batch.v1.BatchService/", "/corral.batch.v1.JobService/",
                    "/corral.batch.v1.JobGroupService/", "/corral.batch.v1.LockService/",
                    "/corral.billing.v1.BillingService/", "/corral.auth.v1.AuthService/")
S, I, F = "/corral.batch.v1.SecretService/", "/corral.batch.v1.ImageService/", "/corral.batch.v1.FleetService/"

# Reads of a batch: members read, outsiders get the answer of a missing batch.
READ = unauthenticated(NF, member=OK, owner=OK, admin=OK)
# Changes of a batch: its owner and administrators.
CHANGE = unauthenticated(NF, member=PD, owner=OK, admin=OK)
# Changes of a billing project: administrators; members are told no, outsiders not even that.
PROJECT_CHANGE = unauthenticated(NF, member=PD, owner=PD, admin=OK)
# Submitting to a project: its members.
SUBMIT = unauthenticated(NF, member=OK, owner=OK, admin=PD)
# A project's secrets: its members and administrators change them (members who own no batch too).
SECRETS = unauthenticated(NF, member=OK, owner=OK, admin=OK)
# A project's images: SecretService's rule.
IMAGES = SECRETS
# Administration of users: refused before any name is looked up.
ADMIN_ONLY = unauthenticated(PD, member=PD, owner=PD, admin=OK)
# About a user (alice): herself, and administrators.
ONESELF = unauthenticated(PD, member=PD, owner=OK, admin=OK)

TABLE: dict[str, Row] = {
    # Submitting charges the project: its members only (an administrator sees it, but is no member).
    B + "CreateBatch": Row(lambda w: bpb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                            billing_project="proj", n_jobs=1), SUBMIT),
    B + "GetBatch": Row(lambda w: bpb.GetBatchRequest(batch_id=w.batch_id), READ),
    B + "ListBatches": Row(lambda w: bpb.ListBatchesRequest(), unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    # The deployment's regions: anyone signed in.
    B + "ListRegions": Row(lambda w: bpb.ListRegionsRequest(), unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    B + "CancelBatch": Row(lambda w: bpb.CancelBatchRequest(batch_id=w.cancel_batch_id), CHANGE),
    B + "DeleteBatch": Row(lambda w: bpb.DeleteBatchRequest(batch_id=w.delete_batch_id), CHANGE),
    B + "HoldJobs": Row(lambda w: bpb.HoldJobsRequest(batch_id=w.batch_id, job_id=1), CHANGE),
    B + "ReleaseJobs": Row(lambda w: bpb.ReleaseJobsRequest(batch_id=w.batch_id, job_id=1), CHANGE),
    B + "WatchBatch": Row(lambda w: bpb.WatchBatchRequest(batch_id=w.batch_id), READ),
    B + "CreateUpdate": Row(lambda w: bpb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                              batch_id=w.batch_id, n_jobs=1), CHANGE),
    B + "CreateJobGroups": Row(lambda w: bpb.CreateJobGroupsRequest(
        batch_id=w.batch_id, update_id=w.update_ids["CreateJobGroups"], job_groups=[job_group_pb2.JobGroupSpec()]),
        CHANGE),
    B + "AddJobs": Row(lambda w: bpb.AddJobsRequest(batch_id=w.batch_id, update_id=w.update_ids["AddJobs"],
                                                    jobs=[spec()]), CHANGE),
    B + "CommitUpdate": Row(lambda w: bpb.CommitUpdateRequest(batch_id=w.batch_id,
                                                              update_id=w.update_ids["CommitUpdate"]), CHANGE),
    B + "SubmitBatch": Row(lambda w: bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                            billing_project="proj", jobs=[spec()]), SUBMIT),
    # Pricing a batch: who may submit it.
    B + "EstimateBatch": Row(lambda w: bpb.EstimateBatchRequest(billing_project="proj", jobs=[spec()]), SUBMIT),
    B + "RerunFailedJobs": Row(lambda w: bpb.RerunFailedJobsRequest(batch_id=w.batch_id, idempotency_token="rerun"),
                               CHANGE),
    J + "GetJob": Row(lambda w: jpb.GetJobRequest(batch_id=w.batch_id, job_id=1), READ),
    J + "ListJobs": Row(lambda w: jpb.ListJobsRequest(batch_id=w.batch_id), READ),
    J + "GetJobAttempts": Row(lambda w: jpb.GetJobAttemptsRequest(batch_id=w.batch_id, job_id=1), READ),
    # Job 1 ran on no real worker: its log is not there, for those who may read it.
    J + "GetJobLog": Row(lambda w: jpb.GetJobLogRequest(batch_id=w.batch_id, job_id=1),
                         unauthenticated(NF, member=NF, owner=NF, admin=NF)),
    # Following job 1 (it ended without a stored log) tells its attempt and state, for those who may read it.
    J + "StreamJobLog": Row(lambda w: jpb.StreamJobLogRequest(batch_id=w.batch_id, job_id=1), READ),
    # Job 1 ended on no real worker: no series is stored, and the answer says so to those who may read it.
    J + "GetAttemptUsage": Row(lambda w: jpb.GetAttemptUsageRequest(batch_id=w.batch_id, job_id=1), READ),
    J + "ExplainJob": Row(lambda w: jpb.ExplainJobRequest(batch_id=w.batch_id, job_id=1), READ),
    G + "GetJobGroup": Row(lambda w: gpb.GetJobGroupRequest(batch_id=w.batch_id, job_group_id=1), READ),
    G + "ListJobGroups": Row(lambda w: gpb.ListJobGroupsRequest(batch_id=w.batch_id), READ),
    G + "CancelJobGroup": Row(lambda w: gpb.CancelJobGroupRequest(batch_id=w.batch_id, job_group_id=1), CHANGE),
    # The deployment's machines: administrators only.
    F + "ListPools": Row(lambda w: fpb.ListPoolsRequest(), ADMIN_ONLY),
    F + "ListInstances": Row(lambda w: fpb.ListInstancesRequest(pool="standard"), ADMIN_ONLY),
    # Resumed by the next call (the rows run in method order): a pool left paused would hold up the others.
    F + "PausePool": Row(lambda w: fpb.PausePoolRequest(pool="standard"), ADMIN_ONLY),
    F + "ResumePool": Row(lambda w: fpb.ResumePoolRequest(pool="standard"), ADMIN_ONLY),
    # A project's locks: whoever may read the project; without one, each sees the projects they read.
    L + "ListLocks": Row(lambda w: lpb.ListLocksRequest(billing_project="proj"), READ),
    S + "CreateSecret": Row(lambda w: spb.CreateSecretRequest(billing_project="proj", name="new",
                                                            files={"password": b"hunter2"}), SECRETS),
    S + "ListSecrets": Row(lambda w: spb.ListSecretsRequest(billing_project="proj"), READ),
    S + "DeleteSecret": Row(lambda w: spb.DeleteSecretRequest(billing_project="proj", name="doomed"), SECRETS),
    I + "ImportImage": Row(lambda w: import_image("proj", f"{w.image_name}-new", w.image_archive), IMAGES),
    I + "ListImages": Row(lambda w: ipb.ListImagesRequest(billing_project="proj"), READ),
    I + "DeleteImage": Row(lambda w: ipb.DeleteImageRequest(billing_project="proj", name=w.image_name), IMAGES),
    C + "CreateBillingProject": Row(lambda w: cpb.CreateBillingProjectRequest(name="new-lab"), ADMIN_ONLY),
    C + "GetBillingProject": Row(lambda w: cpb.GetBillingProjectRequest(billing_project="proj"), READ),
    C + "ListBillingProjects": Row(lambda w: cpb.ListBillingProjectsRequest(),
                                   unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    C + "AddMember": Row(lambda w: cpb.AddMemberRequest(billing_project="proj", username="carol"), PROJECT_CHANGE),
    # A member may remove themselves: the request removes alice.
    C + "RemoveMember": Row(lambda w: cpb.RemoveMemberRequest(billing_project="leaving", username="alice"),
                            unauthenticated(NF, member=PD, owner=OK, admin=OK)),
    C + "SetLimit": Row(lambda w: cpb.SetLimitRequest(billing_project="proj", limit_micro_usd=1), PROJECT_CHANGE),
    C + "CloseBillingProject": Row(lambda w: cpb.CloseBillingProjectRequest(billing_project="closing"),
                                   PROJECT_CHANGE),
    C + "ReopenBillingProject": Row(lambda w: cpb.ReopenBillingProjectRequest(billing_project="closed"),
                                    PROJECT_CHANGE),
    # A closed project (an open one is FAILED_PRECONDITION: close it first).
    C + "DeleteBillingProject": Row(lambda w: cpb.DeleteBillingProjectRequest(billing_project="doomed"),
                                    PROJECT_CHANGE),
    C + "GetSpend": Row(lambda w: cpb.GetSpendRequest(billing_project="proj"), READ),
    # Quotas: administrators set them (this one is the default, so it leaves nothing set for the other rows);
    # anyone signed in lists those they may see.
    C + "SetQuota": Row(lambda w: cpb.SetQuotaRequest(kind=quota_pb2.QUOTA_KIND_USER, name="alice"), ADMIN_ONLY),
    C + "ListQuotas": Row(lambda w: cpb.ListQuotasRequest(), unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    C + "WatchSpend": Row(lambda w: cpb.WatchSpendRequest(billing_project="proj"), READ),
    # Login takes no token; one sent along must still be valid.
    A + "Login": Row(lambda w: apb.LoginRequest(username="dave", password=PASSWORD),
                     {**unauthenticated(OK, member=OK, owner=OK, admin=OK), "anonymous": OK}),
    A + "Logout": Row(lambda w: apb.LogoutRequest(), unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    A + "WhoAmI": Row(lambda w: apb.WhoAmIRequest(), unauthenticated(OK, member=OK, owner=OK, admin=OK)),
    A + "CreateUser": Row(lambda w: apb.CreateUserRequest(username="mallory"), ADMIN_ONLY),
    A + "GetUser": Row(lambda w: apb.GetUserRequest(username="alice"), ONESELF),
    A + "ListUsers": Row(lambda w: apb.ListUsersRequest(), ADMIN_ONLY),
    A + "DeactivateUser": Row(lambda w: apb.DeactivateUserRequest(username="eve"), ADMIN_ONLY),
    A + "CreateToken": Row(lambda w: apb.CreateTokenRequest(name="x", username="alice"), ONESELF),
    A + "ListTokens": Row(lambda w: apb.ListTokensRequest(username="alice"), ONESELF),
    # Nobody learns whether someone else's token id exists.
    A + "RevokeToken": Row(lambda w: apb.RevokeTokenRequest(token_id=w.alice_token_id),
                           unauthenticated(NF, member=NF, owner=OK, admin=OK)),
    # Internal: refused on the public listener to everybody, before any token is read.
    A + "VerifyToken": Row(lambda w: apb.VerifyTokenRequest(token="x"), dict.fromkeys(CALLERS, PD)),
}
LAST = (A + "Logout",)
"""Calls that end the caller's session go last."""


def test_every_public_rpc_is_in_the_table() -> None:
    methods = public_methods()
    assert len(methods) > 40 and {m.split("/")[1] for m in methods} == {
        "corral.batch.v1.BatchService", "corral.batch.v1.JobService", "corral.batch.v1.JobGroupService",
        "corral.batch.v1.LockService", "corral.batch.v1.SecretService", "corral.batch.v1.ImageService",
        "corral.batch.v1.FleetService", "corral.billing.v1.BillingService", "corral.auth.v1.AuthService"}
    assert set(TABLE) == set(methods), (f"no row for {sorted(set(methods) - set(TABLE))}; "
                                        f"rows for no method {sorted(set(TABLE) - set(methods))}")
    assert all(set(row.codes) == set(CALLERS) for row in TABLE.values())
    world = World(1, 1, 1, {"AddJobs": 1, "CreateJobGroups": 1, "CommitUpdate": 1}, "t", b"", "x")
    assert all(isinstance(TABLE[m].request(world), tuple) == methods[m].client_streaming
               for m in TABLE)  # a client stream's request is its messages


async def call(stubs: dict[str, object], method: str, descriptor: descriptor_pb2.MethodDescriptorProto,
               request: Request, metadata: tuple) -> tuple[grpc.StatusCode, str]:
    """The code the call ends with (OK: it succeeded, or a server stream opened and stayed open)."""
    service, _ = method.strip("/").split("/")
    try:
        await call_method(stubs[service], descriptor, request, metadata)
    except grpc.aio.AioRpcError as error:
        return error.code(), error.details() or ""
    return OK, ""


async def make_world(env: Env, auth_app: AuthApp, images: image_service_pb2_grpc.ImageServiceStub,
                     archive: bytes) -> World:
    """alice's batches and updates, the projects the billing rows change, an image to delete, the tokens of every
    column."""
    w, alice = env.world, env.as_("alice")
    await w.instance()
    grouped = job_spec_pb2.JobSpec()
    grouped.CopyFrom(spec())
    grouped.job_group.in_update_index = 0
    batch_id = await env.submit(grouped, spec(-1), groups=(job_group_pb2.JobGroupSpec(),))
    attempt = await w.run(batch_id, 1)
    await w.store.mark_jobs_complete(w.epoch, "i1", [{"batch_id": batch_id, "job_id": 1, "attempt_id": attempt,
                                                      "state": "Failed", "exit_code": 1}])
    await w.drain(batch_id)
    updates = {}
    for method, jobs, groups in (("AddJobs", 1, 0), ("CreateJobGroups", 0, 1), ("CommitUpdate", 0, 0)):
        created = await env.batches.CreateUpdate(bpb.CreateUpdateRequest(
            idempotency_token=uuid.uuid4().hex, batch_id=batch_id, n_jobs=jobs, n_job_groups=groups), metadata=alice)
        updates[method] = created.update.update_id
    cancel_batch_id, delete_batch_id = await env.submit(spec()), await env.submit(spec())
    assert env.secrets is not None
    await env.secrets.CreateSecret(spb.CreateSecretRequest(billing_project="proj", name="doomed",
                                                           files={"password": b"hunter2"}), metadata=alice)
    for project in ("leaving", "closing", "closed", "doomed"):
        await w.store.create_billing_project(project, ["alice", "bob"])
    await w.db.execute("UPDATE billing_projects SET state = 'closed' WHERE name IN ('closed', 'doomed')")
    people = AuthStore(auth_app.db)
    await people.create_user("dave", password=PASSWORD)
    await people.create_user("eve")
    token, secret = await people.create_token("alice", "api", name="expiring")
    await auth_app.db.execute("UPDATE tokens SET time_expires_ms = 1 WHERE token_id = %s", (token.token_id,))
    env.tokens["expired"] = secret
    token, env.tokens["revoked"] = await people.create_token("alice", "api", name="revoked")
    await people.revoke_token(token.token_id)
    spare, _ = await people.create_token("alice", "api", name="spare")
    image_name = f"doomed-{uuid.uuid4().hex[:8]}"
    await client_stream(images.ImportImage, import_image("proj", image_name, archive), alice)
    return World(batch_id, cancel_batch_id, delete_batch_id, updates, spare.token_id, archive, image_name)


@pytest.fixture
async def stubs(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority) -> AsyncIterator[dict[str, object]]:
    async with person_channel(certs.issue("someone"), auth_app.public_port) as auth_channel, \
            person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        yield {"corral.batch.v1.BatchService": env.batches, "corral.batch.v1.JobService": env.jobs,
               "corral.batch.v1.JobGroupService": env.groups,
               "corral.batch.v1.LockService": lock_service_pb2_grpc.LockServiceStub(channel),
               "corral.batch.v1.FleetService": fleet_service_pb2_grpc.FleetServiceStub(channel),
               "corral.batch.v1.SecretService": env.secrets,
               "corral.batch.v1.ImageService": image_service_pb2_grpc.ImageServiceStub(channel),
               "corral.billing.v1.BillingService": billing_service_pb2_grpc.BillingServiceStub(channel),
               "corral.auth.v1.AuthService": auth_service_pb2_grpc.AuthServiceStub(auth_channel)}


TOKENS = {"expired": "expired", "revoked": "revoked", "non_member": "carol", "member": "bob", "owner": "alice",
          "admin": "root"}


@pytest.mark.parametrize("caller", CALLERS)
async def test_every_public_rpc_answers_each_caller_exactly(env: Env, auth_app: AuthApp, stubs: dict[str, object],
                                                            archive: Path, caller: str) -> None:
    images = stubs["corral.batch.v1.ImageService"]
    assert isinstance(images, image_service_pb2_grpc.ImageServiceStub)
    world = await make_world(env, auth_app, images, archive.read_bytes())
    metadata = () if caller == "anonymous" else env.as_(TOKENS[caller])
    methods = public_methods()
    wrong = []
    for method in sorted(TABLE, key=lambda m: (m in LAST, m)):
        expected = TABLE[method].codes[caller]
        before = await snapshot(env.world.db) if expected != OK else None
        code, details = await call(stubs, method, methods[method], TABLE[method].request(world), metadata)
        if code != expected:
            wrong.append(f"{method}: {code.name} ({details}), expected {expected.name}")
        elif before is not None and await snapshot(env.world.db) != before:
            wrong.append(f"{method}: refused with {code.name}, but wrote")
    assert wrong == [], f"as {caller}:\n" + "\n".join(wrong)
