"""`corral up`'s own registry: it runs as one more supervised process in the data directory, serves
the busybox it seeded to a real pull (the worker's image cache, skopeo and umoci), is named to the
workers the drivers start, is seeded only once across restarts, ends with `corral up`, and is not
started when `--registry` names another."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.common.processes import PidRecord
from services.worker.images import ImageCache
from tests.e2e import cluster as up

BATCH = """
billing_project: default
jobs:
  - image: busybox
    command: [echo, hello]
"""


async def pull_busybox(cache_dir: Path, registry_url: str) -> tuple[str, bytes]:
    cache = ImageCache(cache_dir, registry_url)
    try:
        image = await cache.pull("busybox")
        return image.digest, (image.rootfs / "bin" / "busybox").read_bytes()
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
        assert cluster.said(f"registry: seeded {registry_url.removeprefix('http://')}/busybox:latest")
        digest, busybox = asyncio.run(pull_busybox(tmp_path / "cache", registry_url))
        assert busybox == Path("/bin/busybox").read_bytes()
        record = registry_record(cluster)
        assert record.alive()

        # The workers a driver starts are told of it.
        (tmp_path / "batch.yaml").write_text(BATCH)
        submitted = cluster.cli("submit", "-q", str(tmp_path / "batch.yaml"))
        assert submitted.returncode == 0, submitted.stderr
        pid = next(iter(up.eventually(cluster.worker_pids, what="a worker").values()))
        argv = up.processes()[pid]
        assert argv[argv.index("--default-registry") + 1] == registry_url
    finally:
        assert cluster.stop() == 0
    assert not record.alive()  # it ended with corral up

    # Started again: the same images, not pushed again.
    cluster = up.start(tmp_path)
    try:
        assert not cluster.said("registry: seeded")
        again, _ = asyncio.run(pull_busybox(tmp_path / "cache-2", cluster.endpoints["registry"]))
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
