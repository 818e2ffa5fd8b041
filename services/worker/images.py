"""A worker's image cache: each image pulled once, unpacked once, kept within a size limit.

`pull(reference)` resolves the reference (services.common.image_refs) and returns the `Image`: its
digest, its OCI configuration and its unpacked root filesystem. The runtime `acquire`s the image
an attempt runs and `release`s it when the attempt ends; an image held by anyone is never evicted.

On disk (`root`, private to the worker):

    root/lock                   flock'd while a worker uses the cache: one worker per cache
    root/images/<hex>/          one complete image per manifest digest (sha256:<hex>)
        rootfs/                 its layers, unpacked (`umoci raw unpack`); nothing writes here once it
                                is in place: the runtime lays each attempt's writable layer over it
        image-config.json       the image's OCI configuration (Env, Cmd, WorkingDir, User, ...)
        image.json              digest, references it was pulled as, size, when pulled, whether it
                                is public; its mtime is when it was last used (LRU across restarts)
    root/tmp/                   pulls in progress, images being evicted, auth files: emptied at start

A pull is fetched (`skopeo copy` into a one-image OCI layout) and unpacked under `tmp/`, then
renamed into `images/` whole, so a worker that crashes mid-pull leaves only `tmp/`, which the
next one empties. A restarted worker finds its images again from `images/*/image.json`.

**Concurrency.** Pulls of one reference in flight together share one tag resolution (`skopeo
inspect --raw`), and pulls of one digest share one fetch and one unpack: 50 attempts starting at
once on a new image run skopeo twice and umoci once. A caller that is cancelled leaves the shared
pull running for the others.

**Tags.** A tag is resolved on the registry at each pull, except that an anonymous resolution is
remembered for `tag_ttl_s` (a minute): a batch of many jobs of one image asks the registry once, and
a tag pushed again is picked up within a minute. A pinned digest never needs the registry once
held.

**Private images.** An image is *public* once fetched or checked without credentials. A pull of an
image that is not public, by someone whose credentials have not been checked against it in this
pull, first asks the registry for its manifest with the caller's own credentials: a cached private
image is never handed to someone the registry would refuse.

**Where from.** A reference is asked for where services.worker.pull_sources says: `localhost/...` at corral's
own registry (`own_registry`) with the deployment's login (`own_login`), whatever login the job brings (its
`image_pull_secret` is for other registries); a reference of a mirrored registry (`mirrors`: `docker.io`
served by `corral up`'s registry) at the mirror first, then at its registry with the job's login. What the
own registry or an anonymous mirror serves counts as public: every job may use it. When every source
fails, the user is told the last one's failure in corral's words, "registry unreachable" naming the
registry their reference names (`registry unreachable: docker.io`). Before it asks a registry anything,
the cache checks that a job's image may come from it (services.common.registry_rules, through
services.worker.egress: its host resolved now, for DNS may have changed since the job was submitted); a
refused registry is never contacted.

**Size.** The cache keeps at most `max_bytes` of unpacked images: after each pull and release it
evicts the least recently used images nobody holds, until it fits. An image in use is never evicted,
so the cache may exceed the limit while held images alone do.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from services.common.files import write_atomically
from services.common.image_refs import (
    OWN_REGISTRY,
    ImageReference,
    InvalidImageReference,
    Mirror,
    Registry,
    names_own_registry,
    parse_reference,
)
from services.common.callback_hosts import Resolve, SystemResolver
from services.common.registry_logins import auth_file
from services.common.registry_rules import RegistryRules
from services.worker.config import DEFAULT_IMAGE_CACHE_BYTES
from services.worker.egress import registry_refusal
from services.worker.metrics import IMAGE_PULLS
from services.worker.pull_sources import Source, pull_sources
from services.worker.image_tools import (
    LAYOUT_TAG,
    Credentials,
    ImagePullError,
    ImageTools,
    PullFailure,
    SkopeoUmoci,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

TAG_TTL_S = 60.0
"""How long an anonymous tag resolution is reused."""
_MAX_REMEMBERED_TAGS = 10_000


@dataclasses.dataclass(frozen=True)
class Image:
    """An image in the cache, as a runtime uses it."""

    digest: str
    """`sha256:...` of the manifest the reference resolved to."""
    reference: str
    """The reference it was pulled as, resolved (`registry/repository:tag`)."""
    rootfs: Path
    """Its unpacked layers: read-only, shared by every attempt of the image."""
    config: dict[str, Any]
    """Its OCI image configuration (`config.Env`, `config.Cmd`, `config.WorkingDir`, ...)."""
    size_bytes: int
    """Disk space of `rootfs`."""


@dataclasses.dataclass(frozen=True)
class HeldImage:
    """What `held()` says about each image (the worker's ListImages)."""

    digest: str
    references: tuple[str, ...]
    """Every reference it was pulled as, sorted."""
    size_bytes: int
    pulled_at_ms: int
    last_used_at_ms: int
    users: int
    """Holders now (attempts running it)."""
    public: bool = False
    """Fetched or checked without a job's credentials (from a public registry, an anonymous mirror or corral's
    own registry): every job whose registry rules allow it may use it."""


@dataclasses.dataclass
class _Entry:
    digest: str
    path: Path
    references: set[str]
    size_bytes: int
    pulled_at_ms: int
    last_used_ms: int
    public: bool
    config: dict[str, Any]
    users: int = 0

    @property
    def rootfs(self) -> Path:
        return self.path / "rootfs"

    def metadata(self) -> bytes:
        return json.dumps({"digest": self.digest, "references": sorted(self.references), "size_bytes": self.size_bytes,
                           "pulled_at_ms": self.pulled_at_ms, "public": self.public}).encode()


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class CacheInUse(RuntimeError):
    """Another process holds this cache's lock."""


class ImageCache:
    """See the module docstring. Create it in the worker's event loop; `close` it at the end."""

    def __init__(self, root: Path, own_registry: str | None = None, max_bytes: int = DEFAULT_IMAGE_CACHE_BYTES,
                 tools: ImageTools | None = None, clock_ms: Callable[[], int] = _now_ms,
                 tag_ttl_s: float = TAG_TTL_S, own_login: Credentials | None = None,
                 allowed_registries: tuple[str, ...] = (), resolve: Resolve | None = None,
                 mirrors: tuple[Mirror, ...] = ()):
        self.root = root
        self.own_registry = Registry.parse(own_registry) if own_registry else None
        """corral's own registry, what `localhost/...` names; its scheme says whether it is plain HTTP."""
        self.own_login = own_login
        """The deployment's login to its own registry (asked as itself or as a mirror)."""
        self.mirrors = mirrors
        """Registries that serve other registries' images, asked first (services.worker.pull_sources)."""
        self.rules = RegistryRules.of(own_registry, allowed_registries, mirrors)
        """Where jobs' images may come from: public registries, the own one, the mirrors and
        `allowed_registries`."""
        self.plain_http = frozenset(Registry.parse(entry).host for entry in allowed_registries
                                    if entry.strip().startswith("http://"))
        """Allowed registries written `http://`: reached over plain HTTP."""
        self._own_resolver = SystemResolver() if resolve is None else None
        self._lookup: Resolve = resolve or self._own_resolver  # type: ignore[assignment]
        """Resolves registries' host names (the system's resolver unless one is given)."""
        self.max_bytes = max_bytes
        self.tools = tools or SkopeoUmoci()
        self._clock_ms = clock_ms
        self.tag_ttl_s = tag_ttl_s
        self._entries: dict[str, _Entry] = {}
        self._bytes = 0
        self._tags: dict[str, tuple[str, int]] = {}
        """Anonymous resolutions: reference -> (digest, when)."""
        self._resolving: dict[tuple[str, str], asyncio.Future[str]] = {}
        self._fetching: dict[str, asyncio.Future[_Entry]] = {}
        self._wanted: dict[str, int] = {}
        """Digests pulls in progress are about to return: never evicted."""
        self._removals: set[asyncio.Task[None]] = set()
        self._images, self._tmp = root / "images", root / "tmp"
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)
        self._lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise CacheInUse(f"another worker uses the image cache {root}") from None
        shutil.rmtree(self._tmp, ignore_errors=True)  # what a crashed worker was pulling or evicting
        self._tmp.mkdir()
        self._images.mkdir(exist_ok=True)
        self._load()

    def _load(self) -> None:
        for path in sorted(self._images.iterdir()):
            try:
                metadata = json.loads((path / "image.json").read_bytes())
                config = json.loads((path / "image-config.json").read_bytes())
                if metadata["digest"] != f"sha256:{path.name}" or not (path / "rootfs").is_dir():
                    raise ValueError("not the image its name says")
                entry = _Entry(metadata["digest"], path, set(metadata["references"]), int(metadata["size_bytes"]),
                               int(metadata["pulled_at_ms"]), (path / "image.json").stat().st_mtime_ns // 1_000_000,
                               bool(metadata["public"]), config)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("image cache: removing %s, which is not a complete image (%s)", path, e)
                self._remove_path(path)
                continue
            self._entries[entry.digest] = entry
            self._bytes += entry.size_bytes
        if self._entries:
            log.info("image cache %s: %d images (%d bytes) from before", self.root, len(self._entries), self._bytes)

    @property
    def size_bytes(self) -> int:
        """Disk space of the images in the cache now."""
        return self._bytes

    def reference_of(self, name: str) -> str:
        """The reference a pull of `name` (as a job writes it) is recorded under in `held()`. Raises
        InvalidImageReference for a name that is not one."""
        return str(self._named(parse_reference(name)))

    def held(self) -> list[HeldImage]:
        """The images in the cache, most recently used first."""
        return [HeldImage(e.digest, tuple(sorted(e.references)), e.size_bytes, e.pulled_at_ms, e.last_used_ms, e.users,
                          e.public)
                for e in sorted(self._entries.values(), key=lambda e: e.last_used_ms, reverse=True)]

    async def pull(self, reference: str, credentials: Credentials | None = None) -> Image:
        """The image `reference` names, pulled and unpacked if it is not here yet; not held (see
        `acquire`). Raises InvalidImageReference for a reference that is not one, ImagePullError when
        the registry or the tools fail."""
        entry, ref = await self._pull(reference, credentials)
        self._used(entry)
        self._evict(keep=entry)
        return self._image(entry, ref)

    async def acquire(self, reference: str, credentials: Credentials | None = None) -> Image:
        """`pull`, and hold the image until `release`: it is not evicted meanwhile."""
        entry, ref = await self._pull(reference, credentials)
        entry.users += 1  # no await since the pull returned: eviction cannot have taken it
        self._used(entry)
        self._evict()
        return self._image(entry, ref)

    def release(self, image: Image) -> None:
        """Let go of an image `acquire` returned; it may be evicted from now on."""
        entry = self._entries.get(image.digest)
        if entry is None or entry.users == 0:
            raise ValueError(f"{image.digest} is not held")
        entry.users -= 1
        self._used(entry)
        self._evict()

    @contextlib.asynccontextmanager
    async def using(self, reference: str, credentials: Credentials | None = None) -> AsyncIterator[Image]:
        """`acquire` for the block, `release` after it."""
        image = await self.acquire(reference, credentials)
        try:
            yield image
        finally:
            self.release(image)

    async def close(self) -> None:
        """Stop pulls in flight (their partial files go with the next start), finish evictions, unlock."""
        for task in [*self._resolving.values(), *self._fetching.values()]:
            task.cancel()
        pending = [*self._resolving.values(), *self._fetching.values(), *self._removals]
        await asyncio.gather(*pending, return_exceptions=True)
        if self._own_resolver is not None:
            self._own_resolver.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # The pull itself.

    async def _pull(self, reference: str, credentials: Credentials | None) -> tuple[_Entry, ImageReference]:
        ref = self._named(parse_reference(reference))
        if all(source.own for source in self._sources(ref)):
            credentials = None  # the deployment's own registry: pulled with its login, every job alike
        checked = False  # whether the registry let this caller's credentials read the image in this pull
        digest = ref.digest
        if digest is None and credentials is None:
            digest = self._remembered(ref)
            checked = digest is not None
        if digest is None:
            (digest, public), _ = await self._shared(self._resolving, (str(ref), _credentials_key(credentials)),
                                                     lambda: self._resolve(ref, credentials))
            checked = True
            if public:
                self._remember(ref, digest)
        # Wanted from now until the caller has it: not evicted by other pulls meanwhile.
        self._wanted[digest] = self._wanted.get(digest, 0) + 1
        try:
            entry = self._entries.get(digest)
            if entry is None:
                entry, ours = await self._fetch_shared(ref.at(digest), credentials)
                checked = checked or ours
            if not (checked or entry.public):
                await self._resolve(ref.at(digest), credentials)  # raises if the registry refuses this caller
            if credentials is None and not entry.public:
                entry.public = True
                self._store(entry)
            if str(ref) not in entry.references:
                self._name(entry, ref)
            return entry, ref
        finally:
            self._wanted[digest] -= 1
            if not self._wanted[digest]:
                del self._wanted[digest]

    async def _fetch_shared(self, ref: ImageReference, credentials: Credentials | None) -> tuple[_Entry, bool]:
        """The entry of `ref`'s digest from the one fetch in flight (started now if there is none) and
        whether this caller started it. Another caller's fetch refused for *its* credentials is not
        this caller's failure: then this caller fetches with its own."""
        assert ref.digest is not None
        joined = ref.digest in self._fetching
        try:
            return await self._shared(self._fetching, ref.digest, lambda: self._fetch(ref, credentials))
        except ImagePullError as e:
            if not joined or e.failure is not PullFailure.UNAUTHORIZED:
                raise
        return await self._shared(self._fetching, ref.digest, lambda: self._fetch(ref, credentials))

    async def _shared(self, table: dict[Any, asyncio.Future[T]], key: Any,
                      start: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """The result of the one task in flight for `key` in `table` (started now if there is none) and
        whether this caller started it. A caller cancelled while waiting leaves the task to the others."""
        task = table.get(key)
        ours = task is None
        if task is None:
            task = asyncio.ensure_future(start())
            table[key] = task

            def done(finished: asyncio.Future[T]) -> None:
                if table.get(key) is finished:
                    del table[key]
                if not finished.cancelled():
                    finished.exception()  # retrieved: waiters get it; no "never retrieved" warning

            task.add_done_callback(done)
        return await asyncio.shield(task), ours

    def _remembered(self, ref: ImageReference) -> str | None:
        found = self._tags.get(str(ref))
        if found is None or self._clock_ms() - found[1] > self.tag_ttl_s * 1000:
            return None
        return found[0]

    def _remember(self, ref: ImageReference, digest: str) -> None:
        if len(self._tags) >= _MAX_REMEMBERED_TAGS:
            self._tags.clear()
        self._tags[str(ref)] = (digest, self._clock_ms())

    def _named(self, ref: ImageReference) -> ImageReference:
        """`ref`, its own registry's real address written `localhost` (one name for one image)."""
        if ref.registry != OWN_REGISTRY and names_own_registry(ref, self.own_registry):
            return dataclasses.replace(ref, registry=OWN_REGISTRY)
        return ref

    def _sources(self, ref: ImageReference) -> list[Source]:
        """Where `ref` is asked for, in order. ImagePullError when it names the own registry and there is none."""
        try:
            return pull_sources(ref, self.own_registry, self.mirrors, self.plain_http)
        except InvalidImageReference as e:
            raise ImagePullError(str(ref), PullFailure.NOT_FOUND, str(e),
                                 user_words="no such image: localhost/... names corral's own registry, "
                                            "and this deployment has none") from None

    async def _check(self, ref: ImageReference) -> None:
        """Raise ImagePullError (REFUSED) unless a job's image may come from `ref`'s registry."""
        if (why := await registry_refusal(ref.registry, self.rules, self._lookup)) is not None:
            raise ImagePullError(str(ref), PullFailure.REFUSED, why, user_words=why)

    async def _first(self, ref: ImageReference, credentials: Credentials | None,
                     step: Callable[[Source, Path | None], Awaitable[T]]) -> tuple[T, bool]:
        """`step` at the first of `ref`'s sources where it succeeds (each checked, then asked with its login),
        and whether that source served it to anyone (public: the own registry, or asked anonymously). When
        every source fails, the last one's failure, "registry unreachable" naming `ref`'s registry."""
        failures: list[ImagePullError] = []
        for source in self._sources(ref):
            login = self.own_login if source.own else None if source.mirror else credentials
            try:
                await self._check(source.reference)
                with self._auth_file(source.reference, login) as auth_file:
                    return await step(source, auth_file), source.own or login is None
            except ImagePullError as e:
                if source.mirror:
                    log.info("image cache: the mirror failed, asking %s itself: %s", ref.registry, e)
                failures.append(e)
        last = failures[-1]
        detail = last.detail if len(failures) == 1 else "; ".join(f"{e.reference}: {e.detail}" for e in failures)
        user_words = f"{last.failure.value}: {ref.registry}" if last.failure is PullFailure.UNREACHABLE \
            else last.user_words
        raise ImagePullError(last.reference, last.failure, detail, user_words)

    async def _resolve(self, ref: ImageReference, credentials: Credentials | None) -> tuple[str, bool]:
        """The digest of the manifest `ref` names, read with `credentials` (see `_first`), and whether it was
        read publicly."""

        async def read(source: Source, auth_file: Path | None) -> str:
            manifest = await self.tools.manifest(source.reference, source.plain_http, auth_file)
            digest = f"sha256:{hashlib.sha256(manifest).hexdigest()}"
            if ref.digest is not None and digest != ref.digest:
                raise ImagePullError(str(source.reference), PullFailure.FAILED,
                                     f"the registry served a manifest of digest {digest}")
            return digest

        return await self._first(ref, credentials, read)

    async def _fetch(self, ref: ImageReference, credentials: Credentials | None) -> _Entry:
        """Fetch and unpack the image `ref` pins, under tmp/, then move it into images/ whole."""
        assert ref.digest is not None
        work = self._tmp / f"pull-{secrets.token_hex(8)}"
        work.mkdir()
        try:
            layout, rootfs = work / "layout", work / "rootfs"

            async def fetch(source: Source, auth_file: Path | None) -> None:
                shutil.rmtree(layout, ignore_errors=True)  # what a source that failed left
                await self.tools.fetch(source.reference, source.plain_http, auth_file, layout)

            try:
                _, public = await self._first(ref, credentials, fetch)
                await self.tools.unpack(layout, rootfs)
                try:
                    config, size_bytes = await asyncio.to_thread(_finish, layout, rootfs)
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise ImagePullError(str(ref), PullFailure.FAILED,
                                         f"reading the image's configuration: {e}") from e
            except Exception:
                IMAGE_PULLS.labels("failed").inc()
                raise
            IMAGE_PULLS.labels("pulled").inc()
            now = self._clock_ms()
            entry = _Entry(ref.digest, self._images / ref.digest.removeprefix("sha256:"), set(), size_bytes, now, now,
                           public, config)
            (work / "image-config.json").write_text(json.dumps(config))
            write_atomically(work / "image.json", entry.metadata())
            work.rename(entry.path)
        finally:
            if work.exists():
                self._remove_path(work)
        self._entries[entry.digest] = entry
        self._bytes += entry.size_bytes
        log.info("image cache: pulled %s (%d bytes unpacked)", ref, entry.size_bytes)
        return entry

    @contextlib.contextmanager
    def _auth_file(self, ref: ImageReference, credentials: Credentials | None) -> Iterator[Path | None]:
        """An auth file for skopeo holding `credentials` for `ref`'s registry (0600, in a private
        directory under tmp/, which the next start empties should this worker die now); removed after."""
        if credentials is None:
            yield None
            return
        with auth_file(ref.registry, credentials, self._tmp) as path:
            yield path

    # Use and eviction.

    def _image(self, entry: _Entry, ref: ImageReference) -> Image:
        return Image(entry.digest, str(ref), entry.rootfs, entry.config, entry.size_bytes)

    def _used(self, entry: _Entry) -> None:
        entry.last_used_ms = max(self._clock_ms(), entry.last_used_ms)
        with contextlib.suppress(OSError):  # the mtime is when it was last used, for the next start
            ns = entry.last_used_ms * 1_000_000
            os.utime(entry.path / "image.json", ns=(ns, ns))

    def _name(self, entry: _Entry, ref: ImageReference) -> None:
        """Record that `ref` names `entry` now. A tag names one image: an image it named before (the
        tag was pushed again since) keeps its name pinned to its digest instead."""
        for other in self._entries.values():
            if other is not entry and str(ref) in other.references:
                other.references.discard(str(ref))
                other.references.add(str(ref.at(other.digest)))
                self._store(other)
        entry.references.add(str(ref))
        self._store(entry)

    def _store(self, entry: _Entry) -> None:
        """Write `image.json` again, keeping its mtime (when the image was last used)."""
        write_atomically(entry.path / "image.json", entry.metadata())
        ns = entry.last_used_ms * 1_000_000
        os.utime(entry.path / "image.json", ns=(ns, ns))

    def _evict(self, keep: _Entry | None = None) -> None:
        """Evict the least recently used images nobody holds (but `keep`) until the cache fits."""
        if self._bytes <= self.max_bytes:
            return
        for entry in sorted(self._entries.values(), key=lambda e: e.last_used_ms):
            if self._bytes <= self.max_bytes:
                break
            if entry.users or entry is keep or entry.digest in self._wanted:
                continue
            del self._entries[entry.digest]
            self._bytes -= entry.size_bytes
            log.info("image cache: evicting %s (%d bytes; over the limit of %d)",
                     ", ".join(sorted(entry.references)) or entry.digest, entry.size_bytes, self.max_bytes)
            self._remove_path(entry.path)

    def _remove_path(self, path: Path) -> None:
        """Rename `path` into tmp/ at once (so it is gone from images/ even if this process dies), and
        delete it in the background."""
        doomed = self._tmp / f"removed-{secrets.token_hex(8)}"
        try:
            path.rename(doomed)
        except OSError:
            doomed = path
        try:
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(shutil.rmtree, doomed, True))
        except RuntimeError:  # no loop (a cache opened outside one): delete now
            shutil.rmtree(doomed, ignore_errors=True)
            return
        self._removals.add(task)
        task.add_done_callback(self._removals.discard)


def _credentials_key(credentials: Credentials | None) -> str:
    """What tells two callers' credentials apart in the table of resolutions in flight (never stored)."""
    if credentials is None:
        return ""
    return hashlib.sha256(f"{credentials.username}\0{credentials.password}".encode()).hexdigest()


def _finish(layout: Path, rootfs: Path) -> tuple[dict[str, Any], int]:
    """The image's OCI configuration, read from its layout, and the unpacked size; then the layout
    goes (only the unpacked root filesystem is kept)."""
    index = json.loads((layout / "index.json").read_bytes())
    descriptors = [m for m in index["manifests"]
                   if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == LAYOUT_TAG]
    if len(descriptors) != 1:
        raise ValueError(f"the layout holds {len(descriptors)} images tagged {LAYOUT_TAG!r}")
    descriptor = descriptors[0]
    manifest = json.loads(_blob(layout, descriptor["digest"]))
    config = json.loads(_blob(layout, manifest["config"]["digest"]))
    shutil.rmtree(layout)
    return config, _disk_usage(rootfs)


def _blob(layout: Path, digest: str) -> bytes:
    algorithm, _, hex_digest = digest.partition(":")
    return (layout / "blobs" / algorithm / hex_digest).read_bytes()


def _disk_usage(path: Path) -> int:
    """Bytes of disk `path` takes (allocated blocks; each hard-linked file once), like `du -s`."""
    total, seen = 0, set()
    for directory, dirnames, filenames in os.walk(path):
        for name in [*dirnames, *filenames]:
            st = os.lstat(os.path.join(directory, name))
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total + os.lstat(path).st_blocks * 512
