"""Issue 35 on a real `corral up --worker-runtime oci`, offline: names are read as every container tool reads
them. `busybox` is `docker.io/library/busybox`, which corral up's registry serves as docker.io's mirror (its
seed image, under `docker.io/library/`); `ubuntu:24.04`, which the mirror does not have, is asked of Docker
Hub itself, which cannot be reached here: the job ends in Error at once, saying "registry unreachable:
docker.io" in corral's words, not after a minute-long hang (the time it took is printed, not asserted)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("host_ip_forwarding")]


def docker_hub_resolves() -> bool:
    try:
        socket.getaddrinfo("registry-1.docker.io", 443)
    except OSError:
        return False
    return True


def test_busybox_comes_from_the_mirror_and_an_image_it_lacks_fails_fast_naming_docker_hub(tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    if docker_hub_resolves():
        pytest.skip("Docker Hub resolves here: this test is about a machine without the internet")
    cluster = up.start(tmp_path, "--worker-runtime", "oci")
    try:
        registry = cluster.endpoints["registry"].removeprefix("http://")
        with cluster.client() as client:
            builder = corral.BatchBuilder("default", attributes={"test": "mirror"})
            builder.add_job(job_spec_pb2.JobSpec(image="busybox", script="echo from the mirror",
                                                 network_mode=job_spec_pb2.NETWORK_MODE_NONE))
            served = client.submit(builder)
            done = client.wait(served.batch_id)
            assert done.counts.n_succeeded == 1, client.get_job(served.batch_id, 1).attempts[-1].error_message
            assert client.job_log(served.batch_id, 1).decode() == "from the mirror\n"

            # The worker holds busybox now: what follows is the time of the pull that fails, not of a start.
            builder = corral.BatchBuilder("default", attributes={"test": "offline"})
            builder.add_job(job_spec_pb2.JobSpec(image="ubuntu:24.04", script="true", max_attempts=1,
                                                 network_mode=job_spec_pb2.NETWORK_MODE_NONE))
            started = time.monotonic()
            offline = client.submit(builder)
            client.wait(offline.batch_id)
            elapsed_s = time.monotonic() - started
            job = client.get_job(offline.batch_id, 1)
        print(f"ubuntu:24.04 offline: submitted to Error in {elapsed_s:.2f} s")
        assert job.state == job_state_pb2.JOB_STATE_ERROR, job
        error = job.attempts[-1].error_message
        assert error == "image: could not get 'ubuntu:24.04': registry unreachable: docker.io", error
        assert registry not in error
        shown = cluster.cli("job", str(offline.batch_id), "1")
        assert "registry unreachable: docker.io" in shown.stdout, shown.stdout + shown.stderr
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
