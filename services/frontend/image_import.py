"""An image archive, checked and copied into corral's own registry (`corral images import`).

The archive arrives in chunks and is written to a private temporary directory (0700, removed afterwards,
whatever happens), counting its bytes against `max_image_import_bytes`. Then:

1. `inspect_archive` reads the tar's index (never extracting anything): a `docker save` archive has a
   `manifest.json` naming one image and its layers; an OCI image layout (`skopeo copy ... oci-archive:`)
   has an `oci-layout` file and an `index.json` naming one image manifest, whose blob lists the layers.
   Anything else (a compressed tar, several images, an index of platforms, more layers than
   `max_image_layers`) is refused, saying what was found.
2. `copy_to_registry`: `skopeo copy docker-archive:FILE` (or `oci-archive:`) to `docker://REGISTRY/
   PROJECT/NAME:TAG`, the push login in an auth file (services.common.registry_logins.auth_file), never on
   the command line, and skopeo's own temporary files in the same private directory. skopeo checks every
   blob's digest as it copies and writes the manifest last, so a failed import leaves the tag as it was
   (blobs it copied are unreferenced, and go at the registry's garbage collection).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import tarfile
from pathlib import Path

from services.common.registry_logins import Credentials, auth_file

DOCKER_ARCHIVE = "docker-archive"
OCI_ARCHIVE = "oci-archive"
OCI_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                   "application/vnd.docker.distribution.manifest.list.v2+json")
MAX_MEMBERS = 100_000
"""Most entries read from an archive's index: an image has a few per layer."""
MAX_METADATA_BYTES = 4 * 1024 * 1024
"""Largest manifest.json, index.json or manifest blob read."""
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class BadArchive(ValueError):
    """An archive that is not one image corral imports (the message says what was found)."""


@dataclasses.dataclass(frozen=True)
class Archive:
    """What an archive holds."""

    transport: str
    """skopeo's transport for it: docker-archive or oci-archive."""
    layers: int


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo, what: str) -> bytes:
    if not member.isfile() or member.size > MAX_METADATA_BYTES:
        raise BadArchive(f"its {what} is not a file of at most {MAX_METADATA_BYTES:,} bytes")
    extracted = tar.extractfile(member)
    assert extracted is not None
    return extracted.read()


def _json(data: bytes, what: str) -> object:
    try:
        return json.loads(data)
    except ValueError:
        raise BadArchive(f"its {what} is not JSON") from None


def inspect_archive(path: Path, max_layers: int) -> Archive:
    """What the tar at `path` holds (see the module docstring); BadArchive if it is not one image of at most
    `max_layers` layers in either format."""
    try:
        tar = tarfile.open(path, "r:")
    except (tarfile.TarError, OSError):
        raise BadArchive("it is not a tar archive (a compressed one? import the .tar itself: `docker save -o "
                         "FILE.tar IMAGE` or `skopeo copy ... docker-archive:FILE.tar`)") from None
    with tar:
        members: dict[str, tarfile.TarInfo] = {}
        try:
            for i, member in enumerate(tar):
                if i >= MAX_MEMBERS:
                    raise BadArchive(f"it has more than {MAX_MEMBERS:,} entries")
                members.setdefault(member.name.removeprefix("./"), member)
        except tarfile.TarError as e:
            raise BadArchive(f"it is not a whole tar archive ({e})") from None
        if "manifest.json" in members:
            manifest = _json(_read(tar, members["manifest.json"], "manifest.json"), "manifest.json")
            if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
                count = len(manifest) if isinstance(manifest, list) else "no"
                raise BadArchive(f"its manifest.json names {count} images: import an archive of one image")
            layers = manifest[0].get("Layers")
            if not isinstance(layers, list):
                raise BadArchive("its manifest.json lists no Layers")
            transport = DOCKER_ARCHIVE
        elif "oci-layout" in members and "index.json" in members:
            index = _json(_read(tar, members["index.json"], "index.json"), "index.json")
            manifests = index.get("manifests") if isinstance(index, dict) else None
            if not isinstance(manifests, list) or len(manifests) != 1 or not isinstance(manifests[0], dict):
                count = len(manifests) if isinstance(manifests, list) else "no"
                raise BadArchive(f"its index.json names {count} images: import a layout of one image")
            if manifests[0].get("mediaType") in OCI_INDEX_TYPES:
                raise BadArchive("it holds an index of several platforms: import one platform's image "
                                 "(skopeo copy --override-arch ...)")
            digest = str(manifests[0].get("digest", ""))
            blob = members.get(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            if not _DIGEST.fullmatch(digest) or blob is None:
                raise BadArchive("its index.json names a manifest the layout does not hold")
            document = _json(_read(tar, blob, "image manifest"), "image manifest")
            layers = document.get("layers") if isinstance(document, dict) else None
            if not isinstance(layers, list):
                raise BadArchive("its image manifest lists no layers")
            transport = OCI_ARCHIVE
        else:
            raise BadArchive("it is neither a `docker save` archive (no manifest.json) nor an OCI image layout "
                             "(no oci-layout and index.json)")
    if len(layers) > max_layers:
        raise BadArchive(f"its image has {len(layers)} layers, more than {max_layers} (max_image_layers): squash it")
    return Archive(transport, len(layers))


class CopyFailed(Exception):
    """skopeo did not copy the image; `unreachable` when the registry could not be reached."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


UNREACHABLE = ("connection refused", "no such host", "i/o timeout", "connection reset", "dial tcp")


async def copy_to_registry(archive: Path, kind: Archive, registry: str, plain_http: bool, login: Credentials,
                           repository: str, tag: str, work: Path, timeout_s: float) -> str:
    """Copy the image of `archive` to `registry/repository:tag` with skopeo; its manifest digest there.
    `work` is a private directory (skopeo's temporary files go there). CopyFailed with skopeo's last words,
    the paths of `work` left out."""
    digest_file = work / "digest"
    with auth_file(registry, login, parent=work) as auth:
        argv = ["skopeo", "copy", "--quiet", f"--dest-tls-verify={str(not plain_http).lower()}",
                "--dest-authfile", str(auth), "--digestfile", str(digest_file),
                f"{kind.transport}:{archive}", f"docker://{registry}/{repository}:{tag}"]
        process = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "TMPDIR": str(work)}, start_new_session=True)
        try:
            async with asyncio.timeout(timeout_s):
                _, stderr = await process.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
            raise
    if process.returncode != 0:
        words = stderr.decode(errors="replace").strip().splitlines()
        last = (words[-1] if words else f"skopeo exited with {process.returncode}").replace(str(work), "...")
        raise CopyFailed(last, unreachable=any(u in last.lower() for u in UNREACHABLE))
    return digest_file.read_text().strip()
