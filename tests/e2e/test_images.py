"""Issue 35, acceptance 2, on a real `corral up --worker-runtime oci`: `corral images`.

An image made in the test (corral's busybox, copied by skopeo into a `docker save` archive and into an
OCI layout tarball) is imported through the CLI into billing project alpha, as a member of alpha; `ls`
shows it with its digest; a member of beta cannot import into alpha, list alpha's images, nor run a job
of alpha's image (refused at submission, naming jobs[0].image, nothing written), while a member of alpha
runs one in a container of it; `rm` deletes it and a second `rm` is NOT_FOUND. Archives that are not an
image (garbage, more layers than allowed) are INVALID_ARGUMENT and leave no tag behind. And the
registry's address, which users name, is the same after `corral up` restarts on its data directory.
"""

from __future__ import annotations

import base64
import io
import json
import os
import ssl
import subprocess
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from services.registry.seed import cached_busybox
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster
from tests.oci.host import WHY_NOT

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("host_ip_forwarding")]


def archive(layout: Path, target: Path, transport: str) -> Path:
    """The busybox layout as an archive skopeo writes (`docker-archive` or `oci-archive`)."""
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}:latest", f"{transport}:{target}"], check=True,
                   capture_output=True, timeout=120)
    return target


def job(image: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image=image, script="echo ran in $(cat /etc/hostname 2>/dev/null || hostname)",
                                max_attempts=1, network_mode=job_spec_pb2.NETWORK_MODE_NONE)


def batches(cluster: Cluster) -> int:
    return int(cluster.query("SELECT COUNT(*) AS n FROM batches")[0]["n"])


def test_a_project_imports_lists_runs_and_removes_its_image_and_no_other_project_can(tmp_path: Path) -> None:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    layout, _ = cached_busybox(tmp_path / "build")
    docker_tar = archive(layout, tmp_path / "tool.tar", "docker-archive")
    oci_tar = archive(layout, tmp_path / "tool-oci.tar", "oci-archive")
    work = tmp_path / "up"
    work.mkdir()
    cluster = up.start(work, "--worker-runtime", "oci")
    try:
        registry = cluster.endpoints["registry"].removeprefix("http://")
        alice, bob = cluster.user("alice"), cluster.user("bob")
        with cluster.client() as admin:
            admin.create_billing_project("alpha", ["alice"])
            admin.create_billing_project("beta", ["bob"])
        as_alice, as_bob = {"CORRAL_TOKEN": alice}, {"CORRAL_TOKEN": bob}

        imported = cluster.cli("images", "import", str(docker_tar), "--project", "alpha", "--name", "tool",
                               "--tag", "v1", "--json", env=as_alice)
        assert imported.returncode == 0, imported.stderr
        [image] = json.loads(imported.stdout)
        assert image["reference"] == "localhost/alpha/tool:v1" and image["digest"].startswith("sha256:")
        oci = cluster.cli("images", "import", str(oci_tar), "--project", "alpha", "--name", "tool", "--tag", "oci",
                          env=as_alice)
        assert oci.returncode == 0, oci.stderr
        assert "localhost/alpha/tool:oci" in oci.stdout

        listed = cluster.cli("images", "ls", "--project", "alpha", env=as_alice)
        assert listed.returncode == 0, listed.stderr
        assert f"localhost/alpha/tool:v1  {image['digest']}" in listed.stdout
        assert "localhost/alpha/tool:oci" in listed.stdout

        # Another project's member: no import into alpha, no listing of it (alpha is "not found" to them).
        intruder = cluster.cli("images", "import", str(docker_tar), "--project", "alpha", "--name", "tool",
                               "--tag", "v1", env=as_bob)
        assert intruder.returncode == 5 and "no billing project alpha" in intruder.stderr
        peek = cluster.cli("images", "ls", "--project", "alpha", env=as_bob)
        assert peek.returncode == 5 and "no billing project alpha" in peek.stderr
        assert "alpha" not in cluster.cli("images", "ls", env=as_bob).stdout

        # Bad archives: refused, saying why; nothing is tagged.
        (tmp_path / "junk.tar").write_bytes(b"not a tar at all" * 100)
        junk = cluster.cli("images", "import", str(tmp_path / "junk.tar"), "--project", "alpha", "--name", "junk",
                           env=as_alice)
        assert junk.returncode == 4 and "not a tar archive" in junk.stderr
        # Refused on its header while 16 MiB are still being sent: the refusal, not grpcio's INTERNAL, is what
        # the user reads (the client asks again with the header alone: grpc/grpc#36066).
        big = tmp_path / "big.tar"
        big.write_bytes(docker_tar.read_bytes() + bytes(16 << 20))
        for archive_file in (docker_tar, big, big):
            bad_name = cluster.cli("images", "import", str(archive_file), "--project", "alpha", "--name", "Tool",
                                   env=as_alice)
            assert bad_name.returncode == 4 and bad_name.stderr.startswith("error: --name: "), bad_name.stderr
        assert "junk" not in cluster.cli("images", "ls", "--project", "alpha", env=as_alice).stdout

        # Running it: alpha's member may, by either name of the registry; beta's may not (nothing written).
        private = f"{registry}/alpha/tool:v1"
        before = batches(cluster)
        for name in (private, "localhost/alpha/tool:v1"):
            with cluster.client(bob) as client:
                builder = corral.BatchBuilder("beta")
                builder.add_job(job(name))
                with pytest.raises(corral.errors.PermissionDenied) as refused:
                    client.submit(builder)
            assert "jobs[0].image" in str(refused.value) and "billing project alpha" in str(refused.value)
        assert batches(cluster) == before
        with cluster.client(alice) as client:
            builder = corral.BatchBuilder("alpha")
            builder.add_job(job(private))
            builder.add_job(job("localhost/alpha/tool:v1"))
            batch = client.wait(client.submit(builder).batch_id)
            for ran in client.jobs(batch.batch_id):
                log = client.job_log(batch.batch_id, ran.job_id).decode()
                assert ran.state == job_state_pb2.JOB_STATE_SUCCEEDED, (ran, log)
                assert "ran in" in log

        removed = cluster.cli("images", "rm", "localhost/alpha/tool:v1", env=as_alice)
        assert removed.returncode == 0, removed.stderr
        again = cluster.cli("images", "rm", "localhost/alpha/tool:v1", env=as_alice)
        assert again.returncode == 5 and "has no image localhost/alpha/tool:v1" in again.stderr
        left = cluster.cli("images", "ls", "--project", "alpha", env=as_alice).stdout
        assert "localhost/alpha/tool:v1" not in left
        assert "localhost/alpha/tool:oci" in left  # the same digest, another tag: kept
    finally:
        assert cluster.stop() == 0

    again = up.start(work, "--worker-runtime", "oci")
    try:
        assert again.endpoints["registry"] == f"http://{registry}"
        listed = again.cli("images", "ls", "--project", "alpha")
        assert "localhost/alpha/tool:oci" in listed.stdout, listed.stderr
    finally:
        assert again.stop() == 0


def rest(cluster: Cluster, method: str, path: str, body: object | None = None) -> tuple[int, dict]:
    """METHOD https://GATEWAY/PATH as the administrator, verifying the gateway with DATA/ca.pem."""
    context = ssl.create_default_context(cafile=cluster.endpoints["ca_cert"])
    request = urllib.request.Request(f"https://{cluster.endpoints['gateway']}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"Authorization": f"Bearer {cluster.admin_token}",
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, context=context, timeout=120) as answer:  # noqa: S310 - the test's
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.mark.timeout(300)
def test_the_rest_api_imports_lists_and_deletes_through_the_gateway(tmp_path: Path) -> None:
    """Through the public gateway's REST transcoding: ImportImage takes a JSON array of its messages (the
    header, then the archive's chunks in base64), ListImages and DeleteImage are plain routes; and gRPC
    through the gateway takes an archive larger than the gateway's request limit (4 MiB), which REST cannot."""
    layout, _ = cached_busybox(tmp_path / "build")
    docker_tar = archive(layout, tmp_path / "tool.tar", "docker-archive")
    data = docker_tar.read_bytes()
    cluster = up.start(tmp_path / "up", "--gateway", "--gateway-port", "0", "--internal-gateway-port", "0")
    try:
        chunks = [{"chunk": base64.b64encode(data[i:i + (1 << 20)]).decode()} for i in range(0, len(data), 1 << 20)]
        status, answer = rest(cluster, "POST", "/api/v1/image-imports",
                              [{"header": {"billingProject": "default", "name": "rest", "tag": "v1"}}, *chunks])
        assert status == 200, answer
        assert answer["image"]["reference"] == "localhost/default/rest:v1"
        status, listed = rest(cluster, "GET", "/api/v1/billing-projects/default/images")
        references = [i["reference"] for i in listed["images"]]
        # The project's own images first, then the base images everyone may run.
        assert status == 200 and references[0] == "localhost/default/rest:v1", references
        assert "docker.io/library/busybox:latest" in references[1:], references
        assert listed["images"][0]["digest"] == answer["image"]["digest"]
        status, _ = rest(cluster, "DELETE", "/api/v1/billing-projects/default/images/rest/tags/v1")
        assert status == 200
        status, refused = rest(cluster, "DELETE", "/api/v1/billing-projects/default/images/rest/tags/v1")
        assert status == 404 and "no image localhost/default/rest:v1" in refused["message"]

        # gRPC through the gateway: a 6 MiB archive (busybox and a layer of noise) is not held to its 4 MiB.
        big = tmp_path / "big.tar"
        with tarfile.open(big, "w") as tar, tarfile.open(docker_tar) as small:
            for member in small:
                tar.addfile(member, small.extractfile(member) if member.isfile() else None)
            noise = tarfile.TarInfo("noise.bin")
            noise.size = 6 << 20
            tar.addfile(noise, io.BytesIO(os.urandom(noise.size)))
        imported = cluster.cli("images", "import", str(big), "--project", "default", "--name", "big")
        assert imported.returncode == 0, imported.stderr
    finally:
        assert cluster.stop() == 0
