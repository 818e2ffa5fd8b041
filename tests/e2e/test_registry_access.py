"""Issue 33 part 5 on a real `corral up --worker-runtime oci`: only corral writes the registry it runs.

The attack: as `nobody`, a local user pushed a modified `busybox` to `corral up`'s registry, and 45 s
later another tenant's `echo` printed the attacker's text. Here `nobody` and an account that does not
even exist (uid 4242) try, with skopeo, on every port a registry process of `corral up` listens on:
to push the attacker's busybox, to read the image, to list the repositories, and to read the logins
in the data directory; every try is refused. Then the quickstart's busybox job still runs corral's
busybox (its digest the seed's), which corral's own pull (the worker, with the pull login the driver
handed it) fetched. docs/security.md: the actor table's "another local account" row, and "What must
not happen": a local account writes the image other tenants' jobs run."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2
from services.registry.seed import cached_busybox
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster
from tests.oci.host import WHY_NOT

pytestmark = [pytest.mark.timeout(400), pytest.mark.usefixtures("host_ip_forwarding"),
              pytest.mark.skipif(os.geteuid() != 0, reason="switching to other accounts is root's")]

OTHER_ACCOUNTS = {"nobody": 65534, "uid 4242": 4242}
"""Who tries: an account of the system, and a uid no account has."""
ATTACKER_TEXT = "pwned by a local account"


def listening_ports(pid: int) -> set[int]:
    """The TCP ports process `pid` listens on (from /proc: its socket inodes in the listening table)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def registry_ports(cluster: Cluster) -> dict[int, list[str]]:
    """Every port a registry process of this `corral up` listens on, and its argv."""
    found = {}
    for pid, argv in up.processes().items():
        if pid in cluster.descendants() and any("docker-registry" in a for a in argv):
            for port in listening_ports(pid):
                found[port] = argv
    return found


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    yield from up.running(up.start(tmp_path_factory.mktemp("registry-access"), "--worker-runtime", "oci"))


@pytest.fixture(scope="module")
def attackers_image() -> Iterator[Path]:
    """The attacker's busybox: corral's, with /bin/sh replaced by a script that prints ATTACKER_TEXT, in an OCI
    layout any account may read (a directory of /tmp, removed afterwards)."""
    work = Path(tempfile.mkdtemp(prefix="corral-attacker-", dir="/tmp"))
    try:
        layout, _ = cached_busybox(work / "build")
        rootfs = work / "rootfs" / "bin"
        rootfs.mkdir(parents=True)
        (rootfs / "sh").write_text(f"#!/bin/busybox sh\necho '{ATTACKER_TEXT}'\n")
        (rootfs / "sh").chmod(0o755)
        subprocess.run(["umoci", "insert", "--image", f"{layout}:latest", str(work / "rootfs" / "bin" / "sh"),
                        "/bin/sh"], check=True, capture_output=True)
        for path in [work, *work.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o644)
        yield layout
    finally:
        shutil.rmtree(work, ignore_errors=True)


def as_account(uid: int, argv: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """Run `argv` as `uid` (its own group, no other), with a home of its own."""
    return subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                           "env", "-i", f"HOME={home}", f"TMPDIR={home}", "PATH=/usr/bin:/bin", *argv],
                          capture_output=True, text=True, timeout=120)


def test_no_other_local_account_can_push_read_or_list_corrals_registry(cluster: Cluster,
                                                                       attackers_image: Path) -> None:
    ports = registry_ports(cluster)
    assert len(ports) == 2, ports  # the workers' (read-only) and the one only corral up pushes to
    home = Path(tempfile.mkdtemp(prefix="corral-home-", dir="/tmp"))
    home.chmod(0o1777)
    try:
        for who, uid in OTHER_ACCOUNTS.items():
            for port in ports:
                pushed = as_account(uid, ["skopeo", "copy", "--dest-tls-verify=false", f"oci:{attackers_image}:latest",
                                          f"docker://127.0.0.1:{port}/docker.io/library/busybox:latest"], home)
                assert pushed.returncode != 0, f"{who} pushed to port {port}"
                assert "authentication required" in pushed.stderr, pushed.stderr
                read = as_account(uid, ["skopeo", "inspect", "--raw", "--tls-verify=false",
                                        f"docker://127.0.0.1:{port}/docker.io/library/busybox:latest"], home)
                assert read.returncode != 0 and "authentication required" in read.stderr, read.stderr
                with pytest.raises(urllib.error.HTTPError) as listing:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/_catalog", timeout=10)
                listing.value.close()  # its response holds the socket, which would warn when collected
                assert listing.value.code == 401
            for login in ("pull.json", "push.json", "pull.htpasswd", "push.htpasswd"):
                stolen = as_account(uid, ["cat", str(cluster.data_dir / "registry" / "logins" / login)], home)
                assert stolen.returncode != 0 and "Permission denied" in stolen.stderr, (who, login)
            for copy in ("driver/registry-login.json", "frontend/registry-push-login.json"):  # the services' copies
                assert (cluster.data_dir / "certs" / copy).is_file(), copy
                stolen = as_account(uid, ["cat", str(cluster.data_dir / "certs" / copy)], home)
                assert stolen.returncode != 0 and "Permission denied" in stolen.stderr, (who, copy)
    finally:
        shutil.rmtree(home, ignore_errors=True)

    # Another tenant's job still runs corral's busybox, which the worker pulled with corral's own login.
    builder = corral.BatchBuilder("default", attributes={"test": "registry-access"})
    builder.add_job(job_spec_pb2.JobSpec(image="busybox", script="echo hello from the seed busybox",
                                         network_mode=job_spec_pb2.NETWORK_MODE_NONE))
    with cluster.client(cluster.user("tenant")) as client:
        batch = client.submit(builder)
        done = client.wait(batch.batch_id)
        job = client.get_job(batch.batch_id, 1)
        assert done.counts.n_succeeded == 1, job.attempts[-1].error_message
        assert client.job_log(batch.batch_id, 1).decode() == "hello from the seed busybox\n"
    seeded = next(line for line in cluster.output if "registry: seeded" in line)
    assert seeded.strip().split("(")[-1].rstrip(")") in job.attempts[-1].isolation  # the seed's digest ran


def test_an_image_reference_cannot_make_a_worker_probe_the_host(cluster: Cluster) -> None:
    """Issue 33 part 6 on the same `corral up`: the issue's three probes (the host's ssh port, a TLS port on
    loopback, the metadata server) are INVALID_ARGUMENT at submission, naming `jobs[0].image`; a pull that
    fails tells the user corral's words ("no such image"), never the registry's address or skopeo's."""
    registry = cluster.endpoints["registry"].removeprefix("http://")
    with cluster.client() as client:
        for image in ("127.0.0.1:22/x", "127.0.0.1:18443/x", "169.254.169.254/latest/meta-data"):
            builder = corral.BatchBuilder("default", attributes={"test": "probe"})
            builder.add_job(job_spec_pb2.JobSpec(image=image, script="true"))
            with pytest.raises(corral.InvalidArgument) as refused:
                client.submit(builder)
            [violation] = refused.value.field_violations
            assert violation.field == "jobs[0].image", violation
            assert "is a loopback address" in violation.description or "metadata" in violation.description
        assert not [b for b in client.list_batches() if b.attributes.get("test") == "probe"]

        builder = corral.BatchBuilder("default", attributes={"test": "missing-tag"})
        builder.add_job(job_spec_pb2.JobSpec(image="localhost/default/tool:no-such-tag", script="true",
                                             network_mode=job_spec_pb2.NETWORK_MODE_NONE))
        batch = client.submit(builder)
        client.wait(batch.batch_id)
        error = client.get_job(batch.batch_id, 1).attempts[-1].error_message
    assert error == "image: could not get 'localhost/default/tool:no-such-tag': no such image", error
    shown = cluster.cli("job", str(batch.batch_id), "1")
    assert "could not get 'localhost/default/tool:no-such-tag': no such image" in shown.stdout, \
        shown.stdout + shown.stderr
    assert registry not in shown.stdout and "manifest unknown" not in shown.stdout
