"""Issue 35, `corral images ls` lists what the workers hold, on a real `corral up --worker-runtime oci`.

After a job of `busybox` ran in a runc container, `corral images ls` shows the base image
`docker.io/library/busybox:latest` held by the one worker (its cache's report reached the leading driver, which
the frontend asked). A project's private image the worker ran (alpha's, imported from an archive of busybox) is
counted for its project's members and never in another project's listing.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from services.registry.seed import cached_busybox
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("host_ip_forwarding")]

BUSYBOX = "docker.io/library/busybox:latest"


def job(image: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image=image, argv=job_spec_pb2.Argv(args=["true"]), max_attempts=1,
                                network_mode=job_spec_pb2.NETWORK_MODE_NONE)


def test_images_ls_shows_busybox_held_by_the_worker_that_ran_it_and_no_private_image_to_others(
        tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    layout, _ = cached_busybox(tmp_path / "build")
    docker_tar = tmp_path / "tool.tar"
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}:latest", f"docker-archive:{docker_tar}"], check=True,
                   capture_output=True, timeout=120)
    cluster = up.start(tmp_path / "up", "--worker-runtime", "oci", "--base-images", "busybox", "--max-workers", "1",
                       "--idle-timeout", "300")
    try:
        alice, bob = cluster.user("alice"), cluster.user("bob")
        with cluster.client() as admin:
            admin.create_billing_project("alpha", ["alice"])
            admin.create_billing_project("beta", ["bob"])
        as_alice, as_bob = {"CORRAL_TOKEN": alice}, {"CORRAL_TOKEN": bob}
        before = cluster.cli("images", "ls", "--project", "default")
        assert before.returncode == 0, before.stderr
        assert f"{BUSYBOX}  " in before.stdout and "workers=0" in before.stdout, before.stdout  # nobody holds it yet

        imported = cluster.cli("images", "import", str(docker_tar), "--project", "alpha", "--name", "tool",
                               "--tag", "v1", env=as_alice)
        assert imported.returncode == 0, imported.stderr
        with cluster.client(alice) as client:
            builder = corral.BatchBuilder("alpha")
            builder.add_job(job("busybox"))
            builder.add_job(job("localhost/alpha/tool:v1"))
            batch = client.wait(client.submit(builder).batch_id)
            states = [j.state for j in client.jobs(batch.batch_id)]
            assert states == [job_state_pb2.JOB_STATE_SUCCEEDED] * 2, states

        def busybox_line() -> str | None:
            listed = cluster.cli("images", "ls", "--project", "default")
            assert listed.returncode == 0, listed.stderr
            return next((line for line in listed.stdout.splitlines()
                         if line.startswith(f"{BUSYBOX}  ") and line.endswith("workers=1")), None)

        # The worker tells its driver with its next heartbeat.
        line = up.eventually(busybox_line, what=f"{BUSYBOX} held by 1 worker in corral images ls")
        print(line)
        as_json = json.loads(cluster.cli("images", "ls", "--project", "alpha", "--json", env=as_alice).stdout)
        assert {i["reference"]: i.get("workersHolding") for i in as_json}[
            "localhost/alpha/tool:v1"] == 1

        for args in (("--project", "beta"), ()):
            seen = cluster.cli("images", "ls", *args, env=as_bob)
            assert seen.returncode == 0, seen.stderr
            assert "localhost/alpha" not in seen.stdout and f"{BUSYBOX}  " in seen.stdout, seen.stdout
    finally:
        assert cluster.stop() == 0
