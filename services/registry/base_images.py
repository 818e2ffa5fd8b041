"""The Debian base images corral seeds its registry with (`debian`, `python`, `openjdk`), built offline from
Debian bookworm's packages, reproducibly: the same recipe, mirror and packages give the same digest.

Each is one layer: `mmdebstrap --variant=essential` (Debian's Essential set: bash, coreutils, dash, sed,
grep, tar, dpkg..., no apt) with the recipe's packages, merged /usr set up by mmdebstrap's own hook rather
than the `usrmerge` package (which pulls in perl), and without documentation, manual pages, locales or
info pages (dpkg's `path-exclude`; the copyright files stay). `SOURCE_DATE_EPOCH` fixes every file's time
and mmdebstrap's tarball order; umoci then adds the tarball as the image's layer (`raw add-layer`) with
fixed history and creation times. The one file a build writes with the clock inside is Java's trust store
(`/etc/ssl/certs/java/cacerts` records when each certificate was added): it is made again with the clock
frozen at `SOURCE_DATE_EPOCH` (libfaketime, copied into the root for the moment it takes).

Packages come from the Debian mirror apt on this machine uses (`debian_sources`), so a machine with no
internet but a mirror builds them as well as one with. docs/images.md, "Base images", has the sizes and
the build times.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shlex
import subprocess
import tempfile
import time
from pathlib import Path

RECIPE_VERSION = 1
"""Changes whenever the build below changes what it makes (a change to a Recipe is seen without it)."""
SUITE = "bookworm"
SOURCE_DATE_EPOCH = 1747699200
"""2025-05-20T00:00:00Z: every timestamp in the images."""
CREATED = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(SOURCE_DATE_EPOCH))
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN_SOURCES = Path("/etc/apt/sources.list.d/debian.sources")
DEFAULT_SOURCES = (f"deb http://deb.debian.org/debian {SUITE} main",
                   f"deb http://deb.debian.org/debian {SUITE}-updates main",
                   f"deb http://deb.debian.org/debian-security {SUITE}-security main")
"""Where packages come from when this machine's apt names no Debian bookworm mirror (e.g. an Ubuntu host)."""
BUILD_TIMEOUT_S = 1800.0
"""mmdebstrap downloads and installs a few hundred packages: minutes on a slow mirror."""
TOOL_TIMEOUT_S = 300.0
"""umoci compresses a layer of up to ~300 MB."""
EXCLUDED_PATHS = ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*", "/usr/share/info/*",
                  "/usr/share/lintian/*")
KEPT_PATHS = ("/usr/share/doc/*/copyright",)
"""Excluded above, but kept: each package's licence."""


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One Debian base image: what goes in, and its configuration. Every field feeds the cache's stamp, so
    a change to a recipe builds the image again."""

    name: str
    """The repository's last component: `docker.io/library/NAME`."""
    tags: tuple[str, ...]
    """The tags it is seeded under."""
    packages: tuple[str, ...]
    """Installed on top of Debian's Essential set."""
    cmd: tuple[str, ...]
    """The image's Cmd (what runs when a job gives no command)."""
    env: tuple[str, ...] = ()
    """Environment besides PATH and LANG, `NAME=VALUE`."""
    essential_hooks: tuple[str, ...] = ()
    """Shell run (`$1`: the root) once the Essential set is in, before `packages` are installed."""
    customize_hooks: tuple[str, ...] = ()
    """Shell run (`$1`: the root) once everything is installed; `{libfaketime}` and `{faketime}` are filled
    in (the host's libfaketime, and SOURCE_DATE_EPOCH as FAKETIME wants it)."""


# openjdk-17-jre-headless's postinst registers the man page of each tool with update-alternatives, which
# fails if the (excluded) man directory is missing.
MAN_DIRECTORY = 'mkdir -p "$1/usr/share/man/man1"'
# ca-certificates-java's trigger, as its postinst runs it (every Debian certificate, added afresh), with the
# clock frozen: the keystore (JKS, no salt) records each entry's creation time and nothing else of the build.
JAVA_CACERTS = """set -eu
work="$1/tmp/corral-faketime"
mkdir -p "$work"
cp {libfaketime} "$work/libfaketime.so.1"
find "$1/etc/ssl/certs" -maxdepth 1 -type l -name '*.pem' -printf '+/etc/ssl/certs/%f\\n' | LC_ALL=C sort >"$work/certs"
rm -f "$1/etc/ssl/certs/java/cacerts"
chroot "$1" env LD_PRELOAD=/tmp/corral-faketime/libfaketime.so.1 FAKETIME={faketime} TZ=UTC \\
    FAKETIME_DONT_FAKE_MONOTONIC=1 java -XX:-UsePerfData -Xmx64m \\
    -jar /usr/share/ca-certificates-java/ca-certificates-java.jar -storepass changeit <"$work/certs" >/dev/null
rm -rf "$work"
test -s "$1/etc/ssl/certs/java/cacerts"
"""

RECIPES = {recipe.name: recipe for recipe in (
    Recipe("debian", ("latest", "12", "bookworm"), ("bash", "coreutils"), ("bash",)),
    Recipe("python", ("latest", "3.11"), ("bash", "coreutils", "python3", "python3-cloudpickle"), ("python3",),
           env=("PYTHONDONTWRITEBYTECODE=1",)),
    Recipe("openjdk", ("latest", "17"), ("bash", "coreutils", "default-jre-headless"), ("java", "-version"),
           env=("JAVA_HOME=/usr/lib/jvm/default-java",), essential_hooks=(MAN_DIRECTORY,),
           customize_hooks=(JAVA_CACERTS,)),
)}
"""`debian` is bash's (the pipeline library's default for bash jobs); `python` is Debian's python3 (3.11, the
client's minor version) with cloudpickle (the pipeline library's Python jobs); `openjdk` is Debian's default
Java runtime, OpenJDK 17, whose Cmd says which Java it is."""


def debian_sources(text: str) -> tuple[str, ...]:
    """The one-line apt sources (`deb URI SUITE main`) of bookworm, bookworm-updates and bookworm-security
    that a deb822 sources file (/etc/apt/sources.list.d/debian.sources) names, in its order; DEFAULT_SOURCES
    if it names no bookworm suite."""
    found = []
    for stanza in re.split(r"\n\s*\n", text):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if "deb" not in fields.get("types", "deb").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        for uri in fields.get("uris", "").split():
            for suite in fields.get("suites", "").split():
                if suite in (SUITE, f"{SUITE}-updates", f"{SUITE}-security") and \
                        re.fullmatch(r"(https?|file)://\S+", uri):
                    found.append(f"deb {uri} {suite} main")
    return tuple(dict.fromkeys(found)) or DEFAULT_SOURCES


def machine_sources() -> tuple[str, ...]:
    """The bookworm sources of this machine's apt (DEFAULT_SOURCES if it has none)."""
    try:
        return debian_sources(DEBIAN_SOURCES.read_text())
    except OSError:
        return DEFAULT_SOURCES


def libfaketime() -> str:
    """The host's libfaketime (the `faketime` package, scripts/setup.sh --for run)."""
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not found:
        raise RuntimeError("libfaketime is missing: install faketime (scripts/setup.sh --for run does)")
    return found[0]


def mmdebstrap_argv(recipe: Recipe, sources: tuple[str, ...], output: Path, faketime_library: str) -> list[str]:
    """The mmdebstrap command that writes the recipe's root filesystem as a tarball at `output`."""
    faketime = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(SOURCE_DATE_EPOCH))
    hooks = [f"--essential-hook={hook}" for hook in recipe.essential_hooks]
    fill = {"libfaketime": shlex.quote(faketime_library), "faketime": shlex.quote(faketime)}
    hooks += [f"--customize-hook={hook.format(**fill)}" for hook in recipe.customize_hooks]
    return ["mmdebstrap", "--quiet", "--mode=root", "--variant=essential", "--format=tar",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            *(f"--dpkgopt=path-exclude={path}" for path in EXCLUDED_PATHS),
            *(f"--dpkgopt=path-include={path}" for path in KEPT_PATHS),
            f"--include={','.join(recipe.packages)}", *hooks, SUITE, str(output), *sources]


def umoci_config_argv(recipe: Recipe, image: str) -> list[str]:
    """The umoci command that gives the image its configuration, every time fixed."""
    env = [f"PATH={PATH}", "LANG=C.UTF-8", *recipe.env]
    return ["umoci", "config", "--image", image, "--created", CREATED, "--author", "corral",
            "--history.created", CREATED, "--history.author", "corral",
            "--history.created_by", f"corral: config of {recipe.name}", "--config.workingdir", "/",
            *(f"--config.env={e}" for e in env), *(f"--config.cmd={part}" for part in recipe.cmd)]


def _run(argv: list[str], timeout_s: float = TOOL_TIMEOUT_S, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL,
                            env=env)
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise RuntimeError(f"{' '.join(argv[:2])} failed: {' / '.join(said[-15:])}")
    return result.stdout


def build(recipe: Recipe, layout: Path, sources: tuple[str, ...]) -> None:
    """Build `recipe` into a new OCI layout at `layout`, tagged with each of its tags. Needs root (mmdebstrap
    installs packages in a chroot) and the network path to `sources`."""
    with tempfile.TemporaryDirectory(prefix=f"corral-{recipe.name}-") as work:
        rootfs = Path(work) / "rootfs.tar"
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "TMPDIR": work, "LC_ALL": "C.UTF-8"}
        _run(mmdebstrap_argv(recipe, sources, rootfs, libfaketime()), BUILD_TIMEOUT_S, env)
        first = f"{layout}:{recipe.tags[0]}"
        _run(["umoci", "init", "--layout", str(layout)])
        _run(["umoci", "new", "--image", first])
        _run(["umoci", "raw", "add-layer", "--image", first, "--history.created", CREATED,
              "--history.author", "corral", "--history.created_by",
              f"mmdebstrap --variant=essential {SUITE} + {' '.join(recipe.packages)}", str(rootfs)])
    _run(umoci_config_argv(recipe, first))
    for tag in recipe.tags[1:]:
        _run(["umoci", "tag", "--image", first, tag])
    _run(["umoci", "gc", "--layout", str(layout)])
