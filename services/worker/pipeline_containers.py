"""LocalBackend's containers: each job run by the worker's own OCI runtime (services/worker/oci), on this
machine, with no server.

A job is compiled to the corral job spec the ServiceBackend would submit (service.py's `job_spec`, its
files as file:// URLs under the run's scratch directory) and run as a worker runs an attempt: a uid of
its own, its image's root filesystem under a writable layer, its inputs copied in to /io before the
command and its outputs copied out after it succeeds, its cgroup's cpu and memory limits, no network
but loopback, cleaned up whatever happens. Only the images come from elsewhere (`LocalImages`), for
there is no corral registry.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

from corral.batch.v1 import job_spec_pb2
from services.registry import seed, seed_cache
from services.worker.image_tools import Credentials
from services.worker.images import CacheInUse, ImageCache
from services.worker.logs import LogSink
from services.worker.oci.config import OciRuntimeConfig
from services.worker.oci.images import CachedRootfs, ImageConfig, ImageUnavailable, Rootfs
from services.worker.oci.runtime import OciRuntime, host_refusals
from services.worker.runtime_api import JobOutcome, JobRun

LAYOUT_PREFIX = "oci-layout://"
SEED_PREFIX = seed.SEED_NAMESPACE + "/"
UNPACK_TIMEOUT_S = 600.0


def base_image_cache() -> Path:
    """Where `corral up` and the tests keep the base images they built (tests/conftest.py's BASE_IMAGE_CACHE)."""
    if found := os.environ.get("CORRAL_BASE_IMAGE_CACHE"):
        return Path(found)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral" / "base-images"


def why_not_containers() -> list[str]:
    """Why jobs cannot run in containers on this machine (the worker's OCI runtime's reasons, and umoci,
    which unpacks images); empty if they can."""
    reasons = host_refusals()
    if shutil.which("umoci") is None:
        reasons.append("umoci is not installed (it unpacks images; scripts/setup.sh --for run installs it)")
    return reasons


class LocalImages:
    """The `RootfsSource` of LocalBackend's runtime. An image is, in this order:

    - `oci-layout:///PATH[:TAG]`: the OCI image layout at PATH, its image tagged TAG (default `latest`);
    - a base image corral builds from Debian's packages (`busybox`, `debian`, `python`, `openjdk`, as a bare
      name or under docker.io/library/, with one of its tags), as built in the base image cache of this
      machine by `corral up` or the tests; one that is not built there is unavailable, saying how to build it;
    - anything else: pulled from the registry its reference names by the worker's image cache (kept in a
      directory of the run's, removed with it).

    Layouts are unpacked once per run (umoci), whatever the number of jobs using them."""

    def __init__(self, work: Path, cache_dir: Path):
        self.work = work
        self.cache_dir = cache_dir
        self._unpacked: dict[tuple[Path, str], asyncio.Task[Rootfs]] = {}
        self._registry: CachedRootfs | None = None

    def layout_of(self, image: str) -> tuple[Path, str] | None:
        """The OCI layout and tag `image` names (oci-layout:// or a built base image); None for a registry's
        image. Raises ImageUnavailable, saying why, for a layout or base image that is not there."""
        if image.startswith(LAYOUT_PREFIX):
            path, tag = _path_and_tag(image.removeprefix(LAYOUT_PREFIX))
            if not (Path(path) / "index.json").is_file():
                raise ImageUnavailable(f"no OCI image layout at {path} (no index.json there)", final=True)
            return Path(path), tag
        name, tag = _path_and_tag(image.removeprefix(SEED_PREFIX))
        base = seed.BASE_IMAGES.get(name)
        if base is None or tag not in base.tags:
            return None
        try:
            stamp = base.stamp()
        except OSError as e:
            raise ImageUnavailable(f"the base image {name!r} cannot be looked for: {e}", final=True) from e
        entry = self.cache_dir / seed_cache.entry_name(name, stamp)
        if seed_cache.read_entry(entry, stamp) is None:
            raise ImageUnavailable(
                f"the base image {name!r} is not built on this machine (looked for {entry}): `corral up "
                f"--base-images {name}` builds it there (as root), or name an image as oci-layout:///PATH:TAG",
                final=True)
        return entry / "layout", tag

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        """See `RootfsSource.acquire`."""
        layout = self.layout_of(image)
        if layout is None:
            return await self._registry_source().acquire(image, credentials)
        if layout not in self._unpacked:
            self._unpacked[layout] = asyncio.ensure_future(self._unpack(image, *layout))
        rootfs = await asyncio.shield(self._unpacked[layout])
        return dataclasses.replace(rootfs, image=image)

    async def release(self, rootfs: Rootfs) -> None:
        """See `RootfsSource.release`: a registry's image goes back to its cache; a layout's stays unpacked
        until the run ends."""
        if self._registry is not None:
            await self._registry.release(rootfs)

    async def close(self) -> None:
        for task in self._unpacked.values():
            task.cancel()
        if self._registry is not None:
            await self._registry.cache.close()

    def _registry_source(self) -> CachedRootfs:
        if self._registry is None:
            try:
                self._registry = CachedRootfs(ImageCache(self.work / "image-cache"))
            except CacheInUse as e:
                raise ImageUnavailable(str(e)) from e
        return self._registry

    async def _unpack(self, image: str, layout: Path, tag: str) -> Rootfs:
        index = json.loads(await asyncio.to_thread((layout / "index.json").read_bytes))
        found = [m for m in index.get("manifests", [])
                 if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag]
        if not found:
            raise ImageUnavailable(f"the OCI image layout {layout} has no image tagged {tag!r}", final=True)
        digest = found[0]["digest"]
        manifest = json.loads(await asyncio.to_thread(_blob(layout, digest).read_bytes))
        config = json.loads(await asyncio.to_thread(_blob(layout, manifest["config"]["digest"]).read_bytes))
        rootfs = Path(tempfile.mkdtemp(prefix="image-", dir=self.work)) / "rootfs"
        process = await asyncio.create_subprocess_exec(
            "umoci", "raw", "unpack", "--image", f"{layout}:{tag}", str(rootfs),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(UNPACK_TIMEOUT_S):
                _, stderr = await process.communicate()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        if process.returncode != 0:
            raise ImageUnavailable(f"umoci could not unpack {layout}:{tag}: {stderr.decode(errors='replace').strip()}")
        return Rootfs(image=image, digest=digest, path=rootfs, config=ImageConfig.from_oci(config))


def _path_and_tag(reference: str) -> tuple[str, str]:
    """`NAME[:TAG]` or `/PATH[:TAG]` split; the tag `latest` when none is given."""
    head, colon, tag = reference.rpartition(":")
    if not colon or "/" in tag:
        return reference, "latest"
    return head, tag


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hex_digest = digest.partition(":")
    return layout / "blobs" / algorithm / hex_digest


class Containers:
    """The worker's OCI runtime for one LocalBackend run, in an event loop of its own (jobs are run from
    LocalBackend's threads); `close` removes everything it made, containers, cgroups and unpacked images."""

    def __init__(self, tmp_dir: str):
        self.work = Path(tempfile.mkdtemp(prefix="containers-", dir=tmp_dir))
        self.images = LocalImages(self.work, base_image_cache())
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pipeline-containers", daemon=True)
        self._thread.start()
        self._runtime = OciRuntime(OciRuntimeConfig(
            rootfs=self.images, owner=f"pipeline-{os.getpid()}-{uuid.uuid4().hex[:6]}", deployment="pipeline",
            offers_networks=False))
        self._attempts = 0
        self._lock = threading.Lock()

    def missing(self, image: str) -> str | None:
        """Why `image` cannot be had without a registry (a layout or base image that is not there); None when it
        can be, or when a registry is asked for it as the job starts."""
        try:
            self.images.layout_of(image)
        except ImageUnavailable as e:
            return str(e)
        return None

    def run(self, spec: job_spec_pb2.JobSpec, job_id: int) -> tuple[JobOutcome, bytes]:
        """Run `spec` to its end, as a worker runs an attempt: its outcome and its output."""
        with self._lock:
            self._attempts += 1
            attempt = str(self._attempts)
        spec.network_mode = job_spec_pb2.NETWORK_MODE_NONE
        run = JobRun(batch_id=0, job_id=job_id, attempt_id=attempt, spec=spec, cores_mcpu=spec.resources.cores_mcpu,
                     memory_bytes=spec.resources.memory_bytes, scratch=self.work,
                     storage_bytes=spec.resources.storage_bytes)
        run.attempt_dir.mkdir()
        return asyncio.run_coroutine_threadsafe(self._run(run), self._loop).result()

    async def _run(self, run: JobRun) -> tuple[JobOutcome, bytes]:
        async def started(pid: int) -> None:
            pass

        log = LogSink(run.log_path)
        outcome = await self._runtime.run(run, log, started)
        return outcome, log.read()

    def close(self) -> None:
        async def close() -> None:
            await self._runtime.close()
            await self.images.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            shutil.rmtree(self.work, ignore_errors=True)
