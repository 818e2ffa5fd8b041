"""`corral job` names the image as every container tool reads it and, per attempt, the digest that ran
(issue 35): under `corral up --worker-runtime oci`, a `busybox` job shows `docker.io/library/busybox:latest`
and the manifest digest corral up's registry serves for the tag (read here with skopeo, as anyone would);
the REST API returns both. A job on the process runtime, which pulls no image, shows no digest, and no
error."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from services.common.registry_logins import read_login_file
from tests.e2e import cluster as up
from tests.e2e.test_up_gateway import rest_get
from tests.oci.host import WHY_NOT

GATEWAY = ("--gateway", "--gateway-port", "0", "--internal-gateway-port", "0")
"""The public gateway, for REST, on ports of its own."""

BATCH = """
billing_project: default
jobs:
  - image: busybox
    command: [echo, hello]
"""


def served_digest(cluster: up.Cluster, repository: str, tag: str) -> str:
    """The sha256 of the manifest corral up's registry serves for REPOSITORY:TAG, with its pull login."""
    login = read_login_file(cluster.data_dir / "registry" / "logins" / "pull.json")
    address = cluster.endpoints["registry"].removeprefix("http://")
    manifest = subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", "--creds", f"{login.username}:{login.password}",
         f"docker://{address}/{repository}:{tag}"], capture_output=True, check=True, timeout=60).stdout
    return "sha256:" + hashlib.sha256(manifest).hexdigest()


def run_one(cluster: up.Cluster, tmp_path: Path) -> tuple[str, str]:
    """Submit BATCH and wait for it; its id and `corral job ID 1`'s output."""
    (tmp_path / "batch.yaml").write_text(BATCH)
    submitted = cluster.cli("submit", "-q", str(tmp_path / "batch.yaml"))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    batch_id = submitted.stdout.strip()
    waited = cluster.cli("wait", "--quiet", batch_id, timeout_s=240)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    shown = cluster.cli("job", batch_id, "1")
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^job 1  succeeded", shown.stdout, re.MULTILINE), shown.stdout
    return batch_id, shown.stdout


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("host_ip_forwarding")
def test_corral_job_shows_the_normalized_image_and_the_digest_that_ran(tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    cluster = up.start(tmp_path, "--worker-runtime", "oci", *GATEWAY)
    try:
        batch_id, shown = run_one(cluster, tmp_path)
        digest = served_digest(cluster, "docker.io/library/busybox", "latest")  # docker.io's mirror
        assert "  image docker.io/library/busybox:latest (written busybox)  command" in shown, shown
        assert re.findall(r"^    image digest: (\S+)$", shown, re.MULTILINE) == [digest], shown
        job = rest_get(cluster, f"/api/v1/batches/{batch_id}/jobs/1")["job"]
        assert (job["spec"]["image"], job["normalizedImage"]) == ("busybox", "docker.io/library/busybox:latest")
        assert [a["imageDigest"] for a in job["attempts"]] == [digest]
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0


@pytest.mark.timeout(300)
def test_a_job_on_the_process_runtime_shows_no_digest(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--worker-runtime", "process", *GATEWAY)
    try:
        batch_id, shown = run_one(cluster, tmp_path)
        assert "  image docker.io/library/busybox:latest (written busybox)  command" in shown, shown
        assert "image digest" not in shown, shown
        job = rest_get(cluster, f"/api/v1/batches/{batch_id}/jobs/1")["job"]
        assert job["normalizedImage"] == "docker.io/library/busybox:latest"
        assert [a.get("imageDigest", "") for a in job["attempts"]] == [""]  # JSON leaves out an empty string
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
