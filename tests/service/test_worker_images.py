"""A worker's ListImages reports its image cache (services.worker.images): a real worker over gRPC
with mutual TLS, its cache filled from the real registry first, as a worker before it would have."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from corral.worker.v1 import worker_service_pb2 as wpb
from services.worker.images import ImageCache
from tests.registry import SeededRegistry
from tests.service import test_worker
from tests.service.test_worker import Cluster, worker_stub

make_cluster, cluster = test_worker.make_cluster, test_worker.cluster  # its fixtures, used here too

pytestmark = pytest.mark.timeout(60)


async def test_list_images_pages_through_what_the_cache_holds(cluster: Cluster, registry: SeededRegistry,
                                                              tmp_path: Path) -> None:
    images_dir = tmp_path / "images"
    cache = ImageCache(images_dir, registry.url, mirrors=(registry.mirror,))
    try:
        busybox = await cache.pull("busybox")
        await cache.pull(f"busybox@{busybox.digest}")
        variant = await cache.pull("variant:0")
        held = {image.digest: image for image in cache.held()}
    finally:
        await cache.close()

    worker = await cluster.worker("w1", own_registry=registry.url, registry_mirrors=(registry.mirror,),
                                  image_cache_dir=images_dir)
    channel, stub = worker_stub(cluster, worker.address)
    async with channel:
        listed = await stub.ListImages(wpb.ListImagesRequest())
        assert [(image.reference, image.digest) for image in listed.images] == [
            ("docker.io/library/busybox:latest", busybox.digest),
            (f"docker.io/library/busybox@{busybox.digest}", busybox.digest),
            ("docker.io/library/variant:0", variant.digest)]
        assert listed.next_page_token == ""
        first = listed.images[0]
        assert first.size_bytes == busybox.size_bytes
        assert first.pulled_at.ToMilliseconds() == held[busybox.digest].pulled_at_ms
        assert first.last_used_at.ToMilliseconds() == held[busybox.digest].last_used_at_ms

        pages, token = [], ""
        while True:
            page = await stub.ListImages(wpb.ListImagesRequest(page_size=2, page_token=token))
            pages.append([image.reference for image in page.images])
            token = page.next_page_token
            if not token:
                break
        assert pages == [[image.reference for image in listed.images[:2]], [listed.images[2].reference]]

        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ListImages(wpb.ListImagesRequest(page_token="bm90IGpzb24="))  # "not json"
        assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
