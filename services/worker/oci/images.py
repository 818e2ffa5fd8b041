"""What the OCI runtime needs of an image: a read-only root filesystem and the
image's configuration, from a `RootfsSource`.

The worker's image cache (pull by reference, unpack each digest once, count
the attempts using it) is one such source; `DirectoryRootfs` is another, for
development and for workers without a registry: root filesystems unpacked
beforehand under one directory. The runtime never writes into a root
filesystem it is given: each attempt writes to a layer of its own (layer.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from services.worker.image_tools import Credentials, ImagePullError, PullFailure
from services.worker.images import Image, ImageCache

log = logging.getLogger(__name__)

FINAL_PULL_FAILURES = frozenset({PullFailure.NOT_FOUND, PullFailure.UNAUTHORIZED, PullFailure.REFUSED})
"""The registry's own refusals, and corral's of the registry: the spec's (its image, its login), not the
worker's; not tried again."""


class ImageUnavailable(Exception):
    """The image cannot be had (no such image, registry down, refused); the message says why. `final`: the
    registry itself said no (no such image, access refused), so another attempt would be told the same."""

    def __init__(self, message: str, final: bool = False):
        super().__init__(message)
        self.final = final


@dataclass(frozen=True)
class ImageConfig:
    """What the runtime uses of an image's configuration (the OCI image config's `config` object)."""

    env: tuple[str, ...] = ()
    """`NAME=value` entries the image sets; the job's env is added over them."""
    working_dir: str = ""
    """Where the command starts ('' = the job's work directory, /io)."""
    user: str = ""
    """The image's user. Not used: every attempt runs as a uid of its own (see OciRuntime)."""
    entrypoint: tuple[str, ...] = ()
    """Not used: a job's argv (or script) is the whole command, as if the entrypoint were overridden."""
    cmd: tuple[str, ...] = ()
    """Not used, as entrypoint."""

    @classmethod
    def from_oci(cls, image_config: dict[str, Any]) -> ImageConfig:
        """From an OCI image configuration (the JSON whose `config` holds Env, WorkingDir, User, ...)."""
        config = image_config.get("config") or {}
        return cls(env=tuple(config.get("Env") or ()), working_dir=config.get("WorkingDir") or "",
                   user=config.get("User") or "", entrypoint=tuple(config.get("Entrypoint") or ()),
                   cmd=tuple(config.get("Cmd") or ()))


@dataclass(frozen=True)
class Rootfs:
    """An image's root filesystem, unpacked, held for an attempt between `acquire` and `release`."""

    image: str
    """The reference the job named."""
    digest: str
    """What it resolved to (e.g. 'sha256:…'), for the job's status."""
    path: Path
    """The unpacked root filesystem: read-only to the runtime, shared by every attempt of the image."""
    config: ImageConfig = field(default_factory=ImageConfig)


class RootfsSource(Protocol):
    """Where root filesystems come from (the worker's image cache)."""

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        """The image's root filesystem, kept until `release`, pulled (or checked, if held) with `credentials`
        where it comes from a registry; raises ImageUnavailable (or any exception, whose message says why)
        if it cannot be had."""
        ...

    async def release(self, rootfs: Rootfs) -> None:
        """The attempt is done with it."""
        ...


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*(:[A-Za-z0-9_][A-Za-z0-9._-]*)?")


class DirectoryRootfs:
    """Root filesystems unpacked beforehand: the image `NAME[:TAG]` is the directory `root/NAME[:TAG]`,
    holding `rootfs/` and, optionally, the image's configuration as `config.json` (the layout `umoci
    unpack` leaves, whose runtime config carries the image's env and working directory). Its digest is
    that of the directory's name and configuration: this source does not know the image's. Nothing is
    pulled; an image that is not there is unavailable."""

    def __init__(self, root: Path):
        self.root = root

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        """See `RootfsSource.acquire`; `credentials` are not used: nothing comes from a registry."""
        if not _NAME.fullmatch(image) or ".." in image.split("/"):
            raise ImageUnavailable(f"image {image!r} is not a plain NAME[:TAG] naming a directory under {self.root}")
        path = self.root / image
        if not (path / "rootfs").is_dir():
            raise ImageUnavailable(f"no image {image!r} here: {path}/rootfs is not a directory")
        config_path = path / "config.json"
        raw = await asyncio.to_thread(config_path.read_bytes) if config_path.exists() else b"{}"
        try:
            config = _image_config(json.loads(raw))
        except (ValueError, TypeError, AttributeError) as e:
            raise ImageUnavailable(f"image {image!r}: {config_path} is not an image configuration: {e}") from e
        digest = "dir:sha256:" + hashlib.sha256(os.fsencode(image) + b"\0" + raw).hexdigest()
        return Rootfs(image=image, digest=digest, path=path / "rootfs", config=config)

    async def release(self, rootfs: Rootfs) -> None:
        pass


class CachedRootfs:
    """The worker's image cache (services/worker/images.py) as a source: the image is pulled from its
    registry unless held (each digest pulled and unpacked once, whatever the number of attempts), held
    while an attempt runs it, so never evicted then. A pull that fails is ImageUnavailable in corral's
    words (no such image, not authorised, registry unreachable...); the registry's own, with its address,
    go to the worker's log only."""

    def __init__(self, cache: ImageCache):
        self.cache = cache
        self._held: dict[int, Image] = {}
        """id() of each Rootfs handed out -> the cache's Image to release."""

    async def acquire(self, image: str, credentials: Credentials | None = None) -> Rootfs:
        """See `RootfsSource.acquire`. A private image the cache holds is handed out only after the registry
        accepts `credentials` for it (services.worker.images, *Private images*)."""
        try:
            held = await self.cache.acquire(image, credentials)
        except ImagePullError as e:
            log.warning("image %r: %s", image, e)  # the registry's words and address: the operator's
            raise ImageUnavailable(e.user_words, final=e.failure in FINAL_PULL_FAILURES) from e
        rootfs = Rootfs(image=image, digest=held.digest, path=held.rootfs, config=ImageConfig.from_oci(held.config))
        self._held[id(rootfs)] = held
        return rootfs

    async def release(self, rootfs: Rootfs) -> None:
        if (held := self._held.pop(id(rootfs), None)) is not None:
            self.cache.release(held)


def _image_config(document: dict[str, Any]) -> ImageConfig:
    """An OCI image configuration, or the runtime configuration `umoci unpack` generates from one."""
    if "process" in document:  # a runtime config.json: the image's env, cwd and user are in `process`
        process = document["process"]
        return ImageConfig(env=tuple(process.get("env") or ()), working_dir=process.get("cwd") or "")
    return ImageConfig.from_oci(document)
