"""`corral up`'s own registry: it runs as two more supervised processes in the data directory (the
workers' read-only one and the one only corral up pushes to, each asking for a login of its own), serves
the busybox it seeded to a real pull with the pull login (the worker's image cache, skopeo and umoci),
is named to the workers the drivers start, whose command lines name the login's file and never hold
the password, is seeded only once across restarts, ends with `corral up`, and is not started when
`--registry` names another."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.common.processes import PidRecord
from services.common.registry_logins import read_login_file
from services.worker.image_tools import ImagePullError, PullFailure
from services.worker.images import ImageCache
from tests.e2e import cluster as up

BATCH = """
billing_project: default
jobs:
  - image: busybox
    command: [echo, hello]
"""


async def pull_busybox(cache_dir: Path, registry_url: str, data_dir: Path) -> tuple[str, bytes]:
    login = read_login_file(data_dir / "registry" / "logins" / "pull.json")
    cache = ImageCache(cache_dir, registry_url, own_login=login)
    try:
        image = await cache.pull("localhost/docker.io/library/busybox")
        return image.digest, (image.rootfs / "bin" / "busybox").read_bytes()
    finally:
        await cache.close()


async def pull_busybox_anonymously(cache_dir: Path, registry_url: str) -> None:
    cache = ImageCache(cache_dir, registry_url)
    try:
        await cache.pull("localhost/docker.io/library/busybox")
    finally:
        await cache.close()


def registry_record(cluster: up.Cluster) -> PidRecord:
    data = json.loads((cluster.data_dir / "run" / "pids" / "registry.pid").read_text())
    return PidRecord("registry", data["pid"], data["start_ticks"])


@pytest.mark.timeout(300)
def test_corral_up_runs_seeds_and_names_its_registry(tmp_path: Path) -> None:
    cluster = up.start(tmp_path)
    try:
        registry_url = cluster.endpoints["registry"]
        assert registry_url.startswith("http://127.0.0.1:")
        assert cluster.said(f"registry: seeded {registry_url.removeprefix('http://')}/docker.io/library/busybox:latest")
        with pytest.raises(ImagePullError) as anonymous:  # without the pull login: nothing
            asyncio.run(pull_busybox_anonymously(tmp_path / "anonymous", registry_url))
        assert anonymous.value.failure is PullFailure.UNAUTHORIZED
        digest, busybox = asyncio.run(pull_busybox(tmp_path / "cache", registry_url, cluster.data_dir))
        assert busybox == Path("/bin/busybox").read_bytes()
        record = registry_record(cluster)
        assert record.alive()

        # The workers a driver starts are told of it.
        (tmp_path / "batch.yaml").write_text(BATCH)
        submitted = cluster.cli("submit", "-q", str(tmp_path / "batch.yaml"))
        assert submitted.returncode == 0, submitted.stderr
        pid = next(iter(up.eventually(cluster.worker_pids, what="a worker").values()))
        argv = up.processes()[pid]
        assert argv[argv.index("--own-registry") + 1] == registry_url
        assert argv[argv.index("--registry-mirror") + 1] == f"docker.io={registry_url}/docker.io"
        login_file = Path(argv[argv.index("--own-registry-login-file") + 1])
        assert login_file.parent == Path(argv[argv.index("--certs-dir") + 1])  # beside its certificate
        assert login_file.stat().st_mode & 0o777 == 0o600
        password = read_login_file(cluster.data_dir / "registry" / "logins" / "pull.json").password
        assert not any(password in " ".join(a) for a in up.processes().values())
    finally:
        assert cluster.stop() == 0
    assert not record.alive()  # it ended with corral up

    # Started again: the same images, not pushed again.
    cluster = up.start(tmp_path)
    try:
        assert not cluster.said("registry: seeded")
        again, _ = asyncio.run(pull_busybox(tmp_path / "cache-2", cluster.endpoints["registry"], cluster.data_dir))
        assert again == digest
    finally:
        assert cluster.stop() == 0

    # Told to use another registry, it runs none of its own.
    cluster = up.start(tmp_path, "--registry", "http://127.0.0.1:5999/")
    try:
        assert cluster.endpoints["registry"] == "http://127.0.0.1:5999"
        assert not (cluster.data_dir / "run" / "pids" / "registry.pid").exists()
        assert not any("docker-registry" in " ".join(argv) for pid, argv in up.processes().items()
                       if pid in cluster.descendants())
    finally:
        assert cluster.stop() == 0
