"""What a worker reports about the image each attempt ran, as the driver records it (issue 35): an OCI
worker pulling from a real registry reports the manifest digest the registry serves for the tag; a
process worker, which pulls nothing, reports none and its jobs run all the same. Real worker, driver,
database and registry; the OCI half needs root and runc (tests/oci), and skips otherwise."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2
from services.db.invariants import check_invariants
from services.worker.app import start as start_worker
from tests.oci.host import WHY_NOT
from tests.registry import SeededRegistry
from tests.service import test_worker
from tests.service.test_worker import ClusterFactory, eventually

make_cluster = test_worker.make_cluster  # the fixture, here too

pytestmark = pytest.mark.timeout(90)

MIB = 2**20


def busybox(image: str = "busybox") -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image=image, script="true", network_mode=job_spec_pb2.NETWORK_MODE_NONE)


@pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)
@pytest.mark.usefixtures("host_ip_forwarding")
async def test_an_oci_worker_reports_the_digest_the_registry_serves(
        make_cluster: ClusterFactory, registry: SeededRegistry, tmp_path: Path) -> None:
    cluster = await make_cluster()
    name = f"w-oci-{uuid.uuid4().hex[:6]}"  # the worker's name on the host: its runc state, cgroups
    worker = await start_worker(await cluster.instance(
        name, memory_bytes=1024 * MIB, runtime="oci", own_registry=registry.url,
        registry_mirrors=(registry.mirror,), image_cache_dir=tmp_path / "images"))
    cluster.workers.append(worker)
    await eventually(lambda: worker.worker.connected, what="worker connected")
    batch_id, [by_tag, by_digest] = await cluster.submit(busybox(), busybox(f"busybox@{registry.busybox_digest}"),
                                                         cores_mcpu=250, memory_bytes=0)
    for job_id in (by_tag, by_digest):
        assert (await cluster.final(batch_id, job_id))["state"] == "Success"
        [attempt] = await cluster.attempts(batch_id, job_id)
        assert attempt["image_digest"] == registry.busybox_digest
        assert registry.busybox_digest in attempt["isolation"]  # the note and the field agree
    assert await check_invariants(cluster.driver.db) == []


async def test_a_process_worker_reports_no_digest(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster()
    await cluster.worker("w1")
    batch_id, [job_id] = await cluster.submit(job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(
        args=["true"])))
    assert (await cluster.final(batch_id, job_id))["state"] == "Success"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert attempt["start_time_ms"] is not None and attempt["image_digest"] is None
