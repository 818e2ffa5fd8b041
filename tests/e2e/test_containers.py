"""`corral up --worker-runtime oci`: a job runs in a runc container of the image corral up's registry
serves, pulled through the worker's image cache, and `corral job` names the digest that ran."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT


@pytest.mark.timeout(300)
def test_a_job_runs_in_a_container_of_the_registrys_image(tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    cluster = up.start(tmp_path, "--worker-runtime", "oci")
    try:
        builder = corral.BatchBuilder("default")
        builder.add_job(job_spec_pb2.JobSpec(image="busybox", script="echo pid=$$ host=$(hostname)",
                                             network_mode=job_spec_pb2.NETWORK_MODE_NONE))
        with cluster.client() as client:
            batch = client.submit(builder)
            done = client.wait(batch.batch_id)
            assert done.counts.n_succeeded == 1, client.get_job(batch.batch_id, 1).attempts[-1].error_message
            assert client.job_log(batch.batch_id, 1).decode().strip() == f"pid=1 host=job-{batch.batch_id}-1"
        shown = cluster.cli("job", str(batch.batch_id), "1")
        assert shown.returncode == 0, shown.stderr
        assert re.search(r"ran as: OCI container \(runc\) of the image 'busybox' \(sha256:[0-9a-f]{64}\)",
                         shown.stdout), shown.stdout
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
