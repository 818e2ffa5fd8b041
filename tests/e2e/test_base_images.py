"""The issue's acceptance 1: `image: python` with `command: [python3, -c, "import cloudpickle, sys;
print(sys.version)"]` runs in `corral up`'s runc containers, the image being the base image `corral up` built
from Debian's packages and seeded as docker.io's mirror; `openjdk:17` and `debian` run beside it. The images
come from the machine's base image cache (tests/conftest.py): the first run on a machine builds them (a
minute or two), later runs only push them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT

pytestmark = pytest.mark.usefixtures("host_ip_forwarding")

JAVA = ("java -version 2>&1; echo 'class H { public static void main(String[] a) { "
        "System.out.println(\"hello from \" + System.getProperty(\"java.version\")); } }' >/tmp/H.java; "
        "java /tmp/H.java")
PYTHON = ["python3", "-c", "import cloudpickle, sys; print(sys.version)"]


@pytest.mark.timeout(900)
def test_python_openjdk_and_debian_jobs_run_in_the_seeded_base_images(tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    cluster = up.start(tmp_path, "--worker-runtime", "oci", "--base-images", "python,openjdk,debian",
                       timeout_s=600)
    try:
        builder = corral.BatchBuilder("default")
        builder.add_job(job_spec_pb2.JobSpec(image="python", argv=job_spec_pb2.Argv(args=PYTHON)))
        builder.add_job(job_spec_pb2.JobSpec(image="openjdk:17", script=JAVA))
        builder.add_job(job_spec_pb2.JobSpec(image="debian", argv=job_spec_pb2.Argv(
            args=["bash", "-c", "echo $BASH_VERSION; cat /etc/debian_version; ls --version | head -1"])))
        with cluster.client() as client:
            batch = client.submit(builder)
            done = client.wait(batch.batch_id)
            errors = [client.get_job(batch.batch_id, j).attempts[-1].error_message for j in (1, 2, 3)]
            assert done.counts.n_succeeded == 3, errors
            python, java, debian = (client.job_log(batch.batch_id, j).decode() for j in (1, 2, 3))
        assert python.startswith("3.11."), python  # Debian bookworm's python3: the client's minor version
        assert 'openjdk version "17.' in java and "hello from 17." in java, java
        assert re.fullmatch(r"5\.2\.\d+\(1\)-release\n12\.\d+\nls \(GNU coreutils\) 9\.1\n", debian), debian
        shown = cluster.cli("job", str(batch.batch_id), "1")
        assert "image docker.io/library/python:latest (written python)" in shown.stdout, shown.stdout
        assert re.search(r"ran as: OCI container \((?:crun|runc)\) of the image 'python' \(sha256:[0-9a-f]{64}\)",
                         shown.stdout), shown.stdout
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
