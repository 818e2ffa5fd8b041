"""Built seed images kept between starts, so that a restart (or the next test deployment) builds nothing.

A cache directory holds one entry per image and stamp: `NAME-KEY/` where KEY is a hash of the stamp (the
recipe's version and every input of the build: for busybox the binary's sha256, for a Debian image its
recipe, mirror and architecture). An entry holds `layout/` (the OCI layout) and `built.json` (the stamp,
the digest, how long the build took), and is never changed once it is there: a build goes into a hidden
directory beside it, renamed into place when done. Builds of one entry are serialised by an flock on
`.NAME-KEY.lock` (a second process waits, then finds the entry built), and builds of different entries do
not touch each other, so two processes, or two worktrees with different recipes, may share one directory
(`corral up --base-image-cache`, for the test suite: each image is built once per machine).

A data directory's own cache (DATA/registry/seed) keeps only the newest entry of each image (`prune`); a
shared one keeps every entry (delete it to reclaim the space).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

STAMP_FILE = "built.json"
KEY_CHARS = 16


@dataclasses.dataclass(frozen=True)
class Cached:
    """One image in the cache."""

    layout: Path
    """Its OCI layout."""
    digest: str
    """Its manifest's digest (the same for every tag)."""
    build_s: float | None
    """How long building it took now; None: it was in the cache."""


def entry_name(name: str, stamp: dict) -> str:
    """The cache entry of `name` built from `stamp`: `NAME-KEY`, KEY a hash of the stamp (its JSON, keys
    sorted, so equal stamps give equal names whatever their order)."""
    canonical = json.dumps(stamp, sort_keys=True, separators=(",", ":"))
    return f"{name}-{hashlib.sha256(canonical.encode()).hexdigest()[:KEY_CHARS]}"


def _is_entry_of(name: str, directory: str) -> bool:
    key = directory.removeprefix(f"{name}-")
    return key != directory and len(key) == KEY_CHARS and all(c in "0123456789abcdef" for c in key)


def read_entry(entry: Path, stamp: dict) -> str | None:
    """The digest an entry holds, if it is complete and was built from `stamp`; None otherwise."""
    stamp = json.loads(json.dumps(stamp))
    try:
        built = json.loads((entry / STAMP_FILE).read_text())
        index = json.loads((entry / "layout" / "index.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(built, dict) or built.get("stamp") != stamp:
        return None
    digest = built.get("digest")
    held = {manifest.get("digest") for manifest in index.get("manifests", [])}
    return digest if isinstance(digest, str) and digest in held else None


def _check_owned(cache_dir: Path) -> None:
    """Refuse a cache another account could write to: whatever it holds is pushed as a base image."""
    status = cache_dir.stat()
    if status.st_uid != os.geteuid() or status.st_mode & 0o022:
        raise RuntimeError(f"{cache_dir} is not this account's alone (owner uid {status.st_uid}, mode "
                           f"{status.st_mode & 0o777:o}): another account could put an image there")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # waits for another process building the same entry
        yield
    finally:
        os.close(fd)  # lets the lock go


def cached(cache_dir: Path, name: str, stamp: dict, build: Callable[[Path], str], prune: bool = False) -> Cached:
    """The image `name` built from `stamp`: from the cache, or built now by `build(layout)` (which makes a new
    OCI layout at `layout` and returns its digest) and kept. With `prune`, other entries of `name` (older
    recipes or inputs, or the layout of before entries: `NAME/` and `NAME.json`) go."""
    stamp = json.loads(json.dumps(stamp))  # as built.json gives it back: tuples are lists there
    cache_dir.mkdir(parents=True, exist_ok=True)
    _check_owned(cache_dir)
    entry = cache_dir / entry_name(name, stamp)
    with _locked(cache_dir / f".{entry.name}.lock"):
        digest, build_s = read_entry(entry, stamp), None
        if digest is None:
            for left in cache_dir.glob(f".{entry.name}.*.building"):  # a build that was killed
                shutil.rmtree(left, ignore_errors=True)
            started = time.monotonic()
            building = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", suffix=".building", dir=cache_dir))
            try:
                digest = build(building / "layout")
                build_s = time.monotonic() - started
                (building / STAMP_FILE).write_text(json.dumps({"stamp": stamp, "digest": digest,
                                                               "build_s": round(build_s, 1)}))
                shutil.rmtree(entry, ignore_errors=True)  # incomplete or damaged: read_entry refused it
                building.rename(entry)
            finally:
                shutil.rmtree(building, ignore_errors=True)
    if prune:
        for other in cache_dir.iterdir():
            lock = other.name.startswith(".") and other.name.endswith(".lock")
            if other != entry and other.name != f".{entry.name}.lock" and (
                    _is_entry_of(name, other.name.removeprefix(".").removesuffix(".lock") if lock else other.name)
                    or other.name in (name, f"{name}.json")):
                shutil.rmtree(other) if other.is_dir() else other.unlink()
    return Cached(entry / "layout", digest, build_s)
