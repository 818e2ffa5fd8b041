"""Fixtures of the OCI runtime's tests (tests/oci/host.py has the rest): a
busybox image built once per session, and `oci_host`, autouse, which closes
the test's runtimes after it and checks that nothing it made is left
(acceptance 4)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.oci.host import BUSYBOX, WHY_NOT, BusyboxImages, OciHost


@pytest.fixture(scope="session")
def busybox_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of images for DirectoryRootfs: 'busybox' (busybox-static, its applets as links in /bin,
    /etc/passwd and /etc/group, /tmp 1777), made once."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    images = tmp_path_factory.mktemp("images")
    images.chmod(0o755)
    root = images / "busybox" / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
        (root / d).mkdir(parents=True)
    for d in (images / "busybox", root, *(root / x for x in ("bin", "etc", "proc", "sys", "dev"))):
        d.chmod(0o755)
    (root / "tmp").chmod(0o1777)
    (root / "root").chmod(0o700)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for f in ("passwd", "group"):
        (root / "etc" / f).chmod(0o644)
    return images


@pytest.fixture(autouse=True)
async def oci_host(tmp_path: Path, busybox_images: Path) -> AsyncIterator[OciHost]:
    """The test's corner of the host; what it leaves is a failure."""
    host = OciHost(tmp_path, BusyboxImages(busybox_images))
    yield host
    for runtime in host.runtimes:
        await runtime.close()
    assert host.leftovers() == []
