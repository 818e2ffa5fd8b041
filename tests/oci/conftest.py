"""Fixtures of the OCI runtime's tests (tests/oci/host.py has the rest): a
busybox image built once per session, and `oci_host`, autouse, which closes
the test's runtimes after it and checks that nothing it made is left
(acceptance 4); `outside`, the world outside the host for the network tests
(tests/oci/outside.py)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.conftest import in_parallel_worker
from tests.oci.host import WHY_NOT, BusyboxImages, OciHost, build_busybox_images
from tests.oci.outside import outside  # noqa: F401  (a fixture of the network tests)

FORWARDING = Path("/proc/sys/net/ipv4/ip_forward")


@pytest.fixture(scope="session")
def busybox_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of images for DirectoryRootfs: 'busybox' (busybox-static, its applets as links in /bin,
    /etc/passwd and /etc/group, /tmp 1777), made once."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    return build_busybox_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(autouse=True)
async def oci_host(tmp_path: Path, busybox_images: Path) -> AsyncIterator[OciHost]:
    """The test's corner of the host; what it leaves is a failure. The test runs with the services' umask
    (077, services.common.entry), as a worker does."""
    host = OciHost(tmp_path, BusyboxImages(busybox_images))
    forwarding = FORWARDING.read_text()
    umask = os.umask(0o077)
    try:
        yield host
    finally:
        os.umask(umask)
    for runtime in host.runtimes:
        await runtime.close()
    left = host.leftovers()
    await host.clean_up()  # whatever happened: a failing test must not leave its mess on the host
    if not in_parallel_worker():  # else the run's end puts it back (tests/conftest.py): others may need it
        FORWARDING.write_text(forwarding)  # a runtime turns IPv4 forwarding on for its bridges and leaves it on
    assert left == []
