"""The OCI runtime running images pulled from a real registry on loopback through the worker's image cache
(CachedRootfs over services.worker.images.ImageCache): the image's digest in the attempt's isolation note,
held while attempts run it and released by each, 50 attempts of a new image pulling and unpacking it once,
and a pull that fails ending the attempt in Error with the registry's words."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.worker.images import ImageCache
from services.worker.oci.images import CachedRootfs
from tests import registry as test_registry
from tests.oci.host import OciHost, fields, run, spec
from tests.service.test_image_cache import Runs, open_cache


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.SeededRegistry]:
    yield from test_registry.running(tmp_path_factory.mktemp("registry"))


@pytest.fixture
async def cache(tmp_path: Path, registry: test_registry.SeededRegistry) -> AsyncIterator[ImageCache]:
    images = ImageCache(tmp_path / "image-cache", registry.url)
    try:
        yield images
    finally:
        await images.close()


async def test_jobs_run_the_registrys_busybox_held_while_they_run(oci_host: OciHost, cache: ImageCache,
                                                          registry: test_registry.SeededRegistry) -> None:
    runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
    started: list[str] = []

    async def one(i: int) -> None:
        job = oci_host.job(spec("echo pid=$$; echo host=$(hostname)"), attempt_id=f"r{i}")

        async def on_started(pid: int) -> None:
            started.append(runtime.isolation(job))
            assert cache.held()[0].users >= 1  # held while it runs, so never evicted then

        outcome, log = await run(runtime, job, on_started)
        assert outcome.state == "Success", log
        assert fields(log)["pid"] == "1"
        assert registry.busybox_digest in outcome.isolation  # the digest that ran, for `corral job`

    await asyncio.gather(*(one(i) for i in range(5)))
    assert len(started) == 5 and all(registry.busybox_digest in note for note in started)
    [held] = cache.held()
    assert (held.digest, held.users) == (registry.busybox_digest, 0)  # one image, released by every attempt


async def test_an_image_the_registry_does_not_have_is_an_error_in_its_words(oci_host: OciHost,
                                                                            cache: ImageCache) -> None:
    runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
    missing = spec("true")
    missing.image = "no-such-image:1"
    job = oci_host.job(missing)
    outcome, _ = await run(runtime, job)
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert outcome.error_message.startswith("image: could not get 'no-such-image:1': ")
    assert "manifest unknown" in outcome.error_message, outcome.error_message
    assert cache.held() == []


async def test_50_jobs_of_a_new_image_pull_and_unpack_it_once(oci_host: OciHost, tmp_path: Path,
                                                              registry: test_registry.SeededRegistry) -> None:
    """Acceptance 7 of issue 13: 50 attempts starting together on an image no worker holds yet."""
    runs = Runs()
    cache = open_cache(tmp_path / "counted-cache", registry.url, runs)
    try:
        runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
        image = spec("true")
        image.image = "variant:0"
        outcomes = await asyncio.gather(*(run(runtime, oci_host.job(image, attempt_id=f"v{i}")) for i in range(50)))
        assert [outcome.state for outcome, _ in outcomes] == ["Success"] * 50, [o.error_message for o, _ in outcomes]
        assert runs.count() == {"inspect": 1, "copy": 1, "unpack": 1}
        assert [(held.digest, held.users) for held in cache.held()] == [(registry.variants["variant:0"], 0)]
    finally:
        await cache.close()
