"""SecretService over real gRPC, and secrets in job submission (issue 13,
acceptance 6): a secret's contents go in once and come out of no RPC; the
database holds them only sealed for the driver's key, bound to their row;
a job may mount only an existing secret of its own batch's billing project
(another project's is PERMISSION_DENIED, however that project stands); a
refused submission writes nothing; the stored spec names the secret and
never holds its contents.

Delivery to a job, by a real driver and worker, is
tests/service/test_secret_delivery.py; the whole path through `corral up`,
with a search of its data directory, tests/e2e/test_secrets.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import uuid
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_spec_pb2
from corral.batch.v1 import secret_service_pb2 as pb
from corral.batch.v1 import secret_service_pb2_grpc
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.billing.v1 import billing_service_pb2_grpc
from services.auth.app import AuthApp
from services.common.sealing import KeyFileError, Opener, SealError, secret_row, unpack_files
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from tests.service.conftest import person_channel
from tests.service.test_jobs import Env, env, refused, spec, start_frontend, violations  # noqa: F401 - a fixture
from tests.service.test_security import snapshot

BAD = grpc.StatusCode.INVALID_ARGUMENT


def stub(env: Env) -> secret_service_pb2_grpc.SecretServiceStub:
    assert env.secrets is not None
    return env.secrets


async def create(env: Env, name: str = "db", who: str = "alice", project: str = "proj", replace: bool = False,
                 **files: bytes) -> pb.CreateSecretResponse:
    return await stub(env).CreateSecret(pb.CreateSecretRequest(
        billing_project=project, name=name, files=files or {"password": b"hunter2"}, replace=replace),
        metadata=env.as_(who))


async def listed(env: Env, who: str = "alice", project: str = "proj", **request) -> pb.ListSecretsResponse:
    return await stub(env).ListSecrets(pb.ListSecretsRequest(billing_project=project, **request),
                                       metadata=env.as_(who))


def mounting(*names: str, **fields) -> job_spec_pb2.JobSpec:
    return spec(secrets=[job_spec_pb2.SecretMount(name=n, mount_path=f"/secrets/{i}") for i, n in enumerate(names)],
                **fields)


async def submitted(env: Env, *jobs: job_spec_pb2.JobSpec, who: str = "alice") -> bpb.SubmitBatchResponse:
    return await env.batches.SubmitBatch(bpb.SubmitBatchRequest(
        billing_project="proj", jobs=list(jobs), idempotency_token=uuid.uuid4().hex), metadata=env.as_(who))


def described(error: grpc.aio.AioRpcError) -> dict[str, str]:
    """Field -> description of the BadRequest the error carries."""
    status = rpc_status.from_call(error)
    assert status is not None
    bad = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad)
    return {v.field: v.description for v in bad.field_violations}


def everything_in(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file())


async def test_a_secret_is_listed_by_name_and_stored_only_sealed_for_its_row(env: Env) -> None:
    value = secrets.token_bytes(48)
    created = await create(env, "db", password=value, user=b"corral")
    assert (created.secret.billing_project, created.secret.name, list(created.secret.keys),
            created.secret.created_by) == ("proj", "db", ["password", "user"], "alice")
    assert created.secret.created_at.seconds > 0
    assert value not in created.SerializeToString()
    answer = await listed(env, "bob")
    assert [s.name for s in answer.secrets] == ["db"] and value not in answer.SerializeToString()
    assert list(answer.secrets[0].keys) == ["password", "user"]

    row = await env.world.db.fetchone("SELECT * FROM secrets WHERE billing_project = 'proj' AND name = 'db'")
    assert row is not None
    for shown in (value, base64.b64encode(value), value.hex().encode()):
        assert shown not in b"".join(v if isinstance(v, bytes) else str(v).encode() for v in row.values())
    assert env.secrets_key is not None
    opener = Opener.from_file(env.secrets_key)
    assert row["key_id"] == opener.key_id
    assert unpack_files(opener.open(row["sealed"], secret_row("proj", "db"))) == {"password": value,
                                                                                 "user": b"corral"}
    with pytest.raises(SealError):  # moved to another project's row, it opens for nobody
        opener.open(row["sealed"], secret_row("elsewhere", "db"))


async def test_a_taken_name_is_already_exists_unless_replaced(env: Env) -> None:
    await create(env, "db", password=b"one")
    error = await refused(create(env, "db", password=b"two"))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS and "replace" in (error.details() or "")
    replaced = await create(env, "db", who="bob", replace=True, token=b"three")
    assert (list(replaced.secret.keys), replaced.secret.created_by) == (["token"], "bob")
    row = await env.world.db.fetchone("SELECT sealed FROM secrets WHERE billing_project = 'proj' AND name = 'db'")
    assert row is not None and env.secrets_key is not None
    assert unpack_files(Opener.from_file(env.secrets_key).open(row["sealed"], secret_row("proj", "db"))) == {
        "token": b"three"}
    assert [s.name for s in (await listed(env)).secrets] == ["db"]


async def test_names_files_and_sizes_are_checked_before_anything_is_stored(env: Env) -> None:
    before = await snapshot(env.world.db)
    cases = [
        (pb.CreateSecretRequest(billing_project="proj", name="DB", files={"k": b"v"}), ["name"]),
        (pb.CreateSecretRequest(billing_project="proj", name="a/b", files={"k": b"v"}), ["name"]),
        (pb.CreateSecretRequest(billing_project="proj", name="db"), ["files"]),
        (pb.CreateSecretRequest(billing_project="proj", name="db", files={"..": b"v"}), ["files"]),
        (pb.CreateSecretRequest(billing_project="proj", name="db", files={"a/b": b"v", "ok": b""}), ["files"]),
        (pb.CreateSecretRequest(billing_project="proj", name="db", files={"k": b"x" * 65_537}), ["files"]),
        (pb.CreateSecretRequest(billing_project="proj", name="db",
                                files={f"k{i}": b"x" * 2000 for i in range(40)}), ["files"]),  # 80,000 bytes
        (pb.CreateSecretRequest(billing_project="proj", name="db", files={f"k{i}": b"" for i in range(65)}),
         ["files"]),
        (pb.CreateSecretRequest(name="db", files={"k": b"v"}), ["billing_project"]),
    ]
    for request, fields in cases:
        error = await refused(stub(env).CreateSecret(request, metadata=env.as_("alice")))
        assert error.code() == BAD and violations(error) == fields, request
        assert "x" * 100 not in str(described(error))  # a violation names a file, never its contents
    assert await snapshot(env.world.db) == before
    await create(env, "db", **{f"k{i}": b"x" * 1024 for i in range(64)})  # 64 files, 65,536 bytes: the limits


async def test_members_and_administrators_change_secrets_outsiders_learn_nothing(env: Env) -> None:
    await create(env, "db", who="bob")
    await create(env, "root-made", who="root")
    assert [s.name for s in (await listed(env, "root")).secrets] == ["db", "root-made"]
    for call in (lambda p: create(env, "x", who="carol", project=p), lambda p: listed(env, "carol", p),
                 lambda p: stub(env).DeleteSecret(pb.DeleteSecretRequest(billing_project=p, name="db"),
                                                  metadata=env.as_("carol"))):
        answers = []
        for project in ("proj", "no-such-project"):
            error = await refused(call(project))
            answers.append((error.code(), error.details()))
        assert answers == [(grpc.StatusCode.NOT_FOUND, f"no billing project {p}") for p in ("proj", "no-such-project")]
    await stub(env).DeleteSecret(pb.DeleteSecretRequest(billing_project="proj", name="db"), metadata=env.as_("root"))
    error = await refused(stub(env).DeleteSecret(pb.DeleteSecretRequest(billing_project="proj", name="db"),
                                                 metadata=env.as_("alice")))
    assert error.code() == grpc.StatusCode.NOT_FOUND and "no secret db" in (error.details() or "")
    assert [s.name for s in (await listed(env)).secrets] == ["root-made"]


async def test_pages_list_every_secret_once(env: Env) -> None:
    for i in range(5):
        await create(env, f"s{i}")
    seen, token = [], ""
    while True:
        page = await listed(env, page_size=2, page_token=token)
        seen += [s.name for s in page.secrets]
        if not (token := page.next_page_token):
            break
    assert seen == [f"s{i}" for i in range(5)]
    error = await refused(listed(env, page_token="%%%"))
    assert error.code() == BAD and violations(error) == ["page_token"]


async def test_a_deployment_without_the_public_key_keeps_no_secrets(
        env: Env, auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
        tmp_path: Path) -> None:
    frontend = await start_frontend(auth_app, db_config, certs, tmp_path / "blobs2")
    try:
        async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
            keyless = secret_service_pb2_grpc.SecretServiceStub(channel)
            error = await refused(keyless.CreateSecret(pb.CreateSecretRequest(
                billing_project="proj", name="db", files={"k": b"v"}), metadata=env.as_("alice")))
            assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--secrets-public-key-file" in (error.details() or "")
    finally:
        await frontend.stop()


async def test_the_frontend_refuses_to_start_with_the_private_key(
        auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path,
        env: Env) -> None:
    assert env.secrets_key is not None
    with pytest.raises(KeyFileError, match="public key only"):
        await start_frontend(auth_app, db_config, certs, tmp_path / "blobs2", secrets_public_key_file=env.secrets_key)


# ------------------------------------------------------------------ submission


async def test_a_job_mounts_an_existing_secret_and_its_spec_holds_only_the_name(env: Env) -> None:
    value = secrets.token_urlsafe(32).encode()
    await create(env, "db", password=value)
    batch = await submitted(env, mounting("db"), mounting("proj/db"))
    got = await env.jobs.GetJob(jpb.GetJobRequest(batch_id=batch.batch.batch_id, job_id=1), metadata=env.as_("alice"))
    assert [(s.name, s.mount_path) for s in got.job.spec.secrets] == [("db", "/secrets/0")]
    assert value not in got.SerializeToString()
    assert value not in everything_in(env.blobs) and b"hunter2" not in everything_in(env.blobs)


async def test_a_missing_secret_or_a_bad_mount_is_refused_and_nothing_is_written(env: Env) -> None:
    await create(env, "db")
    before = await snapshot(env.world.db)
    error = await refused(submitted(env, mounting("db"), mounting("nope", "db", "nope")))
    assert error.code() == BAD
    assert sorted(violations(error)) == ["jobs[1].secrets[0].name", "jobs[1].secrets[2].name"]
    assert set(described(error).values()) == {"billing project proj has no secret 'nope'"}
    bad_mounts = spec(secrets=[
        job_spec_pb2.SecretMount(name="db", mount_path="relative"),
        job_spec_pb2.SecretMount(name="db", mount_path="/"),
        job_spec_pb2.SecretMount(name="db", mount_path="/a/../b"),
        job_spec_pb2.SecretMount(name="db", mount_path="/in"),  # the input's directory
        job_spec_pb2.SecretMount(name="db", mount_path="/out/inside"),  # below the output's path
        job_spec_pb2.SecretMount(name="db", mount_path="/s"),
        job_spec_pb2.SecretMount(name="db", mount_path="/s/t"),  # inside another secret
        job_spec_pb2.SecretMount(name="Not A Name", mount_path="/u"),
    ], input_files=[job_spec_pb2.InputFile(from_url="file:///nowhere/x", to_path="/in/x")],
        output_files=[job_spec_pb2.OutputFile(from_path="/out", to_url="file:///nowhere/y")])
    error = await refused(submitted(env, bad_mounts))
    assert error.code() == BAD
    assert {f"jobs[0].secrets[{i}].mount_path" for i in (0, 1, 2, 3, 4, 6)} | {"jobs[0].secrets[7].name"} <= set(
        violations(error))
    assert "jobs[0].secrets[5].mount_path" not in violations(error)
    assert await snapshot(env.world.db) == before
    assert not env.blobs.exists() or not any(p.is_file() for p in env.blobs.rglob("*"))


async def test_another_projects_secret_is_permission_denied_whatever_that_project_holds(env: Env) -> None:
    await create(env, "db", who="carol", project="elsewhere")
    before = await snapshot(env.world.db)
    answers = set()
    for name in ("elsewhere/db", "elsewhere/missing", "no-such-project/db"):
        error = await refused(submitted(env, spec(), mounting(name)))
        details = (error.details() or "").replace(repr(name), "<name>")
        answers.add((error.code(), details))
    assert answers == {(grpc.StatusCode.PERMISSION_DENIED,
                        "jobs[1].secrets[0]: secret <name> is not of billing project 'proj': a job mounts secrets "
                        "of its own batch's billing project only")}
    # AddJobs to an open batch, likewise.
    batch = await env.batches.CreateBatch(bpb.CreateBatchRequest(billing_project="proj", n_jobs=1,
                                                                 idempotency_token=uuid.uuid4().hex),
                                          metadata=env.as_("alice"))
    before = await snapshot(env.world.db)
    error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(
        batch_id=batch.batch.batch_id, update_id=batch.update.update_id, jobs=[mounting("elsewhere/db")]),
        metadata=env.as_("alice")))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    error = await refused(env.batches.AddJobs(bpb.AddJobsRequest(
        batch_id=batch.batch.batch_id, update_id=batch.update.update_id, jobs=[mounting("db")]),
        metadata=env.as_("alice")))
    assert error.code() == BAD and violations(error) == ["jobs[0].secrets[0].name"]
    assert await snapshot(env.world.db) == before


async def test_a_jobs_image_pull_secret_is_checked_as_a_mounted_secret_is(env: Env) -> None:
    """JobSpec.image_pull_secret: the project's own existing secret is accepted and stored by name alone;
    a missing one and a name that is not a secret's are INVALID_ARGUMENT on the field; another project's is
    PERMISSION_DENIED whatever that project holds; nothing is written for a refusal."""
    login = json.dumps({"username": "alice", "password": secrets.token_urlsafe(16)}).encode()
    await create(env, "registry", username=b"alice", password=login)
    await create(env, "registry", who="carol", project="elsewhere")
    batch = await submitted(env, spec(image_pull_secret="registry"), spec(image_pull_secret="proj/registry"))
    got = await env.jobs.GetJob(jpb.GetJobRequest(batch_id=batch.batch.batch_id, job_id=2), metadata=env.as_("alice"))
    assert got.job.spec.image_pull_secret == "proj/registry"
    assert login not in got.SerializeToString() and login not in everything_in(env.blobs)

    before = await snapshot(env.world.db)
    error = await refused(submitted(env, spec(image_pull_secret="registry"), spec(image_pull_secret="nope")))
    assert (error.code(), described(error)) == (BAD, {"jobs[1].image_pull_secret":
                                                      "billing project proj has no secret 'nope'"})
    error = await refused(submitted(env, spec(image_pull_secret="Not A Name"), spec(image_pull_secret="a/b/c")))
    assert (error.code(), violations(error)) == (BAD, ["jobs[0].image_pull_secret", "jobs[1].image_pull_secret"])
    error = await refused(submitted(env, spec(image_pull_secret="x" * 130)))  # the field's limit, before the rest
    assert (error.code(), described(error)) == (BAD, {"jobs[0].image_pull_secret": "at most 129 characters"})
    for name in ("elsewhere/registry", "elsewhere/missing", "no-such-project/registry"):
        error = await refused(submitted(env, spec(), spec(image_pull_secret=name)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert error.details() == (f"jobs[1].image_pull_secret: secret {name!r} is not of billing project 'proj': "
                                   "a job pulls its image with secrets of its own batch's billing project only")
    error = await refused(submitted(env, spec(image_pull_secret="registry"), who="carol"))
    assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "no billing project proj")
    assert await snapshot(env.world.db) == before


async def test_an_outsider_learns_nothing_of_a_projects_secrets_by_submitting(env: Env) -> None:
    await create(env, "db")
    answers = set()
    for job in (spec(), mounting("db"), mounting("missing")):
        error = await refused(submitted(env, job, who="carol"))
        answers.add((error.code(), error.details()))
    assert answers == {(grpc.StatusCode.NOT_FOUND, "no billing project proj")}


async def test_deleting_a_project_deletes_its_secrets(env: Env, certs: DevCertificateAuthority) -> None:
    await env.world.store.create_billing_project("doomed", ["alice"])
    await create(env, "db", project="doomed")
    await env.world.db.execute("UPDATE billing_projects SET state = 'closed' WHERE name = 'doomed'")
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        await billing_service_pb2_grpc.BillingServiceStub(channel).DeleteBillingProject(
            cpb.DeleteBillingProjectRequest(billing_project="doomed"), metadata=env.as_("root"))
    assert await env.world.db.fetchall("SELECT name FROM secrets WHERE billing_project = 'doomed'") == []
    error = await refused(create(env, "db", project="doomed"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION


# ------------------------------------------------------------------ the clients and the CLI


async def test_corral_secrets_create_list_delete_never_print_a_value(env: Env, auth_app: AuthApp,
                                                                    certs: DevCertificateAuthority,
                                                                    tmp_path: Path) -> None:
    from tests.service.test_cli_jobs import corral, logged_in, out

    value = secrets.token_urlsafe(32)
    password, user = tmp_path / "password.txt", tmp_path / "u"
    password.write_text(value)
    user.write_text("corral")
    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    created = await corral(alice, "secrets", "create", "db", "--project", "proj", "--from-file", str(password),
                           "--from-file", f"user={user}")
    assert out(created).startswith("db  files=password.txt,user  created=") and out(created).endswith(" by=alice\n")
    taken = await corral(alice, "secrets", "create", "db", "--project", "proj", "--from-file", str(password))
    assert taken.returncode == 4 and b"replace" in taken.stderr  # EXIT_REFUSED: ALREADY_EXISTS
    replaced = await corral(alice, "secrets", "create", "db", "--project", "proj", "--replace", "--json",
                            "--from-file", f"pw={password}")
    assert json.loads(out(replaced))[0]["keys"] == ["pw"]
    listed = await corral(alice, "secrets", "list", "--project", "proj")
    assert out(listed).startswith("db  files=pw  created=")
    carol = logged_in(env, auth_app, certs, tmp_path, "carol")
    assert (await corral(carol, "secrets", "list", "--project", "proj")).returncode == 5  # EXIT_NOT_FOUND
    twice = await corral(alice, "secrets", "create", "x", "--project", "proj", "--from-file", f"a={password}",
                         "--from-file", f"a={user}")
    assert twice.returncode == 2 and b"two files named 'a'" in twice.stderr
    assert out(await corral(alice, "secrets", "delete", "db", "--project", "proj")) == (
        "deleted secret db of billing project proj\n")
    assert out(await corral(alice, "secrets", "list", "--project", "proj")) == "billing project proj has no secrets\n"
    for result in (created, replaced, listed):
        assert value.encode() not in result.stdout + result.stderr


async def test_both_clients_create_list_and_delete(env: Env, certs: DevCertificateAuthority) -> None:
    from corral import aio
    from corral.client import Client
    from corral.errors import CorralError

    address = f"localhost:{env.frontend.public_port}"

    def blocking() -> None:  # in a thread: the frontend serves on this test's event loop
        with Client(address, env.tokens["alice"], certs.ca_cert_path) as client:
            made = client.create_secret("proj", "db", {"password": b"hunter2"})
            assert (made.name, list(made.keys)) == ("db", ["password"])
            assert [s.name for s in client.secrets("proj", page_size=1)] == ["db"]
            with pytest.raises(CorralError) as error:
                client.create_secret("proj", "db", {"password": b"x"})
            assert error.value.code == grpc.StatusCode.ALREADY_EXISTS
            client.create_secret("proj", "db", {"password": b"x"}, replace=True)
            client.delete_secret("proj", "db")
            assert list(client.secrets("proj")) == []

    await asyncio.to_thread(blocking)
    async with aio.Client(address, env.tokens["bob"], certs.ca_cert_path) as client:
        await client.create_secret("proj", "a", {"k": b"1"})
        await client.create_secret("proj", "b", {"k": b"2"})
        assert [s.name async for s in client.secrets("proj", page_size=1)] == ["a", "b"]
        await client.delete_secret("proj", "a")
        assert [s.name async for s in client.secrets("proj")] == ["b"]
