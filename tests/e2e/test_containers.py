"""`corral up --worker-runtime oci`: jobs run in runc containers of the image corral up's registry
serves, pulled through the worker's image cache, and `corral job` names the digest that ran; the README's
quickstart DAG (public network, the default) runs in containers too."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT


pytestmark = pytest.mark.usefixtures("host_ip_forwarding")


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
        assert re.search(r"ran as: OCI container \((?:crun|runc)\) of the image 'busybox' \(sha256:[0-9a-f]{64}\)",
                         shown.stdout), shown.stdout
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0


@pytest.mark.timeout(300)
def test_the_readme_quickstart_runs_in_containers(tmp_path: Path) -> None:
    """The README's quickstart lines verbatim, against `corral up --worker-runtime oci`."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    from tests.e2e.test_docs import PAGES, blocks, check_readme_quickstart
    [quickstart] = [b for b in blocks(PAGES[0]) if b.marker.startswith("<!-- quickstart")]
    # Its last job is in image: python, which the README's corral up seeds (test deployments seed busybox alone).
    cluster = up.start(tmp_path, "--worker-runtime", "oci", "--base-images", "busybox,python")
    try:
        work = tmp_path / "work"
        work.mkdir()
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", quickstart.code], cwd=work, capture_output=True, text=True,
            timeout=240, env={**cluster.env, "CORRAL_PASSWORD": "choose-a-password",
                              "PATH": f"{up.REPO_DIR / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"})
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        check_readme_quickstart(result.stdout)
        batch_id = re.search(r"batch (\d+) ", result.stdout).group(1)
        for job_id, image in ((1, "busybox"), (2, "busybox"), (3, "busybox"), (4, "python")):
            shown = cluster.cli("--profile", "alice", "job", batch_id, str(job_id))
            assert re.search(rf"ran as: OCI container \((?:crun|runc)\) of the image '{image}' "
                             rf"\(sha256:[0-9a-f]{{64}}\)",
                             shown.stdout), shown.stdout
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
