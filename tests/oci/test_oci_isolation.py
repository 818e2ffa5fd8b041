"""What a job in an OCI container can reach, tried from inside real
containers (acceptance 2): it is PID 1 of its own processes and sees no
other; it runs as an unprivileged uid of its own with no capability,
no_new_privs and a seccomp filter (no user namespace to become root in);
its hostname is the job's; NETWORK_MODE_NONE cannot reach a server on the
host's loopback; its writes stay in its own layer, never in the image nor
in another attempt's view; its secrets are read-only; files in and out go
through its root filesystem, never through a link it made."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.image_tools import Credentials
from services.worker.oci.images import Rootfs
from services.worker.oci.runc import choose, kind_of
from services.worker.runtime_api import SecretVolume
from tests.oci.host import OciHost, fields, needs_oci, run, spec

pytestmark = [pytest.mark.timeout(60), needs_oci]

REPORT = r"""
echo pid=$$
echo uid=$(id -u)
echo gid=$(id -g)
echo groups="$(id -G)"
echo hostname=$(hostname)
echo processes="$(ps -o pid,comm | tail -n +2 | tr '\n' ';')"
echo proc_pids="$(ls /proc | grep -c '^[0-9]')"
grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -d '\t ' | sed 's/:/=/'
echo links="$(ls /sys/class/net | tr '\n' ' ')"
unshare -U true 2>/dev/null && echo user_namespace=made || echo user_namespace=refused
unshare -n true 2>/dev/null && echo net_namespace=made || echo net_namespace=refused
touch /bin/evil 2>/dev/null && echo image_bin=written || echo image_bin=refused
echo mine > /tmp/mark && echo tmp=written
echo home=$HOME
echo cwd=$(pwd)
cat /proc/kcore 2>/dev/null | head -c 1 | wc -c | sed 's/^/kcore_bytes=/'
echo sysrq="$(echo b > /proc/sysrq-trigger 2>&1 && echo written || echo refused)"
"""


async def test_a_job_sees_itself_only_as_an_unprivileged_user(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    outcome, log = await run(runtime, oci_host.job(spec(REPORT)))
    assert outcome.state == "Success", (outcome, log)
    seen = fields(log)
    assert seen["pid"] == "1"  # the job's command is its container's init
    uid = int(seen["uid"])
    assert uid >= 2_000_000_000 and seen["gid"] == str(uid) and seen["groups"] == str(uid)
    assert seen["hostname"] == "job-7-3"
    # Its own processes only: the shell and what it runs now; nothing of the host (the test's Python).
    processes = [p.split() for p in seen["processes"].split(";") if p.strip()]
    assert processes[0] == ["1", "sh"] and len(processes) <= 8, processes
    assert not {p[1] for p in processes} & {"python", "pytest", "runc", "crun", "keeper.py", "systemd", "init"}, \
        processes
    assert int(seen["proc_pids"]) <= 4
    for capabilities in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert int(seen[capabilities], 16) == 0, capabilities
    assert seen["NoNewPrivs"] == "1" and seen["Seccomp"] == "2"  # 2: a filter
    assert seen["links"].split() == ["lo"]
    assert seen["user_namespace"] == "refused" and seen["net_namespace"] == "refused"
    assert seen["image_bin"] == "refused" and seen["tmp"] == "written"
    assert (seen["home"], seen["cwd"]) == ("/io", "/io")
    assert seen["kcore_bytes"] == "0" and seen["sysrq"] == "refused"
    assert f"OCI container ({kind_of(choose('auto')[0] or '')})" in outcome.isolation


def tree_digest(root: Path) -> str:
    """Names, modes, owners, link targets and contents of everything under `root`."""
    digest = hashlib.sha256()
    for top, dirs, files in sorted(os.walk(root)):
        for name in sorted(dirs + files):
            path = os.path.join(top, name)
            st = os.lstat(path)
            digest.update(f"{path} {st.st_mode} {st.st_uid} {st.st_gid}".encode())
            if os.path.islink(path):
                digest.update(os.readlink(path).encode())
            elif os.path.isfile(path):
                digest.update(Path(path).read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("layer", ["overlayfs", "copy"])
async def test_writes_stay_in_the_attempts_own_layer(oci_host: OciHost, busybox_images: Path, layer: str) -> None:
    """Two attempts of one image at once: neither sees the other's writes, and the image is unchanged,
    whether the writable layer is an overlay or a copy."""
    image = busybox_images / "busybox" / "rootfs"
    before = tree_digest(image)
    runtime = oci_host.runtime(layer=layer)
    first = run(runtime, oci_host.job(spec(
        "echo first > /tmp/shared; echo x > /tmp/only-first; sleep 1; echo saw=$(cat /tmp/shared)"), "a1", job_id=1))
    second = run(runtime, oci_host.job(spec(
        "sleep 0.4; echo saw_first=$(ls /tmp/only-first 2>&1 | grep -c 'No such'); echo second > /tmp/shared; "
        "echo saw=$(cat /tmp/shared)"), "a2", job_id=2))
    (one, log_one), (two, log_two) = await asyncio.gather(first, second)
    assert (one.state, two.state) == ("Success", "Success"), (log_one, log_two)
    assert fields(log_one)["saw"] == "first"
    assert fields(log_two) == {"saw_first": "1", "saw": "second"}
    assert tree_digest(image) == before
    assert not (image / "tmp" / "shared").exists()


async def test_network_none_cannot_reach_a_server_on_the_hosts_loopback(oci_host: OciHost) -> None:
    connections = 0

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(count, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        # The job's loopback works (its own), and the host's port is not there.
        script = (f"nc -w 2 127.0.0.1 {port} </dev/null && echo host=reached || echo host=unreachable; "
                  "nc -l -p 9000 -e echo pong & sleep 0.2; echo own=$(nc -w 2 127.0.0.1 9000 </dev/null); "
                  "echo routes=$(ip route | wc -l)")
        outcome, log = await run(oci_host.runtime(), oci_host.job(spec(script)))
    finally:
        server.close()
        await server.wait_closed()
    assert outcome.state == "Success", log
    assert fields(log) == {"host": "unreachable", "own": "pong", "routes": "0"}
    assert connections == 0


async def test_secrets_are_the_jobs_to_read_and_nobody_can_change_them(oci_host: OciHost, tmp_path: Path) -> None:
    job_spec = spec("echo token=$(cat /run/secrets/db/token); echo mode=$(stat -c %A /run/secrets/db/token); "
                    "echo owner=$(stat -c %u /run/secrets/db/token); echo uid=$(id -u); "
                    "echo x > /run/secrets/db/token 2>/dev/null && echo write=done || echo write=refused; "
                    "touch /run/secrets/db/new 2>/dev/null && echo create=done || echo create=refused",
                    secrets=[js.SecretMount(name="db", mount_path="/run/secrets/db")])
    delivered = {"token": b"s3cr3t"}
    job = oci_host.job(job_spec, secrets=(SecretVolume("db", "/run/secrets/db", delivered),))
    outcome, log = await run(oci_host.runtime(), job)
    assert outcome.state == "Success", log
    seen = fields(log)
    assert "write" in seen, log
    assert (seen["token"], seen["mode"], seen["owner"]) == ("s3cr3t", "-r--------", seen["uid"])
    assert (seen["write"], seen["create"]) == ("refused", "refused")
    assert delivered == {"token": b"s3cr3t"}


async def test_a_secret_the_worker_was_not_given_is_an_error(oci_host: OciHost) -> None:
    job_spec = spec("true", secrets=[js.SecretMount(name="db", mount_path="/run/secrets/db")])
    outcome, _ = await run(oci_host.runtime(), oci_host.job(job_spec))
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert outcome.error_message == "secrets: the worker was not given the secrets db"


async def test_files_in_and_out_go_through_the_root_filesystem(oci_host: OciHost, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("hello\n")
    target = tmp_path / "out" / "result.txt"
    job_spec = spec("echo owner=$(stat -c %u /data/in.txt); echo dir=$(stat -c %u /data); "
                    "tr a-z A-Z < /data/in.txt > /io/result.txt",
                    input_files=[js.InputFile(from_url=f"file://{source}", to_path="/data/in.txt")],
                    output_files=[js.OutputFile(from_path="/io/result.txt", to_url=f"file://{target}")])
    outcome, log = await run(oci_host.runtime(), oci_host.job(job_spec))
    assert outcome.state == "Success", (outcome, log)
    seen = fields(log)
    assert seen["owner"] == seen["dir"] != "0"  # the input and the directory made for it: the job's
    assert target.read_text() == "HELLO\n"


async def test_an_output_that_is_a_link_is_not_followed(oci_host: OciHost, tmp_path: Path) -> None:
    target = tmp_path / "stolen"
    job_spec = spec("ln -s /etc/passwd /io/result.txt",
                    output_files=[js.OutputFile(from_path="/io/result.txt", to_url=f"file://{target}")])
    outcome, _ = await run(oci_host.runtime(), oci_host.job(job_spec))
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert "symbolic link" in outcome.error_message and not target.exists()


async def test_always_copy_outputs_copies_what_a_failed_container_left(oci_host: OciHost, tmp_path: Path) -> None:
    made, never = tmp_path / "out" / "made.txt", tmp_path / "out" / "never.txt"
    outputs = [js.OutputFile(from_path="/io/made.txt", to_url=f"file://{made}"),
               js.OutputFile(from_path="/io/never.txt", to_url=f"file://{never}")]
    job_spec = spec("echo partial > /io/made.txt; exit 3", output_files=outputs, always_copy_outputs=True)
    outcome, log = await run(oci_host.runtime(), oci_host.job(job_spec))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 3), (outcome, log)
    assert outcome.error_message == "exited with code 3"
    assert made.read_text() == "partial\n" and not never.exists()


class CachedImages:
    """An image cache's layout: the root filesystem in a directory named by its digest."""

    def __init__(self, directory: Path):
        self.directory = directory

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        return Rootfs(image, "sha256:ab,c", self.directory)

    async def release(self, rootfs: Rootfs) -> None:
        pass


async def test_an_image_directory_named_by_its_digest(oci_host: OciHost, busybox_images: Path,
                                                      tmp_path: Path) -> None:
    """':' and ',' separate overlayfs's options: a directory named 'sha256:…' is given escaped."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "sha256:ab,c").symlink_to(busybox_images / "busybox" / "rootfs")
    runtime = oci_host.runtime(layer="overlayfs", rootfs=CachedImages(cache / "sha256:ab,c"))
    outcome, log = await run(runtime, oci_host.job(spec("echo > /tmp/x && echo ok=$(ls /bin/busybox)")))
    assert (outcome.state, fields(log)) == ("Success", {"ok": "/bin/busybox"})


@pytest.mark.parametrize("layer", ["overlayfs", "copy"])
async def test_the_worker_never_uses_an_images_device_node_or_fifo(oci_host: OciHost, busybox_images: Path,
                                                                   tmp_path: Path, layer: str) -> None:
    """An image may ship a device node (to the worker, root on the host, it would be the host's device)
    or a FIFO (a copy into it would hang): inputs and outputs there are refused, nothing is opened."""
    image = tmp_path / "odd-image"
    shutil.copytree(busybox_images / "busybox" / "rootfs", image, symlinks=True)
    (image / "data").mkdir(mode=0o755)
    os.mknod(image / "data" / "device", 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers
    os.mkfifo(image / "data" / "fifo")
    source = tmp_path / "in.txt"
    source.write_text("data\n")
    runtime = oci_host.runtime(layer=layer, rootfs=CachedImages(image))
    for i, target in enumerate(("/data/device", "/data/fifo")):
        job_spec = spec("true", input_files=[js.InputFile(from_url=f"file://{source}", to_path=target)])
        outcome, _ = await run(runtime, oci_host.job(job_spec, f"in{i}"))
        assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
        assert outcome.error_message.startswith("input files: copying input files failed"), outcome.error_message
    job_spec = spec("true", output_files=[js.OutputFile(from_path="/data/device", to_url=f"file://{tmp_path}/o")])
    outcome, _ = await run(runtime, oci_host.job(job_spec, "out"))
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert "Permission denied" in outcome.error_message and not (tmp_path / "o").exists()
