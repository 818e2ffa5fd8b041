"""Submissions over real gRPC: job file URLs outside the billing project's
storage roots and callbacks into the deployment are INVALID_ARGUMENT, naming
the field and why, and nothing is written."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import batch_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.app import FrontendApp, FrontendConfig
from services.frontend.app import start as start_frontend
from tests.conftest import service_url
from tests.service.conftest import bearer, limits_for_tests, person_channel

Stub = batch_service_pb2_grpc.BatchServiceStub


@pytest.fixture
async def alice(auth_app: AuthApp, db: Database) -> tuple[tuple[str, str], ...]:
    """alice's credentials; she is a member of billing project 'proj'."""
    store = AuthStore(auth_app.db)
    await store.create_user("alice")
    await JobStore(db).create_billing_project("proj", ["alice"])
    return bearer((await store.create_token("alice", "api"))[1])


async def frontend_with(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                        tmp_path: Path, **config: Any) -> FrontendApp:
    return await start_frontend(FrontendConfig(service_url(db_config, "frontend"), certs.directory,
                                               f"localhost:{auth_app.internal_port}", f"file://{tmp_path / 'blobs'}",
                                               **{"limits": limits_for_tests(), **config}))


@pytest.fixture
async def stub(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
               tmp_path: Path) -> AsyncIterator[Stub]:
    """BatchService of a frontend whose projects keep files under tmp_path/storage/PROJECT/."""
    app = await frontend_with(auth_app, db_config, certs, tmp_path,
                              storage_roots=(f"file://{tmp_path}/storage/{{project}}/",))
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            yield Stub(channel)
    finally:
        await app.stop()


def job(inputs: tuple[str, ...] = (), outputs: tuple[str, ...] = ()) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(
        image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
        input_files=[job_spec_pb2.InputFile(from_url=u, to_path=f"/in/{i}") for i, u in enumerate(inputs)],
        output_files=[job_spec_pb2.OutputFile(from_path=f"/out/{i}", to_url=u) for i, u in enumerate(outputs)])


def violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error)
    assert status is not None
    details = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(details)
    return {v.field: v.description for v in details.field_violations}


async def rows(db: Database, table: str) -> int:
    return int((await db.fetchone(f"SELECT COUNT(*) AS n FROM {table}"))["n"])


async def test_file_urls_outside_the_projects_roots_are_refused(db: Database, stub: Stub, alice: Any, auth_app: AuthApp,
                                                                certs: DevCertificateAuthority,
                                                                tmp_path: Path) -> None:
    root = f"file://{tmp_path}/storage/proj"
    ca_key = f"file://{certs.directory}/ca.key"
    request = pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj", jobs=[
        job(inputs=(f"{root}/ref.fa",), outputs=(f"{root}/out/",)),
        job(inputs=(ca_key, f"{root}/../other/x", f"{root}/%2e%2e/x", f"file://localhost{tmp_path}/storage/proj/x"),
            outputs=("file:///etc/cron.d/evil", f"file://{tmp_path}/storage/proj2/x")),
    ])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(request, metadata=alice)
    found = violations(error.value)
    assert found == {
        "jobs[1].input_files[0].from_url": f"not under a storage root of the billing project ({root}/)",
        "jobs[1].input_files[1].from_url": "'..' path segments are not accepted (storage backends disagree on them)",
        "jobs[1].input_files[2].from_url": "percent-encoding is not accepted in storage URLs",
        "jobs[1].input_files[3].from_url":
            "a file:// URL names no host ('localhost') and an absolute path: file:///absolute/path",
        "jobs[1].output_files[0].to_url": f"not under a storage root of the billing project ({root}/)",
        "jobs[1].output_files[1].to_url": f"not under a storage root of the billing project ({root}/)",
    }
    assert await rows(db, "jobs") == 0


async def test_files_under_the_projects_root_are_accepted(stub: Stub, alice: Any, tmp_path: Path) -> None:
    root = f"file://{tmp_path}/storage/proj"
    response = await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                            billing_project="proj", jobs=[
        job(inputs=(f"{root}/ref.fa", f"{root}/dir/"), outputs=(f"{root}/result.txt",))]), metadata=alice)
    assert response.batch.counts.n_jobs == 1


async def test_add_jobs_names_the_job_and_file_of_each_refusal(db: Database, stub: Stub, alice: Any, auth_app: AuthApp,
                                                               tmp_path: Path) -> None:
    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                           billing_project="proj", n_jobs=4), metadata=alice)
    bunch = [job(), job(), job(), job(inputs=(f"file://{tmp_path}/storage/proj/a", "file:///etc/shadow"))]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.AddJobs(pb.AddJobsRequest(batch_id=created.batch.batch_id, update_id=created.update.update_id,
                                             jobs=bunch), metadata=alice)
    assert list(violations(error.value)) == ["jobs[3].input_files[1].from_url"]
    assert await rows(db, "jobs") == 0


async def test_without_storage_roots_no_job_may_name_a_file(db: Database, frontend: FrontendApp, alice: Any,
                                                            certs: DevCertificateAuthority, auth_app: AuthApp,
                                                            tmp_path: Path) -> None:
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await Stub(channel).SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                  billing_project="proj", jobs=[
                job(outputs=(f"file://{tmp_path}/anywhere",))]), metadata=alice)
    assert violations(error.value) == {"jobs[0].output_files[0].to_url": (
        "no storage roots are configured for billing project 'proj': this deployment accepts no input or output "
        "files (operator setting --storage-root)")}
    assert await rows(db, "jobs") == 0


@pytest.fixture
def hooks_resolve_to_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    """hooks.example resolves to 127.0.0.1 for the frontend's resolver (which calls socket.getaddrinfo)."""
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        return real("127.0.0.1" if host == "hooks.example" else host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:8080/done", "127.0.0.1 is a loopback address"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 is the cloud metadata service's link-local address"),
    ("http://10.0.0.5/done", "10.0.0.5 is a private address"),
    ("http://[::ffff:10.0.0.5]/done", "::ffff:a00:5 is a private address (10.0.0.5, IPv4-mapped)"),
    ("http://0x7f.1/done", "numeric host '0x7f.1' is not written as four decimal numbers (a.b.c.d)"),
    ("http://localhost:8080/done", "host 'localhost' is this machine (localhost)"),
    ("http://hooks.example:8080/done", "hooks.example resolves to 127.0.0.1, a loopback address"),
    ("ftp://hooks.example/done", "must be an http:// or https:// URL"),
])
async def test_callbacks_into_the_deployment_are_refused(db: Database, stub: Stub, alice: Any, auth_app: AuthApp,
                                                         hooks_resolve_to_loopback: None, url: str, why: str) -> None:
    for request in (pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj", callback_url=url),
                    pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                          billing_project="proj", callback_url=url, jobs=[job()])):
        call = stub.CreateBatch if isinstance(request, pb.CreateBatchRequest) else stub.SubmitBatch
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call(request, metadata=alice)
        assert violations(error.value) == {"callback_url": why}
    assert await rows(db, "batches") == 0


async def test_an_operator_may_allow_callbacks_into_given_networks(
        auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path, alice: Any,
        hooks_resolve_to_loopback: None) -> None:
    app = await frontend_with(auth_app, db_config, certs, tmp_path, callback_allow_networks=("127.0.0.0/8",))
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            stub = Stub(channel)
            for url in ("http://127.0.0.1:8080/done", "http://hooks.example:8080/done"):
                created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                       billing_project="proj", callback_url=url),
                                                 metadata=alice)
                assert created.batch.callback_url == url
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                             callback_url="http://10.0.0.5/"), metadata=alice)
            assert violations(error.value) == {"callback_url": "10.0.0.5 is a private address"}
    finally:
        await app.stop()


async def test_a_public_callback_is_accepted(stub: Stub, alice: Any) -> None:
    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                           callback_url="https://93.184.215.14/hooks/corral"),
                                     metadata=alice)
    assert created.batch.callback_url == "https://93.184.215.14/hooks/corral"


async def test_a_storage_root_overlapping_the_spec_root_stops_the_frontend_starting(
        auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="overlaps the spec root"):
        await frontend_with(auth_app, db_config, certs, tmp_path, storage_roots=(f"file://{tmp_path}/{{project}}/",))
