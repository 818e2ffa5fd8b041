"""A worker chosen to run its jobs in OCI containers (`--runtime oci`), against a
real driver and database: the runtime it picks, the containers' outcomes as
the driver records them (out of memory read from the cgroup; a job that
reserved no memory limited to the worker's memory per core), and its status
(RUNTIME_KIND_OCI). Needs root and runc, like tests/oci; skips otherwise."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2
from corral.worker.v1 import worker_service_pb2 as wpb
from corral.worker.v1 import worker_status_pb2
from services.common.usage_series import decode
from services.db.invariants import check_invariants
from services.worker.app import choose_runtime, start as start_worker
from services.worker.object_stores import ObjectStores
from services.worker.config import WorkerConfig
from services.worker.oci import OciRuntime
from services.worker.runtime import ProcessRuntime
from tests.oci.host import WHY_NOT, build_busybox_images
from tests.service import test_worker
from tests.service.test_worker import ClusterFactory, eventually, worker_stub

make_cluster = test_worker.make_cluster  # the fixture, here too

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT),
              pytest.mark.usefixtures("host_ip_forwarding")]

MIB = 2**20


def busybox(script: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="busybox", script=script, network_mode=job_spec_pb2.NETWORK_MODE_NONE)


async def test_runtime_choice(tmp_path: Path) -> None:
    def config(**fields) -> WorkerConfig:
        return WorkerConfig(f"w-choice-{uuid.uuid4().hex[:6]}", "token", 2000, (), tmp_path, tmp_path,
                            "file:///x", **fields)

    assert isinstance(await choose_runtime(config(), ObjectStores()), ProcessRuntime)
    with pytest.raises(ValueError, match="the OCI runtime needs an image cache or --oci-images-dir"):
        await choose_runtime(config(runtime="oci"), ObjectStores())
    assert isinstance(await choose_runtime(config(runtime="auto"), ObjectStores()), ProcessRuntime)
    oci = await choose_runtime(config(runtime="auto", oci_images_dir=build_busybox_images(tmp_path / "images")),
                               ObjectStores())
    assert isinstance(oci, OciRuntime)
    await oci.close()
    assert not (oci.config.state_root / oci.config.owner).exists()


async def test_a_worker_runs_its_jobs_in_containers(make_cluster: ClusterFactory, tmp_path: Path) -> None:
    cluster = await make_cluster()
    name = f"w-oci-{uuid.uuid4().hex[:6]}"  # the worker's name on the host: its runc state, cgroups
    worker = await start_worker(await cluster.instance(name, memory_bytes=1024 * MIB, runtime="oci",
                                                       oci_images_dir=build_busybox_images(tmp_path / "images")))
    cluster.workers.append(worker)
    await eventually(lambda: worker.worker.connected, what="worker connected")
    assert isinstance(worker.worker.runtime, OciRuntime)
    channel, stub = worker_stub(cluster, worker.address)
    async with channel:
        status = await stub.GetStatus(wpb.GetStatusRequest())
    assert status.runtime_kind == worker_status_pb2.RUNTIME_KIND_OCI and status.isolated

    # The worker offers 1 GiB for 2 cores: a quarter core that reserved no memory gets 128 MiB.
    batch_id, [fine, fits, greedy] = await cluster.submit(
        busybox("hostname"), busybox("head -c 64m /dev/zero | tail > /dev/null"),
        busybox("head -c 200m /dev/zero | tail > /dev/null"), cores_mcpu=250, memory_bytes=0)
    rows = {job_id: await cluster.final(batch_id, job_id) for job_id in (fine, fits, greedy)}
    assert [rows[j]["state"] for j in (fine, fits, greedy)] == ["Success", "Success", "Failed"]
    attempts = {job_id: (await cluster.attempts(batch_id, job_id))[0] for job_id in rows}
    assert any(f"OCI container ({kind})" in attempts[fine]["isolation"] for kind in ("crun", "runc"))
    assert "0.25 cores, 134217728 bytes of memory with no swap" in attempts[fine]["isolation"]
    assert (attempts[greedy]["reason"], attempts[greedy]["exit_code"]) == ("out_of_memory", 137)
    assert 64 * MIB < attempts[greedy]["peak_memory_bytes"] <= 128 * MIB
    log = cluster.blobs / "logs" / str(batch_id) / str(fine) / attempts[fine]["attempt_id"] / "main.log"
    assert log.read_text() == f"job-{batch_id}-{fine}\n"
    assert await check_invariants(cluster.driver.db) == []


async def test_a_running_containers_usage_reaches_the_database_and_its_series_storage(
        make_cluster: ClusterFactory, tmp_path: Path) -> None:
    """The sampler reads the container's cgroup; heartbeats carry the latest sample to the driver, which keeps
    it on the running attempt; the series is stored beside the log at the end."""
    cluster = await make_cluster()
    name = f"w-oci-{uuid.uuid4().hex[:6]}"
    worker = await start_worker(await cluster.instance(name, memory_bytes=1024 * MIB, runtime="oci",
                                                       oci_images_dir=build_busybox_images(tmp_path / "images"),
                                                       usage_interval_s=0.2))
    cluster.workers.append(worker)
    await eventually(lambda: worker.worker.connected, what="worker connected")
    batch_id, [job_id] = await cluster.submit(busybox("(head -c 32m /dev/zero; sleep 4) | tail > /dev/null"),
                                              cores_mcpu=250, memory_bytes=0)

    async def sampled_while_running() -> bool:
        rows = await cluster.attempts(batch_id, job_id)
        return bool(rows) and rows[0]["end_time_ms"] is None and (rows[0]["peak_memory_bytes"] or 0) >= 32 * MIB

    await eventually(sampled_while_running, what="the running attempt's last sample in the database")
    assert (await cluster.final(batch_id, job_id))["state"] == "Success"
    [attempt] = await cluster.attempts(batch_id, job_id)
    series = cluster.blobs / "logs" / str(batch_id) / str(job_id) / attempt["attempt_id"] / "usage.jsonl"
    header, samples = decode(series.read_bytes())
    assert (header.runtime, header.interval_ms) == ("oci", 200)
    assert len(samples) >= 5 and samples[-1].at_ms == attempt["end_time_ms"]
    assert samples[-1].reading.peak_memory_bytes == attempt["peak_memory_bytes"] >= 32 * MIB
    assert await check_invariants(cluster.driver.db) == []
