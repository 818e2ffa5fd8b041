"""Image references as jobs write them, resolved to what a registry serves. Pure functions over strings.

A reference is `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`, the grammar of the distribution
project's `reference` package (what docker, podman and skopeo accept), with these rules:

- **Registry.** The first `/`-separated part names the registry if it holds a `.` or a `:` or is
  `localhost` (`127.0.0.1:5000/busybox`, `ghcr.io/org/tool`, `localhost/x`); a registry is a host
  name, an IPv4 address or a bracketed IPv6 address, with an optional port. Otherwise the whole
  reference is a repository of the **default registry** (a deployment setting: `corral up`'s own
  loopback registry), and a bare name without one configured is refused.
- **Repository.** Lowercase path components (`[a-z0-9]` runs joined by `.`, `_`, `__` or dashes),
  kept exactly as written: `busybox` is `DEFAULT/busybox`, as corral's registry stores it, not
  `DEFAULT/library/busybox`. The one exception is Docker Hub's own convention: on `docker.io`
  (also written `index.docker.io` or `registry-1.docker.io`), a one-component repository is an
  official image under `library/`, so `docker.io/ubuntu` is `docker.io/library/ubuntu`, there and
  when docker.io is the default registry.
- **Tag and digest.** A tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; without tag or digest it is
  `latest`. A digest is `sha256:` and 64 lowercase hex digits (the only algorithm registries use).
  Given both (`busybox:1.36@sha256:...`), the digest decides what runs and the tag is kept for
  display only.
- **Length.** Registry and repository together at most 255 characters.

Anything else is refused with `InvalidImageReference`, which says what is wrong and where.
"""

from __future__ import annotations

import dataclasses
import re

MAX_NAME_LENGTH = 255
"""Longest `registry/repository`, the distribution project's limit."""
DEFAULT_TAG = "latest"
DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_HOST_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = re.compile(rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class InvalidImageReference(ValueError):
    """A reference that is not one (the message says why, naming the reference)."""


@dataclasses.dataclass(frozen=True)
class Registry:
    """A registry as a deployment names it: `http://127.0.0.1:5000` (plain HTTP: only for registries
    on loopback or a private network), `https://registry.example.com` or `registry.example.com`
    (HTTPS with verified certificates)."""

    host: str
    """host[:port], as references name it."""
    plain_http: bool = False
    """Whether it is reached over plain HTTP (no TLS)."""

    @classmethod
    def parse(cls, url: str) -> Registry:
        """`http://HOST[:PORT]`, `https://HOST[:PORT]` or `HOST[:PORT]`; a trailing `/` is ignored."""
        text = url.strip()
        plain_http = False
        for scheme, plain in (("http://", True), ("https://", False)):
            if text.startswith(scheme):
                text, plain_http = text[len(scheme):], plain
                break
        else:
            if "://" in text:
                raise InvalidImageReference(f"registry {url!r}: only http:// and https:// registries are supported")
        text = text.rstrip("/")
        if not _HOST.fullmatch(text):
            raise InvalidImageReference(f"registry {url!r}: not HOST[:PORT] (a path, user or query is not allowed)")
        return cls(_canonical_host(text), plain_http)

    @property
    def url(self) -> str:
        """As `parse` reads it back."""
        return f"{'http' if self.plain_http else 'https'}://{self.host}"


@dataclasses.dataclass(frozen=True)
class ImageReference:
    """A fully resolved reference: which registry, repository, and tag or digest."""

    registry: str
    """host[:port]."""
    repository: str
    """Path in the registry, e.g. `busybox` or `library/ubuntu`."""
    tag: str | None = None
    """The tag, if one was given (or defaulted: `latest` when there is no digest)."""
    digest: str | None = None
    """`sha256:...`, if the reference pins one: then it decides what runs."""

    @property
    def name(self) -> str:
        """`registry/repository`."""
        return f"{self.registry}/{self.repository}"

    def __str__(self) -> str:
        """The canonical form: `registry/repository[:tag][@digest]`."""
        return self.name + (f":{self.tag}" if self.tag else "") + (f"@{self.digest}" if self.digest else "")

    def at(self, digest: str) -> ImageReference:
        """This repository pinned at `digest` (no tag): what is fetched once a tag is resolved."""
        if not _DIGEST.fullmatch(digest):
            raise InvalidImageReference(f"{digest!r} is not a sha256 digest")
        return ImageReference(self.registry, self.repository, None, digest)

    @property
    def docker_transport(self) -> str:
        """skopeo's name for it (`docker://registry/repository@digest`, else `:tag`); never both:
        skopeo refuses references that carry both."""
        return f"docker://{self.name}" + (f"@{self.digest}" if self.digest else f":{self.tag or DEFAULT_TAG}")


def _canonical_host(host: str) -> str:
    return DOCKER_HUB if host.lower() in _DOCKER_HUB_ALIASES else host


def _is_registry(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost" or part.startswith("[")


_BARE = Registry("<default>")
"""Stands in for the default registry in `named_registry`: no reference can name it."""


def named_registry(text: str) -> str | None:
    """The registry `text` names (host[:port], as `parse_reference` resolves it), or None for a bare name,
    which is the default registry's whatever that is. Raises InvalidImageReference for what
    `parse_reference` refuses (a bare name's length is checked once the default registry is known)."""
    reference = parse_reference(text, _BARE)
    return None if reference.registry == _BARE.host else reference.registry


def parse_reference(text: str, default_registry: Registry | str | None = None) -> ImageReference:
    """Resolve `text` (see the module docstring); bare names go to `default_registry`."""
    if not isinstance(text, str) or not text:
        raise InvalidImageReference("an image reference is required")
    if text != text.strip() or any(c.isspace() or not c.isprintable() for c in text):
        raise InvalidImageReference(f"image {text!r}: must not contain spaces or control characters")
    if "://" in text:
        raise InvalidImageReference(f"image {text!r}: name the image, not a URL (e.g. registry.example.com/repo:tag)")
    remainder, digest = text, None
    if "@" in remainder:
        remainder, _, digest = remainder.partition("@")
        if not _DIGEST.fullmatch(digest):
            raise InvalidImageReference(f"image {text!r}: digest {digest!r} is not sha256: and 64 lowercase hex digits")
    registry_part, slash, path = remainder.partition("/")
    if slash and _is_registry(registry_part):
        if not _HOST.fullmatch(registry_part):
            raise InvalidImageReference(f"image {text!r}: {registry_part!r} is not a registry host[:port]")
        registry = _canonical_host(registry_part)
    else:
        path = remainder
        if default_registry is None:
            raise InvalidImageReference(f"image {text!r} names no registry, and no default registry is configured: "
                                        "write REGISTRY/REPOSITORY[:TAG]")
        registry = (default_registry if isinstance(default_registry, Registry)
                    else Registry.parse(default_registry)).host
    tag = None
    last_slash = path.rfind("/")
    colon = path.rfind(":")
    if colon > last_slash:
        path, tag = path[:colon], path[colon + 1:]
        if not _TAG.fullmatch(tag):
            raise InvalidImageReference(f"image {text!r}: tag {tag!r} is not letters, digits, '_', '.' and '-' "
                                        "(at most 128, not starting with '.' or '-')")
    if not path:
        raise InvalidImageReference(f"image {text!r}: the repository is missing")
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            hint = " (repositories are lowercase)" if component.lower() != component else ""
            raise InvalidImageReference(f"image {text!r}: {component!r} is not a valid repository component{hint}")
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    if len(registry) + 1 + len(path) > MAX_NAME_LENGTH:
        raise InvalidImageReference(f"image {text!r}: registry and repository exceed {MAX_NAME_LENGTH} characters")
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return ImageReference(registry, path, tag, digest)
