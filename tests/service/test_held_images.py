"""What the workers hold, over real gRPC: worker sessions on a driver report their image caches
(ImageCacheReport), the driver answers ListHeldImages from them (to the frontend's identity only, and only as
the leader), and a real frontend's ListImages, over a real `docker-registry` behind a push login, says how many
workers hold each image and lists after them the public images only workers hold, never a project's private
image to another project, and still answers when no driver does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from corral.batch.v1 import image_service_pb2 as ipb
from corral.batch.v1 import image_service_pb2_grpc
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc
from corral.driver.v1 import worker_session_pb2 as ws
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.files import write_atomically
from services.common.server import Listener, Service, serve
from services.common.specs import SpecStore
from services.common.tls import DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.db.store import JobStore
from services.driver.servicer import DriverServicer
from services.driver.sessions import SessionRegistry
from services.registry.server import RegistryServer
from tests.service.conftest import bearer, person_channel, service_channel
from tests.service.test_driver_session import read_until
from tests.service.test_images_service import LOGIN, archive, registry, stream  # noqa: F401 - fixtures
from tests.service.test_submission_urls import frontend_with
from tests.world import World

PUBLIC = "sha256:" + "a" * 64
PRIVATE = "sha256:" + "b" * 64


@pytest.fixture
async def driver(world: World, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    """A leading driver's DriverService (no loops) at `port`, which names itself as the leader."""
    sessions = SessionRegistry(world.store, SpecStore(f"file://{tmp_path / 'blobs'}"), world.clock)
    state: dict[str, Any] = {"epoch": world.epoch, "address": ""}
    servicer = DriverServicer(world.store, sessions, lambda: state["epoch"], lambda: state["address"],
                              lambda kind: None)
    servers = await serve([Service("corral.driver.v1.DriverService", servicer,
                                   driver_service_pb2_grpc.add_DriverServiceServicer_to_server)],
                          [Listener.mutual_tls("127.0.0.1:0", certs.issue("driver"))])
    state.update(port=servers.ports[0], address=f"localhost:{servers.ports[0]}", servers=servers)
    try:
        yield state
    finally:
        await servers.stop(0)


async def reporting_worker(world: World, certs: DevCertificateAuthority, port: int, instance: str,
                           report: ws.ImageCacheReport) -> tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]:
    """`instance` activated, its session open, its image cache report recorded (a heartbeat after it acknowledged)."""
    await world.store.create_instance(world.epoch, instance, "standard", 2000, f"activation-{instance}")
    channel = service_channel(certs.issue(f"worker-{instance}"), port)
    stub = driver_service_pb2_grpc.DriverServiceStub(channel)
    activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name=instance,
                                                                   activation_token=f"activation-{instance}"))
    call = stub.WorkerSession()
    await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name=instance,
                                                            instance_token=activated.instance_token)))
    await read_until(call, "welcome")
    await call.write(pb.WorkerSessionRequest(event_id=1, image_cache=report))
    await call.write(pb.WorkerSessionRequest(event_id=2, heartbeat=ws.Heartbeat(free_cores_mcpu=2000)))
    assert (await read_until(call, "ack_job_event")).ack_job_event.event_id == 2  # the report before it, recorded
    return channel, call


def push_login(tmp_path: Path) -> Path:
    login_file = tmp_path / "push.json"
    write_atomically(login_file, json.dumps({"username": LOGIN.username, "password": LOGIN.password}).encode(),
                     0o600)
    return login_file


def cached(digest: str, *public: str, names: tuple[str, ...] = ()) -> ws.CachedImage:
    return ws.CachedImage(digest=digest, names=[*public, *names], public_references=public)


async def test_the_leader_tells_the_frontend_alone_which_workers_hold_which_images(
        world: World, driver: dict[str, Any], certs: DevCertificateAuthority) -> None:
    opened = [await reporting_worker(world, certs, driver["port"], "i1", ws.ImageCacheReport(images=[
                  cached(PUBLIC, "docker.io/library/busybox:latest", names=("busybox",)),
                  cached(PRIVATE, names=("registry.lab.example/lab/secret:1",))])),
              await reporting_worker(world, certs, driver["port"], "i2", ws.ImageCacheReport(images=[
                  cached(PUBLIC, "docker.io/library/busybox:latest")]))]
    try:
        async with service_channel(certs.issue("frontend"), driver["port"]) as channel:
            stub = driver_service_pb2_grpc.DriverServiceStub(channel)
            held = await stub.ListHeldImages(pb.ListHeldImagesRequest())
            assert (held.workers, held.truncated) == (2, False)
            assert [(i.digest, i.workers_holding, list(i.public_references), list(i.instances))
                    for i in held.images] == [(PUBLIC, 2, ["docker.io/library/busybox:latest"], ["i1", "i2"]),
                                              (PRIVATE, 1, [], ["i1"])]

            driver["epoch"] = None  # a standby: the workers' sessions are the leader's
            with pytest.raises(grpc.aio.AioRpcError) as standby:
                await stub.ListHeldImages(pb.ListHeldImagesRequest())
            assert standby.value.code() == grpc.StatusCode.UNAVAILABLE
            assert driver["address"] in standby.value.details()
        driver["epoch"] = world.epoch
        with pytest.raises(grpc.aio.AioRpcError) as worker:
            await driver_service_pb2_grpc.DriverServiceStub(opened[0][0]).ListHeldImages(pb.ListHeldImagesRequest())
        assert worker.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        for channel, call in opened:
            call.cancel()
            await channel.close()


async def test_images_ls_says_what_workers_hold_and_never_shows_a_private_image_to_another_project(
        world: World, driver: dict[str, Any], certs: DevCertificateAuthority, auth_app: AuthApp,
        db_config: DatabaseConfig, tmp_path: Path, registry: RegistryServer, archive: Path) -> None:  # noqa: F811
    store = AuthStore(auth_app.db)
    for user in ("alice", "carol"):
        await store.create_user(user)
    await JobStore(world.db).create_billing_project("other", ["carol"])
    alice = bearer((await store.create_token("alice", "api"))[1])
    carol = bearer((await store.create_token("carol", "api"))[1])
    (tmp_path / "imports").mkdir()
    app = await frontend_with(auth_app, db_config, certs, tmp_path, own_registry_push=registry.url,
                              own_registry_push_login_file=push_login(tmp_path), image_import_dir=tmp_path / "imports",
                              driver_addresses=(driver["address"],))
    opened: list[tuple[grpc.aio.Channel, grpc.aio.StreamStreamCall]] = []
    try:
        async with person_channel(certs.issue("someone"), app.public_port) as channel:
            images = image_service_pb2_grpc.ImageServiceStub(channel)
            header = ipb.ImportImageHeader(billing_project="proj", name="tool", tag="v1")
            tool = (await images.ImportImage(stream(header, archive.read_bytes()), metadata=alice)).image

            async def listing(project: str, who: Any, page_size: int = 0) -> list[tuple[str, str, int | None]]:
                found, token = [], ""
                while True:
                    page = await images.ListImages(ipb.ListImagesRequest(
                        billing_project=project, page_size=page_size, page_token=token), metadata=who)
                    found += [(i.reference, i.digest, i.workers_holding if i.HasField("workers_holding") else None)
                              for i in page.images]
                    if not page.next_page_token:
                        return found
                    token = page.next_page_token

            assert await listing("proj", alice) == [("localhost/proj/tool:v1", tool.digest, 0)]  # no worker yet

            # i1 ran proj's image (from corral's registry: never public to others), a public image of Docker Hub
            # and a lab's private image with the job's credentials; i2 holds the public one too.
            opened.append(await reporting_worker(world, certs, driver["port"], "i1", ws.ImageCacheReport(images=[
                cached(tool.digest, names=("localhost/proj/tool:v1",)),
                cached(PUBLIC, "docker.io/lab/tool:1", names=("lab/tool:1",)),
                cached(PRIVATE, names=("registry.lab.example/lab/secret:1",))])))
            opened.append(await reporting_worker(world, certs, driver["port"], "i2", ws.ImageCacheReport(images=[
                cached(PUBLIC, "docker.io/lab/tool:1")])))
            expected = [("localhost/proj/tool:v1", tool.digest, 1), ("docker.io/lab/tool:1", PUBLIC, 2)]
            assert await listing("proj", alice) == expected
            assert await listing("proj", alice, page_size=1) == expected  # the workers' part pages too
            assert await listing("other", carol) == [("docker.io/lab/tool:1", PUBLIC, 2)]

            await driver["servers"].stop(0)  # no driver answers: the registry's part alone, and why
            down = await images.ListImages(ipb.ListImagesRequest(billing_project="proj"), metadata=alice)
            assert [(i.reference, i.HasField("workers_holding")) for i in down.images] == [
                ("localhost/proj/tool:v1", False)]
            assert "what workers hold is unknown" in down.workers_unknown
    finally:
        for channel, call in opened:
            call.cancel()
            await channel.close()
        await app.stop()
