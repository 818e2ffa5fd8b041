"""Issue 33 part 6 over real gRPC: an image whose registry is a loopback, link-local, private or metadata
address (or a name resolving to one, or localhost:PORT) is INVALID_ARGUMENT at submission, naming
`jobs[i].image` and saying why, unless the deployment names that registry (its own registry, which
`localhost/...` also names, `--allowed-registries`); nothing is written. Issue 35: a reference the grammar
refuses (`BusyBox`, `busybox:`, a bad digest) is refused there too, one line each. docs/security.md, "What must not happen": "an image
reference makes a worker probe the host"; Limits: "Registries named in one request"."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.batch.v1 import batch_service_pb2 as pb
from corral.batch.v1 import job_spec_pb2
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from tests.service.conftest import person_channel
from tests.service.test_submission_urls import Stub, alice, frontend_with, rows, violations  # noqa: F401

HINT = "a job's image comes from a public registry, or from one this deployment allows (ask its operator)"
OWN = "http://127.0.0.1:5999"


@pytest.fixture
def names_resolve(monkeypatch: pytest.MonkeyPatch) -> None:
    """For the frontend's resolver (which calls socket.getaddrinfo): inside.example resolves to a private
    address, mixed.example to a public and a link-local one, public.example to a public one, and
    nowhere.example to nothing."""
    table = {"inside.example": ["10.0.0.7"], "mixed.example": ["93.184.215.14", "169.254.169.254"],
             "public.example": ["93.184.215.14"]}
    real = socket.getaddrinfo

    def getaddrinfo(host: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "nowhere.example":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [info for address in table.get(host, [host]) for info in real(address, port, *args, **kwargs)]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
async def stub(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
               tmp_path: Path, names_resolve: None) -> AsyncIterator[Stub]:
    """BatchService of a frontend whose own registry is OWN and that allows one private registry."""
    app = await frontend_with(auth_app, db_config, certs, tmp_path, own_registry=OWN,
                              allowed_registries=("10.0.0.5:5000",))
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            yield Stub(channel)
    finally:
        await app.stop()


def job(image: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image=image, argv=job_spec_pb2.Argv(args=["echo", "hello"]))


REFUSED = {
    # The issue's probes: the host's ssh port, one of corral's own TLS ports, the metadata server.
    "127.0.0.1:22/x": "registry 127.0.0.1:22 is a loopback address",
    "127.0.0.1:18443/x": "registry 127.0.0.1:18443 is a loopback address",
    "169.254.169.254/latest/meta-data": "registry 169.254.169.254 is the cloud metadata service's link-local address",
    "10.1.2.3:5000/x": "registry 10.1.2.3:5000 is a private address",
    "10.0.0.5:5001/x": "registry 10.0.0.5:5001 is a private address",  # the allowed host, another port
    "100.64.0.1/x": "registry 100.64.0.1 is a shared (carrier-grade NAT) address",
    "[::1]:5000/x": "registry [::1]:5000 is a loopback address",
    "[fd00::1]/x": "registry [fd00::1] is a private address",
    "0.0.0.0:5000/x": "registry 0.0.0.0:5000 is an unspecified address",
    "localhost:5000/x": "registry localhost:5000 is this machine (localhost)",
    "metadata.google.internal/computemetadata/v1": "registry metadata.google.internal is a cloud metadata server",
    "2130706433:22/x": "registry 2130706433:22 is a numeric host not written as four decimal numbers (a.b.c.d)",
    "inside.example/x": "registry inside.example resolves to a private address",
    "mixed.example:5000/x": "registry mixed.example:5000 resolves to the cloud metadata service's link-local address",
}


async def test_images_from_internal_registries_are_refused_at_submission(db: Database, stub: Stub,
                                                                         alice: Any) -> None:  # noqa: F811
    images = list(REFUSED)
    for call in ("SubmitBatch", "AddJobs"):
        if call == "SubmitBatch":
            request: Any = pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                 jobs=[job("busybox"), *map(job, images)])
            method = stub.SubmitBatch
        else:
            created = await stub.CreateBatch(pb.CreateBatchRequest(
                idempotency_token=uuid.uuid4().hex, billing_project="proj", n_jobs=len(images) + 1), metadata=alice)
            request = pb.AddJobsRequest(batch_id=created.batch.batch_id, update_id=created.update.update_id,
                                        jobs=[job("busybox"), *map(job, images)])
            method = stub.AddJobs
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await method(request, metadata=alice)
        found = violations(error.value)
        assert found == {f"jobs[{i + 1}].image": f"{REFUSED[image]}: {HINT}" for i, image in enumerate(images)}, call
        assert not any(address in why for why in found.values() for address in ("10.0.0.7", "169.254.169.254:"))
    assert await rows(db, "jobs") == 0
    assert await rows(db, "batches") == 1  # AddJobs' own, empty: SubmitBatch wrote nothing


async def test_the_own_allowed_public_and_unresolvable_registries_are_accepted(stub: Stub,
                                                                             alice: Any) -> None:  # noqa: F811
    images = ["busybox", "team/tool:1", "localhost/proj/tool:1", "127.0.0.1:5999/busybox", "10.0.0.5:5000/lab/tool:2",
              "93.184.215.14/x",
              "public.example:443/x", "docker.io/library/ubuntu:24.04",
              # Resolved by nobody now: the worker checks it again right before pulling.
              "nowhere.example/x"]
    response = await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                            billing_project="proj", jobs=list(map(job, images))),
                                      metadata=alice)
    assert response.batch.counts.n_jobs == len(images)


async def test_a_reference_that_is_not_one_is_refused_at_submission(stub: Stub, alice: Any) -> None:  # noqa: F811
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                     jobs=[job("BusyBox"), job("https://ghcr.io/x")]), metadata=alice)
    assert violations(error.value) == {
        "jobs[0].image": "image 'BusyBox': 'BusyBox' is not a valid repository component (repositories are lowercase)",
        "jobs[1].image": "image 'https://ghcr.io/x': name the image, not a URL (e.g. registry.example.com/repo:tag)"}
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                     jobs=[job("busybox:"), job("busybox@sha256:abc"), job("ok")]),
                               metadata=alice)
    found = violations(error.value)
    assert found == {
        "jobs[0].image": "image 'busybox:': tag '' is not letters, digits, '_', '.' and '-' (at most 128, not starting "
                         "with '.' or '-')",
        "jobs[1].image": "image 'busybox@sha256:abc': digest 'sha256:abc' is not sha256: and 64 lowercase hex digits"}
    assert not any("\n" in why for why in found.values())


async def test_one_request_names_at_most_max_registries_per_request(stub: Stub, alice: Any,  # noqa: F811
                                                                    db: Database) -> None:
    images = [f"r{i}.public.example/x" for i in range(17)]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                     jobs=list(map(job, images))), metadata=alice)
    assert violations(error.value) == {
        "jobs": "the jobs name 17 registries: at most 16 in one request (max_registries_per_request)"}
    # Sixteen, and bare names beside them, pass.
    response = await stub.SubmitBatch(pb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex, billing_project="proj",
        jobs=[*map(job, images[:16]), job("busybox"), job("other")]), metadata=alice)
    assert response.batch.counts.n_jobs == 18


async def test_a_projects_image_in_the_deployments_registry_runs_only_for_its_members(
        db: Database, stub: Stub, alice: Any) -> None:  # noqa: F811
    """Issue 35: a billing project's image in corral's own registry (`localhost/PROJECT/...` or its address)
    is PERMISSION_DENIED for anyone not a member of PROJECT, naming the job's field, whether or not the project
    exists; alice's own project's images are hers. (A bare `other/tool` is Docker Hub's: nobody's here.)"""
    for image, project in (("127.0.0.1:5999/other/tool:1", "other"), ("localhost/other/tool", "other"),
                           ("localhost/nosuchproject/tool", "nosuchproject")):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                         jobs=[job("127.0.0.1:5999/proj/tool"), job(image)]),
                                   metadata=alice)
        assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED, image
        assert error.value.details().startswith("jobs[1].image: image ") and \
            f"is a private image of billing project {project}: only its members run it" in error.value.details()
    assert await rows(db, "jobs") == 0 and await rows(db, "batches") == 0
    # The mirror of Docker Hub in the same registry is everybody's.
    response = await stub.SubmitBatch(pb.SubmitBatchRequest(
        idempotency_token=uuid.uuid4().hex, billing_project="proj",
        jobs=[job("127.0.0.1:5999/docker.io/library/busybox"), job("127.0.0.1:5999/proj/tool")]), metadata=alice)
    assert response.batch.counts.n_jobs == 2
