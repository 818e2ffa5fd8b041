"""The worker's OCI tools: skopeo reads registries, umoci unpacks images. The one I/O boundary of the
image cache (services.worker.images), behind the narrow `ImageTools` interface.

Every run has a deadline and is killed past it, so a registry that accepts a connection and never
answers cannot hold a pull forever. Every run dies with the worker (services.common.parent_death),
so nothing is left writing into the cache after a worker is killed. A failure becomes an
`ImagePullError` carrying skopeo's (that is, the registry's) own words, sorted into a `PullFailure`
where they say which.

Credentials never reach a command line (which every local account can read): the cache writes them
to an auth file (0600, in a private directory) and passes its path. A pull without credentials
passes `--no-creds`: a job's anonymous pull never borrows credentials the worker's account may hold
(`~/.docker/config.json`, `$XDG_RUNTIME_DIR/containers/auth.json`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import os
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from services.common.image_refs import ImageReference
from services.common.parent_death import launcher
from services.common.registry_logins import Credentials
from services.worker.egress import REFUSAL_REASON, UNREACHABLE_REASONS

__all__ = ["Credentials", "ImagePullError", "ImageTools", "PullFailure", "SkopeoUmoci", "ToolTimeouts"]

LAYOUT_TAG = "image"
"""The tag an image is fetched under in its own, one-image OCI layout."""


class PullFailure(enum.Enum):
    """Why a pull failed, as far as the registry's words tell; its value is what the job's user is told
    (corral's words: never the registry's address, the network's answer or skopeo's own words, which go
    to the worker's log for its operator)."""

    NOT_FOUND = "no such image"
    """No such repository, tag or digest."""
    UNAUTHORIZED = "not authorised"
    """The registry wants credentials, or refused the ones given."""
    UNREACHABLE = "registry unreachable"
    """Nothing answers at the registry's address, or not in the protocol expected (HTTP/HTTPS, TLS)."""
    TIMED_OUT = "timed out"
    """A step outlived its deadline (the registry accepted the connection but did not answer in time)."""
    REFUSED = "registry not allowed: a job's image comes from a public registry, or from one this deployment allows"
    """The registry is one a job's image may not come from (services.common.registry_rules): its host is, or
    now resolves to, an internal address; or it sent the pull to one (services.worker.egress refused the
    connection)."""
    FAILED = "the image could not be pulled or unpacked"
    """Anything else (a corrupt image, an unpack that failed, a full disk)."""


class ImagePullError(Exception):
    """An image could not be pulled. `detail` is the tool's own last words (the registry's reason), for the
    worker's log; `user_words` is what the job's user is told."""

    def __init__(self, reference: str, failure: PullFailure, detail: str, user_words: str | None = None):
        super().__init__(f"pulling {reference}: {failure.value}: {detail}")
        self.reference = reference
        self.failure = failure
        self.detail = detail
        self.user_words = user_words or failure.value
        """Corral's words for the failure: its kind (`PullFailure`'s value), or where corral itself refused
        the registry, why (services.common.registry_rules' words, about the reference the user wrote)."""


class ImageTools(Protocol):
    """What the cache needs of the outside world."""

    async def manifest(self, reference: ImageReference, plain_http: bool, auth_file: Path | None) -> bytes:
        """The raw manifest `reference` names (its sha256 is the image's digest)."""

    async def fetch(self, reference: ImageReference, plain_http: bool, auth_file: Path | None, layout: Path) -> None:
        """Copy the image into a new OCI layout at `layout`, tagged `LAYOUT_TAG`."""

    async def unpack(self, layout: Path, rootfs: Path) -> None:
        """Unpack the layout's `LAYOUT_TAG` image's layers into `rootfs` (which must not exist)."""


@dataclasses.dataclass(frozen=True)
class ToolTimeouts:
    """Deadlines of each step (seconds)."""

    manifest_s: float = 30.0
    """Reading a manifest (resolving a tag, checking access)."""
    fetch_s: float = 900.0
    """Copying an image's blobs from the registry."""
    unpack_s: float = 900.0
    """Unpacking its layers."""


_SKOPEO_MESSAGE = re.compile(r'msg="((?:[^"\\]|\\.)*)"')
_IMAGE_NAME_PREFIX = re.compile(r'^(?:Error parsing image name|Error initializing source) "[^"]*": ')
_FAILURE_WORDS: Sequence[tuple[PullFailure, tuple[str, ...]]] = (
    (PullFailure.REFUSED, (REFUSAL_REASON,)),  # the worker's own egress proxy said no
    # Words, not status numbers: a digest in the message may hold "401".
    (PullFailure.UNAUTHORIZED, ("unauthorized", "authentication required", "access to the resource is denied",
                                "denied: ", "forbidden", "invalid username/password")),
    (PullFailure.UNREACHABLE, ("connection refused", "no such host", "i/o timeout", "network is unreachable",
                               "connection reset", "no route to host", "server gave http response to https client",
                               "tls: ", "x509: ", "unexpected eof", ": eof", "pinging container registry",
                               *UNREACHABLE_REASONS)),
    (PullFailure.NOT_FOUND, ("manifest unknown", "name unknown", "not found", "blob unknown")),
)


def reason(stderr: str) -> str:
    """The message of skopeo's fatal line (`time=... level=fatal msg="..."`), without the image name
    it repeats; otherwise the output's last line. At most 1000 characters."""
    messages = _SKOPEO_MESSAGE.findall(stderr)
    if messages:
        text = re.sub(r"\\(.)", r"\1", messages[-1])
        text = _IMAGE_NAME_PREFIX.sub("", text)
    else:
        lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else "(no message)"
    return text[:1000]


def classify(detail: str) -> PullFailure:
    """Which failure the registry's words describe (FAILED when none)."""
    lowered = detail.lower()
    for failure, words in _FAILURE_WORDS:
        if any(word in lowered for word in words):
            return failure
    return PullFailure.FAILED


class SkopeoUmoci:
    """`ImageTools` with Debian's skopeo and umoci (scripts/setup.sh --for run installs both)."""

    def __init__(self, timeouts: ToolTimeouts = ToolTimeouts(), on_run: Callable[[list[str]], None] | None = None,
                 environment: Mapping[str, str] | None = None):
        self.timeouts = timeouts
        self.on_run = on_run
        """Called with each command's argv just before it runs (tests count runs and read argv)."""
        self.environment = dict(environment or {})
        """Added to the tools' environment: the worker's egress proxy (services.worker.egress), through which
        every connection of skopeo's goes."""
        self._rootless = os.geteuid() != 0

    async def manifest(self, reference: ImageReference, plain_http: bool, auth_file: Path | None) -> bytes:
        argv = ["skopeo", "inspect", "--raw", f"--tls-verify={str(not plain_http).lower()}",
                *(["--authfile", str(auth_file)] if auth_file else ["--no-creds"]), reference.docker_transport]
        return await self._run(argv, str(reference), self.timeouts.manifest_s)

    async def fetch(self, reference: ImageReference, plain_http: bool, auth_file: Path | None, layout: Path) -> None:
        layout.mkdir(parents=True)
        argv = ["skopeo", "copy", "--quiet", f"--src-tls-verify={str(not plain_http).lower()}",
                *(["--src-authfile", str(auth_file)] if auth_file else ["--src-no-creds"]),
                reference.docker_transport, f"oci:{layout}:{LAYOUT_TAG}"]
        await self._run(argv, str(reference), self.timeouts.fetch_s)

    async def unpack(self, layout: Path, rootfs: Path) -> None:
        # As root, files keep the owners the image gives them; otherwise umoci maps them to us.
        argv = ["umoci", "raw", "unpack", *(["--rootless"] if self._rootless else []),
                "--image", f"{layout}:{LAYOUT_TAG}", str(rootfs)]
        await self._run(argv, str(layout), self.timeouts.unpack_s, unpacking=True)

    async def _run(self, argv: list[str], what: str, timeout_s: float, unpacking: bool = False) -> bytes:
        if shutil.which(argv[0]) is None:
            raise ImagePullError(what, PullFailure.FAILED,
                                 f"{argv[0]} is not installed (scripts/setup.sh --for run installs it)")
        if self.on_run is not None:
            self.on_run(list(argv))
        process = await asyncio.create_subprocess_exec(
            *launcher(), *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, **self.environment} if self.environment else None)
        try:
            async with asyncio.timeout(timeout_s):
                stdout, stderr = await process.communicate()
        except TimeoutError:
            raise ImagePullError(what, PullFailure.TIMED_OUT,
                                 f"{argv[0]} {argv[1]} did not finish within {timeout_s:g} s") from None
        finally:
            if process.returncode is None:  # timed out, or the pull was cancelled: nothing outlives it
                process.kill()
                await process.wait()
        if process.returncode != 0:
            detail = reason(stderr.decode(errors="replace"))
            raise ImagePullError(what, PullFailure.FAILED if unpacking else classify(detail), detail)
        return stdout
