"""`corral up --prepull`: each worker pulls the named images into its cache when it starts, while it takes jobs,
so a job of one of them starts on an image pulled before it was submitted; a pull that fails is logged in the
worker's log and the worker carries on. Real processes: `corral up` with a real registry (docker-registry on
loopback, as its own registry), runc containers, skopeo and umoci."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import batch_pb2
from bench.oci_start import why_not
from tests import registry as test_registry
from tests.e2e import cluster as up


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.SeededRegistry]:
    yield from test_registry.running(tmp_path_factory.mktemp("registry"))


def cached(data_dir: Path) -> dict[str, dict]:
    """Every image in the local workers' caches: digest -> its image.json."""
    found = {}
    for path in data_dir.glob("workers/*/images/images/*/image.json"):
        metadata = json.loads(path.read_text())
        found[metadata["digest"]] = metadata
    return found


def run_job(client: corral.Client, image: str) -> batch_pb2.Batch:
    batch = corral.BatchBuilder("default")
    batch.job(image, ["true"], cores=1)
    return client.wait(client.submit(batch).batch_id)


@pytest.mark.timeout(300)
def test_workers_pull_the_prepull_images_when_they_start_and_log_the_ones_that_fail(
        tmp_path: Path, registry: test_registry.SeededRegistry) -> None:
    if reason := why_not():
        pytest.skip(f"no OCI runtime here: {reason}")
    busybox, wanted = registry.at("busybox:latest"), registry.at("variant:0")
    missing = f"{registry.address}/no-such-image:1"
    cluster = up.start(tmp_path, "--registry", registry.url, "--worker-runtime", "oci", "--max-workers", "1",
                       "--worker-cores", "2", "--idle-timeout", "120", "--prepull", f"{wanted},{missing}")
    try:
        with cluster.client() as client:
            # A job of another image brings the worker up; its pre-pulls run meanwhile.
            assert run_job(client, busybox).counts.n_succeeded == 1
            up.eventually(lambda: registry.variants["variant:0"] in cached(cluster.data_dir),
                          what="the pre-pulled image in the worker's cache")
            [instance] = {p.parent.name for p in cluster.data_dir.glob("workers/*/images")}
            [log] = cluster.data_dir.rglob(f"{instance}.log")
            up.eventually(lambda: f"pre-pull of {missing} failed" in log.read_text(), what="the failed pre-pull logged")

            # A job of the pre-pulled image runs on the image pulled before it was submitted: not pulled again.
            submitted_ms = time.time() * 1000
            assert run_job(client, wanted).counts.n_succeeded == 1
            image = cached(cluster.data_dir)[registry.variants["variant:0"]]
            assert image["pulled_at_ms"] < submitted_ms
            assert cluster.worker_pids(), "the worker carried on after a failed pre-pull"
    finally:
        cluster.stop()
