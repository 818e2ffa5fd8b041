"""The images corral seeds its registry with, built from Debian packages, offline: busybox (here) and the
Debian base images (services.registry.base_images), each in `docker.io/library/NAME` of the registry, the
repository of Docker Hub's official image of that name (the registry is docker.io's mirror).

`busybox:latest` is Debian's static busybox (`busybox-static`) in an otherwise empty root
filesystem: `/bin/busybox`, a symbolic link to it for each applet where busybox itself would install
it (`busybox --list-full`: `/bin/sh`, `/usr/bin/env`, `/sbin/ifconfig`...), `/tmp` (1777), `/root`,
and an `/etc/passwd` and `/etc/group` that know root and nobody. It is built with umoci (`init`,
`new`, `insert`, `config`: `Cmd ["/bin/sh"]`, a standard `PATH`) with every timestamp fixed, so the
same busybox binary always makes the same image digest.

Seeding is cheap when nothing changed, as at each `corral up` after the first: each built layout is
kept in a cache directory with a stamp of its inputs (services.registry.seed_cache; for busybox the
binary's sha256 and the recipe's version) and built again only when one changes, and it is pushed
(`skopeo copy`) only when the registry's tag does not already name that digest (`skopeo inspect --raw`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from services.common.registry_logins import Credentials, auth_file
from services.registry import base_images, seed_cache

BUSYBOX = Path("/bin/busybox")
RECIPE_VERSION = 1
"""Changes whenever the recipe below changes what it builds (so cached layouts are rebuilt)."""
FIXED_TIME = "1970-01-01T00:00:00Z"
"""Every timestamp in the image: the digest depends on the contents only."""
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TOOL_TIMEOUT_S = 120.0
PASSWD = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
GROUP = "root:x:0:\nnogroup:x:65534:\n"
BUILDS_AT_ONCE = 2
"""Base images built at once at a first start: a Debian build waits on the mirror and on dpkg in turn, so two
at once took 91 s where one after the other took 103-128 s on a 2-core machine (docs/images.md)."""
SEED_NAMESPACE = "docker.io/library"
"""Where the seed images go in the registry: its mirror of Docker Hub's official images, so that `busybox`
(`docker.io/library/busybox`) is served by the registry as docker.io's mirror (services.worker.pull_sources)."""


class BaseImageError(RuntimeError):
    """A base image could not be built (the mirror unreachable, a package missing...)."""


@dataclasses.dataclass(frozen=True)
class BaseImage:
    """An image `corral up` can seed its registry with."""

    name: str
    """`docker.io/library/NAME` in the registry."""
    tags: tuple[str, ...]
    """Its tags there, the first the one it is built under."""
    summary: str
    """What it is made of, in a few words."""
    stamp: Callable[[], dict]
    """Every input of its build (seed_cache: a change builds it again)."""
    build: Callable[[Path], str]
    """Builds it into a new OCI layout; its digest."""
    needs_root: bool = False
    """Whether only root can build it."""


@dataclasses.dataclass(frozen=True)
class Seeded:
    """One image in the registry after seeding."""

    reference: str
    """`host:port/docker.io/library/python:3.11`."""
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
        raise RuntimeError(f"{BUSYBOX} is missing or not static: install busybox-static "
                           "(scripts/setup.sh --for run does)")
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
    found = seed_cache.cached(cache_dir, "busybox", _busybox_stamp(), lambda layout: build_busybox(layout))
    return found.layout, found.digest


def _busybox_stamp() -> dict:
    return {"recipe": RECIPE_VERSION, "busybox_sha256": hashlib.sha256(BUSYBOX.read_bytes()).hexdigest()}


def _debian_image(recipe: base_images.Recipe) -> BaseImage:
    def stamp() -> dict:
        return {"recipe": base_images.RECIPE_VERSION, "image": dataclasses.asdict(recipe),
                "sources": list(base_images.machine_sources()), "suite": base_images.SUITE,
                "epoch": base_images.SOURCE_DATE_EPOCH, "machine": os.uname().machine}

    def build(layout: Path) -> str:
        base_images.build(recipe, layout, base_images.machine_sources())
        return layout_digest(layout, recipe.tags[0])

    return BaseImage(recipe.name, recipe.tags, f"Debian {base_images.SUITE} + {' '.join(recipe.packages)}",
                     stamp, build, needs_root=True)


BASE_IMAGES = {image.name: image for image in (
    BaseImage("busybox", ("latest",), "busybox-static", _busybox_stamp, lambda layout: build_busybox(layout)),
    *(_debian_image(recipe) for recipe in base_images.RECIPES.values()))}
"""Every image `corral up` can seed, by name (`corral up --base-images`)."""


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


def _push(layout: Path, tag: str, reference: str, plain_http: bool, login: Credentials | None) -> None:
    with contextlib.ExitStack() as stack:
        creds = ["--dest-no-creds"] if login is None else [
            "--dest-authfile", str(stack.enter_context(auth_file(reference.split("/", 1)[0], login)))]
        _run(["skopeo", "copy", "--quiet", f"--dest-tls-verify={str(not plain_http).lower()}", *creds,
              f"oci:{layout}:{tag}", f"docker://{reference}"])


def references(registry: str, image: BaseImage, namespace: str = SEED_NAMESPACE) -> list[tuple[str, str]]:
    """(tag, `registry/NAMESPACE/NAME:TAG`) for each of the image's tags: by default where Docker Hub's
    official image of that name is in corral's mirror of Docker Hub (`docker.io/library/python:3.11`)."""
    return [(tag, f"{registry}/{namespace}/{image.name}:{tag}") for tag in image.tags]


def seed(registry: str, cache_dir: Path, plain_http: bool = True, login: Credentials | None = None,
         namespace: str = SEED_NAMESPACE, images: Sequence[str] = ("busybox",),
         say: Callable[[str], None] | None = None, prune: bool = True) -> list[Seeded]:
    """Make `registry` (host:port) serve `images` (names of BASE_IMAGES) under `namespace`, each of their tags,
    building them in `cache_dir` if needed, BUILDS_AT_ONCE at a time (`prune`: keeping only the newest build
    of each there); pushed (and read) with `login`, given to skopeo in an auth file (never on its command
    line). `say` is told of each build, before and after (the first start of `corral up` takes minutes), and
    of an image left out because only root could build it (a development `corral up` not run as root)."""
    tell = say or (lambda line: None)
    chosen = []
    for name in images:
        image = BASE_IMAGES[name]
        stamp = image.stamp()
        missing = seed_cache.read_entry(cache_dir / seed_cache.entry_name(name, stamp), stamp) is None
        if missing and image.needs_root and os.geteuid() != 0:
            tell(f"registry: not seeding the base image {name}: building it needs root (mmdebstrap installs "
                 "packages in a chroot)")
            continue
        chosen.append((image, stamp, missing))

    def built(chosen_image: tuple[BaseImage, dict, bool]) -> seed_cache.Cached:
        image, stamp, missing = chosen_image
        if missing:
            tell(f"registry: building the base image {image.name} ({image.summary}) in {cache_dir}")
        try:
            found = seed_cache.cached(cache_dir, image.name, stamp, image.build, prune)
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            raise BaseImageError(f"could not build the base image {image.name}: {e} (corral up --base-images "
                                 "without it starts without it)") from e
        if found.build_s is not None:
            tell(f"registry: built {image.name} in {found.build_s:.0f} s ({found.digest})")
        return found

    with concurrent.futures.ThreadPoolExecutor(BUILDS_AT_ONCE, thread_name_prefix="seed-build") as builds:
        found = list(builds.map(built, chosen))
    seeded = []
    for (image, _, _), layout in zip(chosen, found):
        for tag, reference in references(registry, image, namespace):
            pushed = registry_digest(reference, plain_http, login) != layout.digest
            if pushed:
                _push(layout.layout, tag, reference, plain_http, login)
            seeded.append(Seeded(reference, layout.digest, pushed))
    return seeded
