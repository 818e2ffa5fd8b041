"""A worker that dies leaves nothing running and nothing for long: its
containers die with it (their keepers kill them), and the next OCI runtime
to start on the host, under the same name or another, removes what it
left: runc state, mounts and writable layers, cgroups, its bridges,
iptables chains and its attempts' network namespaces and veth pairs. Even a container
whose keeper was killed too is found and killed then."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from services.worker.oci.cgroups import Hierarchies
from services.worker.oci.layer import mounts_under
from services.worker.oci.network import owner_hash
from services.worker.oci.owner import clean_up_dead_owners
from tests.job_processes import processes_marked, processes_marked_soon
from tests.oci.host import CGROUP_ROOT, OciHost, containers, needs_oci, slots_left

pytestmark = [pytest.mark.timeout(60), needs_oci]

REPO = Path(__file__).resolve().parents[2]


async def eventually(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def crashing_worker(oci_host: OciHost, busybox_images: Path, owner: str,
                          mode: str = "NETWORK_MODE_NONE") -> tuple[subprocess.Popen, str]:
    """A worker process running one attempt (sleep 120), once the attempt runs; the attempt's mark."""
    mark = uuid.uuid4().hex
    oci_host.owners.add(owner)  # what it leaves is checked after the test, too
    oci_host.attempts.add((9, 1, "crash"))
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.oci.crashing_worker", str(oci_host.state_root), owner, str(oci_host.scratch),
         str(busybox_images), mark, mode, oci_host.deployment], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        line = await asyncio.to_thread(worker.stdout.readline)  # type: ignore[union-attr]
        assert line == "started\n"
        assert await processes_marked_soon(mark)
    except BaseException:
        worker.kill()  # never left running, with its container, after a failed test
        worker.wait()
        worker.stdout.close()  # type: ignore[union-attr]
        raise
    return worker, mark


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


def left_by(oci_host: OciHost, owner: str, alive: bool = False) -> list[str]:
    """What `owner`'s attempts left (and its bridges and chains, unless a runtime of its name is `alive`)."""
    left = [str(p) for p in mounts_under(oci_host.scratch)]
    for mount in Hierarchies.of_host().all:  # a live runtime has its worker's cgroup: none of an attempt in it
        cgroup = mount / CGROUP_ROOT / oci_host.deployment / owner
        left += [f"cgroup {d}" for d in cgroup.iterdir() if d.is_dir()] if alive and cgroup.is_dir() else []
        left += [f"cgroup {cgroup}"] if not alive and cgroup.exists() else []
    left += [f"record {r.name}" for r in (oci_host.state_root / owner / "attempts").glob("*.json")]
    if not alive:
        h = owner_hash(oci_host.state_root / owner)
        left += [f"bridge crl-{h}-{m}" for m in "pv" if Path("/sys/class/net", f"crl-{h}-{m}").exists()]
        left += [f"iptables {line}" for line in subprocess.run(["iptables-save"], capture_output=True, text=True)
                 .stdout.splitlines() if f"CORRAL-{h}" in line]
    return left + slots_left(owner_hash(oci_host.state_root / owner))  # its attempt's network


@pytest.mark.parametrize("mode", ["NETWORK_MODE_NONE", "NETWORK_MODE_PUBLIC"])
async def test_a_killed_workers_container_dies_and_the_next_runtime_cleans_up(oci_host: OciHost,
                                                                              busybox_images: Path, mode: str) -> None:
    dead = f"test-dead-{uuid.uuid4().hex[:6]}"
    worker, mark = await crashing_worker(oci_host, busybox_images, dead, mode)
    worker.kill()
    worker.wait()
    worker.stdout.close()  # type: ignore[union-attr]
    await eventually(lambda: not processes_marked(mark))  # its keeper killed the container
    left = left_by(oci_host, dead)  # its mounts, cgroup and record are still there; its network too
    assert left
    if mode == "NETWORK_MODE_PUBLIC":
        assert {what.split()[0] for what in left} >= {"bridge", "iptables", "network", "veth"}, left
    # Another worker starts on the host: it cleans up after the dead one.
    runtime = oci_host.runtime()
    assert await runtime.start() == []
    assert left_by(oci_host, dead) == []
    assert not (oci_host.state_root / dead).exists()


async def test_a_restarted_worker_kills_what_even_the_keeper_left_running(oci_host: OciHost,
                                                                          busybox_images: Path) -> None:
    owner = f"test-restart-{uuid.uuid4().hex[:6]}"
    worker, mark = await crashing_worker(oci_host, busybox_images, owner)
    (keeper,) = children(worker.pid)
    for pid in (keeper, worker.pid):  # the keeper first, so that it cannot act
        os.kill(pid, signal.SIGKILL)
    worker.wait()
    worker.stdout.close()  # type: ignore[union-attr]
    await asyncio.sleep(0.3)
    assert processes_marked(mark)  # orphaned, still running
    runtime = oci_host.runtime(owner=owner)  # the same worker, started again
    assert await runtime.start() == []
    assert not processes_marked(mark)
    assert left_by(oci_host, owner, alive=True) == []
    assert [c for kind in ("crun", "runc") for c in containers(oci_host.state_root / owner / kind)] == []


async def test_two_live_runtimes_cannot_share_a_name(oci_host: OciHost) -> None:
    first = oci_host.runtime()
    await first.start()
    second = oci_host.runtime(owner=first.config.owner)
    with pytest.raises(Exception, match="another OCI runtime named"):
        await second.start()


async def test_a_runtime_being_made_or_removed_is_not_taken_for_dead(oci_host: OciHost) -> None:
    """A runtime's directory without its lock is one being made (before its lock) or removed (its release
    removes it, lock and all, while it holds the lock): another runtime's cleanup must not lock it anew and
    clean it up under its owner."""
    half = oci_host.state_root / "half"
    half.mkdir(parents=True)
    try:
        assert await clean_up_dead_owners(oci_host.state_root, CGROUP_ROOT, Hierarchies.of_host(), alive="") == []
        assert half.is_dir() and not (half / "lock").exists()
    finally:
        half.rmdir()
