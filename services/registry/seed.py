"""The images corral seeds its registry with, built from Debian packages, offline.

`busybox:latest` is Debian's static busybox (`busybox-static`) in an otherwise empty root
filesystem: `/bin/busybox`, a symbolic link to it for each applet where busybox itself would install
it (`busybox --list-full`: `/bin/sh`, `/usr/bin/env`, `/sbin/ifconfig`...), `/tmp` (1777), `/root`,
and an `/etc/passwd` and `/etc/group` that know root and nobody. It is built with umoci (`init`,
`new`, `insert`, `config`: `Cmd ["/bin/sh"]`, a standard `PATH`) with every timestamp fixed, so the
same busybox binary always makes the same image digest.

Seeding is cheap when nothing changed, as at each `corral up` after the first: the built layout is
kept in a cache directory with a stamp (the busybox binary's sha256 and the recipe's version) and
built again only when either changes, and it is pushed (`skopeo copy`) only when the registry's tag
does not already name that digest (`skopeo inspect --raw`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

from services.common.registry_logins import Credentials, auth_file

BUSYBOX = Path("/bin/busybox")
RECIPE_VERSION = 1
"""Changes whenever the recipe below changes what it builds (so cached layouts are rebuilt)."""
FIXED_TIME = "1970-01-01T00:00:00Z"
"""Every timestamp in the image: the digest depends on the contents only."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOL_TIMEOUT_S = 120.0
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"


@dataclasses.dataclass(frozen=True)
class Seeded:
    """One image in the registry after seeding."""

    reference: str
    """`host:port/docker.io/library/busybox:latest`."""
    digest: str
    """Its manifest digest."""
    pushed: bool
    """Whether this seeding pushed it (False: the registry had it already)."""


def _run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def _is_static(binary: Path) -> bool:
    """Whether an ELF executable has no program interpreter (PT_INTERP), i.e. needs no libc."""
    with open(binary, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return True  # not 64-bit little-endian ELF: do not guess
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from("<I", table, i * phentsize)[0] != 3 for i in range(phnum))


def _busybox_rootfs(rootfs: Path) -> None:
    if not BUSYBOX.exists() or not _is_static(BUSYBOX):
        raise RuntimeError(f"{BUSYBOX} is missing or not static: install busybox-static (scripts/setup.sh does)")
    for directory in ("bin", "sbin", "usr/bin", "usr/sbin", "etc", "root", "tmp"):
        (rootfs / directory).mkdir(parents=True, exist_ok=True)
    shutil.copyfile(BUSYBOX, rootfs / "bin/busybox")
    (rootfs / "bin/busybox").chmod(0o755)
    for applet in _run([str(BUSYBOX), "--list-full"]).split():
        if "/" in applet and applet != "bin/busybox":
            (rootfs / applet).symlink_to("/bin/busybox")
    (rootfs / "etc/passwd").write_text(PASSWD)
    (rootfs / "etc/group").write_text(GROUP)
    for path, mode in (("etc/passwd", 0o644), ("etc/group", 0o644), ("root", 0o700), ("tmp", 0o1777),
                       ("bin", 0o755), ("sbin", 0o755), ("usr", 0o755), ("usr/bin", 0o755), ("usr/sbin", 0o755),
                       ("etc", 0o755)):
        (rootfs / path).chmod(mode)
    rootfs.chmod(0o755)
    for path in [rootfs, *rootfs.rglob("*")]:
        os.utime(path, ns=(0, 0), follow_symlinks=False)


def layout_digest(layout: Path, tag: str) -> str:
    """The manifest digest an OCI layout gives `tag`."""
    for manifest in json.loads((layout / "index.json").read_text())["manifests"]:
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return manifest["digest"]
    raise RuntimeError(f"{layout} has no image tagged {tag}")


def build_busybox(layout: Path) -> str:
    """Build the busybox image into a new OCI layout at `layout`, tagged `latest`; its digest."""
    with tempfile.TemporaryDirectory(prefix="corral-busybox-") as work:
        rootfs = Path(work) / "rootfs"
        _busybox_rootfs(rootfs)
        image = f"{layout}:latest"
        # Not root: the files are ours, and the image should say root's (as `docker build` would).
        owners = [] if os.geteuid() == 0 else [
            "--rootless", "--uid-map", f"0:{os.geteuid()}:1", "--gid-map", f"0:{os.getegid()}:1"]
        history = ["--history.created", FIXED_TIME, "--history.author", "corral"]
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", image])
        _run(["umoci", "insert", *owners, *history, "--history.created_by", "corral: busybox-static",
              "--image", image, str(rootfs), "/"])
        _run(["umoci", "config", *history, "--image", image, "--created", FIXED_TIME, "--config.cmd", "/bin/sh",
              "--config.env", f"PATH={PATH}", "--config.workingdir", "/"])
    return layout_digest(layout, "latest")


def cached_busybox(cache_dir: Path) -> tuple[Path, str]:
    """The busybox layout in `cache_dir` (built now if missing or stale) and its digest."""
    layout, stamp_file = cache_dir / "busybox", cache_dir / "busybox.json"
    stamp = {"recipe": RECIPE_VERSION, "busybox_sha256": hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()}
    try:
        kept = json.loads(stamp_file.read_text())
        if {k: kept.get(k) for k in stamp} == stamp and layout_digest(layout, "latest") == kept.get("digest"):
            return layout, kept["digest"]
    except (OSError, ValueError, RuntimeError):
        pass
    cache_dir.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=".busybox-", dir=cache_dir))
    try:
        digest = build_busybox(building / "layout")
        shutil.rmtree(layout, ignore_errors=True)
        (building / "layout").rename(layout)
    finally:
        shutil.rmtree(building, ignore_errors=True)
    stamp_file.write_text(json.dumps({**stamp, "digest": digest}))
    return layout, digest


def registry_digest(reference: str, plain_http: bool = True, login: Credentials | None = None) -> str | None:
    """The digest the registry gives `host/repo:tag`, or None if it has no such tag; read with `login`."""
    with contextlib.ExitStack() as stack:
        creds = ["--no-creds"] if login is None else [
            "--authfile", str(stack.enter_context(auth_file(reference.split("/", 1)[0], login)))]
        result = subprocess.run(["skopeo", "inspect", "--raw", f"--tls-verify={str(not plain_http).lower()}", *creds,
                                 f"docker://{reference}"], capture_output=True, timeout=TOOL_TIMEOUT_S,
                                stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        if b"manifest unknown" in result.stderr or b"name unknown" in result.stderr:
            return None
        raise RuntimeError(f"skopeo inspect {reference} failed: {result.stderr.decode(errors='replace').strip()}")
    return f"sha256:{hashlib.sha256(result.stdout).hexdigest()}"


SEED_NAMESPACE = "docker.io/library"
"""Where the seed images go in the registry: its mirror of Docker Hub's official images, so that `busybox`
(`docker.io/library/busybox`) is served by the registry as docker.io's mirror (services.worker.pull_sources)."""


def seed(registry: str, cache_dir: Path, plain_http: bool = True, login: Credentials | None = None,
         namespace: str = SEED_NAMESPACE) -> list[Seeded]:
    """Make `registry` (host:port) serve the seed images under `namespace`, building them in `cache_dir` if
    needed; pushed (and read) with `login`, given to skopeo in an auth file (never on its command line)."""
    layout, digest = cached_busybox(cache_dir)
    reference = f"{registry}/{namespace}/busybox:latest"
    if registry_digest(reference, plain_http, login) == digest:
        return [Seeded(reference, digest, pushed=False)]
    with contextlib.ExitStack() as stack:
        creds = ["--dest-no-creds"] if login is None else [
            "--dest-authfile", str(stack.enter_context(auth_file(registry, login)))]
        _run(["skopeo", "copy", "--quiet", f"--dest-tls-verify={str(not plain_http).lower()}", *creds,
              f"oci:{layout}:latest", f"docker://{reference}"])
    return [Seeded(reference, digest, pushed=True)]
