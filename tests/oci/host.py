"""What the OCI runtime's tests share: real runc, as root.

A busybox root filesystem is built once per session from Debian's
busybox-static (`BusyboxImages` serves it as the image 'busybox'). Every test
gets `oci_host`: its own state root and scratch directory, and runtimes of
owner names of its own in a deployment of its own; after the test it
closes them and checks that nothing the test made is left (acceptance 4):
no runc container in their state, no cgroup under their names or their
deployment's in any hierarchy, no mount under the test's directory, no
attempt's oci/ directory (writable layer, bundle), no bridge or iptables
chain or rule of theirs, no network namespace or veth of their attempt
networks (named after their owners: others' tests may be running theirs
on the host meanwhile)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.logs import LogSink
from services.worker.oci import OciRuntime, OciRuntimeConfig
from services.worker.oci.cgroups import Hierarchies
from services.worker.image_tools import Credentials
from services.worker.oci.images import DirectoryRootfs, ImageUnavailable, Rootfs, RootfsSource
from services.worker.oci.layer import mounts_under
from services.worker.oci.network import NETNS_DIR, owner_hash
from services.worker.oci.slots import slot_of
from services.worker.oci.owner import clean_up_dead_owners
from services.worker.oci.runc import choose
from services.worker.runtime_api import JobOutcome, JobRun

BUSYBOX = "/bin/busybox"
CGROUP_ROOT = "corral"


def _why_not() -> str:
    if os.geteuid() != 0:
        return "the OCI runtime runs containers as root"
    if why_not := choose("auto")[1]:
        return "; ".join(why_not)
    if not os.path.exists(BUSYBOX) or b"/ld-linux" in Path(BUSYBOX).read_bytes()[:4096]:
        return "the test image needs Debian's busybox-static (a statically linked /bin/busybox)"
    return ""


WHY_NOT = _why_not()


needs_oci = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)


def build_busybox_images(images: Path) -> Path:
    """`images`, a directory of images for DirectoryRootfs, with 'busybox': busybox-static, its applets as
    links in /bin, /etc/passwd and /etc/group, /tmp 1777."""
    images.mkdir(exist_ok=True)
    images.chmod(0o755)
    root = images / "busybox" / "rootfs"
    for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
        (root / d).mkdir(parents=True)
    for d in (images / "busybox", root, *(root / x for x in ("bin", "etc", "proc", "sys", "dev"))):
        d.chmod(0o755)
    (root / "tmp").chmod(0o1777)
    (root / "root").chmod(0o700)
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    applets = subprocess.run([BUSYBOX, "--list"], capture_output=True, text=True, check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
    (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
    for f in ("passwd", "group"):
        (root / "etc" / f).chmod(0o644)
    return images


class BusyboxImages:
    """The session's busybox root filesystem as the image 'busybox' (a digest of its busybox binary);
    any other image is not there, as a registry would say. Counts what is held."""

    def __init__(self, images: Path):
        self._directory = DirectoryRootfs(images)
        self._digest = "sha256:" + hashlib.sha256(Path(BUSYBOX).read_bytes()).hexdigest()
        self.held = 0

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        if image != "busybox":
            raise ImageUnavailable(f"manifest unknown: {image}")
        rootfs = await self._directory.acquire(image)
        self.held += 1
        return Rootfs(image, self._digest, rootfs.path, rootfs.config)

    async def release(self, rootfs: Rootfs) -> None:
        self.held -= 1


@dataclass
class OciHost:
    """One test's corner of the host: runtimes made here are closed and checked after the test."""

    dir: Path
    images: BusyboxImages
    runtimes: list[OciRuntime] = field(default_factory=list)
    owners: set[str] = field(default_factory=set)
    deployment: str = field(default_factory=lambda: f"test-{uuid.uuid4().hex[:8]}")
    """The test's deployment: the cgroup level of its runtimes' (each writes its process cap)."""
    attempts: set[tuple[int, int, str]] = field(default_factory=set)
    """(batch, job, attempt) of every JobRun the test made here, whose namespaces are looked for after it."""

    @property
    def state_root(self) -> Path:
        return self.dir / "state"

    @property
    def scratch(self) -> Path:
        return self.dir / "scratch"

    def runtime(self, owner: str | None = None, rootfs: RootfsSource | None = None, **settings) -> OciRuntime:
        """An OCI runtime of this test (an owner name of its own unless given; the busybox images unless
        another source is given)."""
        owner = owner or f"test-{uuid.uuid4().hex[:8]}"
        settings.setdefault("kill_grace_s", 2.0)
        settings.setdefault("deployment", self.deployment)
        runtime = OciRuntime(OciRuntimeConfig(rootfs or self.images, owner=owner, state_root=self.state_root,
                                              cgroup_root=CGROUP_ROOT, **settings))
        self.runtimes.append(runtime)
        self.owners.add(owner)
        return runtime

    def job(self, spec: js.JobSpec, attempt_id: str = "a1", memory_bytes: int = 32 * 2**20, cores_mcpu: int = 1000,
            job_id: int = 3, **fields) -> JobRun:
        self.attempts.add((7, job_id, attempt_id))
        return JobRun(batch_id=7, job_id=job_id, attempt_id=attempt_id, spec=spec, cores_mcpu=cores_mcpu,
                      memory_bytes=memory_bytes, scratch=self.scratch, **fields)

    async def clean_up(self) -> None:
        """Remove what the test's runtimes left (all closed or dead by now), as a worker starting on the host
        would."""
        await clean_up_dead_owners(self.state_root, CGROUP_ROOT, Hierarchies.of_host(), alive="")

    def leftovers(self) -> list[str]:
        """What the test's runtimes left on the host."""
        left = []
        for owner in sorted(self.owners):
            for kind in ("crun", "runc"):
                left += [f"{kind} container {c}" for c in containers(self.state_root / owner / kind)]
            left += [f"cgroup {mount}/{CGROUP_ROOT}/{self.deployment}/{owner}" for mount in Hierarchies.of_host().all
                     if (mount / CGROUP_ROOT / self.deployment / owner).exists()]
            if (self.state_root / owner).exists():
                left.append(f"state directory {self.state_root / owner}")
            h = owner_hash(self.state_root / owner)
            left += [f"bridge crl-{h}-{m}" for m in "pv" if Path("/sys/class/net", f"crl-{h}-{m}").exists()]
            rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
            left += [f"iptables rule or chain {line}" for line in rules.splitlines() if f"CORRAL-{h}" in line]
            left += slots_left(h)
        left += [f"cgroup {mount}/{CGROUP_ROOT}/{self.deployment}" for mount in Hierarchies.of_host().all
                 if (mount / CGROUP_ROOT / self.deployment).exists()]
        left += [f"mount {point}" for point in mounts_under(self.dir)]
        left += [f"attempt directory {d}" for d in self.scratch.glob("*/oci")]
        if self.images.held:
            left.append(f"{self.images.held} images not released")
        return left


def containers(runtime_root: Path) -> list[str]:
    """The containers in a runtime's state directory (its kind is the directory's name: crun or runc)."""
    if not runtime_root.exists():
        return []
    return subprocess.run([runtime_root.name, "--root", str(runtime_root), "list", "-q"], capture_output=True,
                          text=True, check=True).stdout.split()


def slots_left(owner_hash: str) -> list[str]:
    """The attempt networks (network namespaces, veth ends) of the owner hashed to `owner_hash` on the host."""
    netns = sorted(n for n in os.listdir(NETNS_DIR) if slot_of(owner_hash, n)) if NETNS_DIR.is_dir() else []
    veths = sorted(n for n in os.listdir("/sys/class/net") if slot_of(owner_hash, n))
    return [f"network namespace {n}" for n in netns] + [f"veth {n}" for n in veths]


def spec(script: str = "", *argv: str, **fields) -> js.JobSpec:
    """A busybox job with no network."""
    fields.setdefault("network_mode", js.NETWORK_MODE_NONE)
    out = js.JobSpec(image="busybox", **fields)
    if argv:
        out.argv.args.extend(argv)
    else:
        out.script = script
    return out


async def run(runtime: OciRuntime, job: JobRun,
              on_started: Callable[[int], Awaitable[None]] | None = None) -> tuple[JobOutcome, str]:
    """Run the attempt to its end: its outcome and its log."""
    async def nothing(pid: int) -> None:
        pass

    log = LogSink(job.log_path)
    outcome = await runtime.run(job, log, on_started or nothing)
    return outcome, log.read().decode(errors="replace")


def start(runtime: OciRuntime, job: JobRun) -> tuple[asyncio.Task[JobOutcome], LogSink, asyncio.Event]:
    """Run the attempt in a task; its log, and an event set once it started."""
    log = LogSink(job.log_path)
    started = asyncio.Event()

    async def on_started(pid: int) -> None:
        started.set()

    return asyncio.create_task(runtime.run(job, log, on_started)), log, started


def fields(log: str) -> dict[str, str]:
    """`key=value` lines of a job's output."""
    return dict(line.split("=", 1) for line in log.splitlines() if "=" in line)
