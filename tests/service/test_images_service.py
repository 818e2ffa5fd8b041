"""ImageService over real gRPC, a real frontend and a real `docker-registry` behind a push login: what an
import refuses, with which status, leaving nothing behind (no tag, no file in the import directory).

- the first message must be the header, the name a reference component (INVALID_ARGUMENT);
- an archive past max_image_import_bytes is RESOURCE_EXHAUSTED and read no further;
- a caller who is no member of the project gets NOT_FOUND, as for a project that does not exist;
- a good archive is imported, and the registry's digest is the one returned;
- a frontend without a push login imports nothing (FAILED_PRECONDITION); one whose registry is down says
  UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import grpc
import pytest

from corral.batch.v1 import image_service_pb2 as ipb
from corral.batch.v1 import image_service_pb2_grpc
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.files import write_atomically
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.registry.seed import cached_busybox, registry_digest
from services.registry.server import RegistryServer
from services.common.registry_logins import Credentials
from services.up.ports import free_port
from tests.service.conftest import bearer, limits_for_tests, person_channel
from tests.service.test_submission_urls import alice, frontend_with, violations  # noqa: F401 - alice is a fixture

LOGIN = Credentials("corral-push", "push-password-for-the-test")
LIMIT_BYTES = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("archive")
    layout, _ = cached_busybox(work / "build")
    target = work / "busybox.tar"
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}:latest", f"docker-archive:{target}"], check=True,
                   capture_output=True, timeout=120)
    assert target.stat().st_size < LIMIT_BYTES
    return target


@contextlib.contextmanager
def push_registry(directory: Path) -> Iterator[RegistryServer]:
    """A real docker-registry keeping its files in `directory`, whose only login is LOGIN."""
    htpasswd = directory / "htpasswd"
    htpasswd.write_bytes(LOGIN.username.encode() + b":" + bcrypt.hashpw(LOGIN.password.encode(), bcrypt.gensalt(4))
                         + b"\n")
    server = RegistryServer(directory / "registry", free_port(), htpasswd=htpasswd)
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def push_login_file(directory: Path) -> Path:
    """LOGIN as a frontend's --own-registry-push-login-file."""
    login_file = directory / "push.json"
    write_atomically(login_file, json.dumps({"username": LOGIN.username, "password": LOGIN.password}).encode(),
                     0o600)
    return login_file


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[RegistryServer]:
    with push_registry(tmp_path) as server:
        yield server


@pytest.fixture
async def images(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path,
                 registry: RegistryServer) -> AsyncIterator[image_service_pb2_grpc.ImageServiceStub]:
    login_file = push_login_file(tmp_path)
    (tmp_path / "imports").mkdir()
    app = await frontend_with(auth_app, db_config, certs, tmp_path, own_registry_push=registry.url,
                              own_registry_push_login_file=login_file, image_import_dir=tmp_path / "imports",
                              limits=limits_for_tests(max_image_import_bytes=LIMIT_BYTES))
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            yield image_service_pb2_grpc.ImageServiceStub(channel)
    finally:
        await app.stop()


def stream(header: ipb.ImportImageHeader | None, data: bytes, chunk: int = 1 << 20) -> Iterator[ipb.ImportImageRequest]:
    if header is not None:
        yield ipb.ImportImageRequest(header=header)
    for i in range(0, len(data), chunk):
        yield ipb.ImportImageRequest(chunk=data[i:i + chunk])


async def refusal(stub: image_service_pb2_grpc.ImageServiceStub, requests: Iterator[ipb.ImportImageRequest],
                  who: Any, hold: bool = True) -> grpc.aio.AioRpcError:
    """The server's refusal of an import. With `hold`, for one it refuses before the stream ends: the messages
    are sent, then the stream is held open, for were the client still writing when the server answers, grpcio's
    client could report INTERNAL instead of the answer (grpc/grpc#36066; corral's client then asks again with
    the header alone)."""
    async def held_open() -> AsyncIterator[ipb.ImportImageRequest]:
        for request in requests:
            yield request
        if hold:
            await asyncio.sleep(60)

    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ImportImage(held_open(), metadata=who)
    return error.value


async def test_imports_are_refused_with_the_right_status_and_leave_nothing(
        images: image_service_pb2_grpc.ImageServiceStub, alice: Any, auth_app: AuthApp,  # noqa: F811
        archive: Path, registry: RegistryServer, tmp_path: Path) -> None:
    data = archive.read_bytes()
    header = ipb.ImportImageHeader(billing_project="proj", name="tool", tag="v1")
    no_header = await refusal(images, stream(None, data), alice)
    assert violations(no_header) == {"header": "the first message must be the header"}
    bad_name = await refusal(images, stream(ipb.ImportImageHeader(billing_project="proj", name="Tool/x"), data), alice)
    assert set(violations(bad_name)) == {"header.name"}
    too_big = await refusal(images, stream(header, data + bytes(LIMIT_BYTES)), alice)
    assert too_big.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_image_import_bytes" in too_big.details()
    # Said in the header, a size too large is refused before any chunk; chunks beyond a declared size are refused.
    declared = ipb.ImportImageHeader(billing_project="proj", name="tool", tag="v1", size_bytes=LIMIT_BYTES + 1)
    said = await refusal(images, stream(declared, b""), alice)
    assert said.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_image_import_bytes" in said.details()
    declared.size_bytes = len(data) - 1
    longer = await refusal(images, stream(declared, data), alice)
    assert violations(longer) == {"chunk": f"the archive is larger than the header's size_bytes ({len(data) - 1:,})"}
    store = AuthStore(auth_app.db)
    await store.create_user("mallory")
    mallory = bearer((await store.create_token("mallory", "api"))[1])
    outsider = await refusal(images, stream(header, data), mallory)
    assert outsider.code() == grpc.StatusCode.NOT_FOUND and outsider.details() == "no billing project proj"
    assert registry_digest(f"{registry.address}/proj/tool:v1", login=LOGIN) is None  # nothing tagged
    assert list((tmp_path / "imports").iterdir()) == []  # nothing left on the frontend's disk

    imported = (await images.ImportImage(stream(header, data), metadata=alice)).image
    assert imported.reference == "localhost/proj/tool:v1" and imported.layers == 1
    assert imported.digest == registry_digest(f"{registry.address}/proj/tool:v1", login=LOGIN)
    assert list((tmp_path / "imports").iterdir()) == []
    listed = await images.ListImages(ipb.ListImagesRequest(billing_project="proj"), metadata=alice)
    assert [i.reference for i in listed.images] == ["localhost/proj/tool:v1"]
    outsider_list = await refusal_of_list(images, mallory)
    assert outsider_list.code() == grpc.StatusCode.NOT_FOUND

    registry.stop()
    down = await refusal(images, stream(ipb.ImportImageHeader(billing_project="proj", name="tool", tag="v2"), data),
                         alice, hold=False)
    assert down.code() == grpc.StatusCode.UNAVAILABLE, down.details()


async def refusal_of_list(stub: image_service_pb2_grpc.ImageServiceStub, who: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ListImages(ipb.ListImagesRequest(billing_project="proj"), metadata=who)
    return error.value


async def test_a_frontend_without_a_push_login_keeps_no_images(
        auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority, tmp_path: Path,
        alice: Any, archive: Path) -> None:  # noqa: F811
    app = await frontend_with(auth_app, db_config, certs, tmp_path)
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            stub = image_service_pb2_grpc.ImageServiceStub(channel)
            header = ipb.ImportImageHeader(billing_project="proj", name=f"t{uuid.uuid4().hex[:6]}")
            error = await refusal(stub, stream(header, archive.read_bytes()), alice)
    finally:
        await app.stop()
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "--own-registry-push" in error.details()
