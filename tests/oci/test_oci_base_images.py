"""A job in the seeded `python` base image, under real runc: the image built from Debian's packages (in the
machine's base image cache, tests/conftest.py: built once per machine, a minute or two the first time, hence
slow), seeded into a real registry on loopback where `corral up` seeds it (`docker.io/library/python:3.11`),
pulled by its full name through the worker's image cache, and run with the command of the issue's
acceptance 1."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.registry.seed import seed
from services.registry.server import RegistryServer
from services.up.ports import free_port
from services.worker.images import ImageCache
from services.worker.oci.images import CachedRootfs
from tests.conftest import BASE_IMAGE_CACHE
from tests.oci.host import OciHost, run, spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    server = RegistryServer(tmp_path_factory.mktemp("registry"), free_port())
    server.start()
    try:
        server.wait_ready()
        seed(server.address, BASE_IMAGE_CACHE, images=("python",), prune=False)
        yield server
    finally:
        server.stop()


@pytest.fixture
async def cache(tmp_path: Path, registry: RegistryServer) -> AsyncIterator[ImageCache]:
    images = ImageCache(tmp_path / "image-cache", registry.url)
    try:
        yield images
    finally:
        await images.close()


async def test_a_python_job_imports_cloudpickle_in_the_seeded_python_image(
        oci_host: OciHost, cache: ImageCache, registry: RegistryServer) -> None:
    runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
    job = spec("", "python3", "-c", "import cloudpickle, sys; print(sys.version)")
    job.image = f"{registry.address}/docker.io/library/python:3.11"
    outcome, log = await run(runtime, oci_host.job(job))
    assert outcome.state == "Success", log
    assert log.startswith("3.11."), log  # Debian bookworm's python3: the client's minor version
    [held] = cache.held()
    assert held.digest in outcome.isolation
    print(f"\n{job.image} ({held.digest}, {held.size_bytes / 2**20:.0f} MiB unpacked): {log.strip()}")
