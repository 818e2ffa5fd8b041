"""Image references as jobs write them, resolved to what a registry serves. Pure functions over strings.

A reference is `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`, the grammar of the distribution
project's `reference` package, read as docker, podman and skopeo read it:

- **Registry.** The first `/`-separated part names the registry if it holds a `.` or a `:` or is
  `localhost` (`127.0.0.1:5000/busybox`, `ghcr.io/org/tool`, `localhost/x`); a registry is a host
  name, an IPv4 address or a bracketed IPv6 address, with an optional port. Otherwise the whole
  reference is a repository of **Docker Hub** (`docker.io`), as every container tool reads it.
- **corral's own registry.** `localhost` exactly (no port) names the registry of the deployment
  (`OWN_REGISTRY`; `corral up`'s, or the operator's `--own-registry`), as podman names its local store:
  `localhost/PROJECT/NAME:TAG` is repository `PROJECT/NAME` there. Its real address names it too
  (`names_own_registry`). `localhost:PORT` is an ordinary registry host (and services.common.registry_rules
  refuses it: this machine).
- **Repository.** Lowercase path components (`[a-z0-9]` runs joined by `.`, `_`, `__` or dashes). On
  Docker Hub (also written `index.docker.io` or `registry-1.docker.io`), a one-component repository is an
  official image under `library/`: `ubuntu:24.04` is `docker.io/library/ubuntu:24.04`, `lab/tool` is
  `docker.io/lab/tool:latest`.
- **Tag and digest.** A tag is `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; without tag or digest it is
  `latest`. A digest is `sha256:` and 64 lowercase hex digits (the only algorithm registries use).
  Given both (`busybox:1.36@sha256:...`), the digest decides what runs and the tag is kept for
  display only.
- **Length.** Registry and repository together at most 255 characters.

Anything else is refused with `InvalidImageReference`, which says what is wrong and where. `str()` of a
parsed reference is its canonical form, which parses to itself.

**Mirrors** (`Mirror`, `--registry-mirror REGISTRY=URL`, as containerd's hosts configuration): a pull of
`REGISTRY/REPO:TAG` asks `HOST[:PORT]/PREFIX/REPO:TAG` of the mirror's URL first, then `REGISTRY` itself.
"""

from __future__ import annotations

import dataclasses
import re

MAX_NAME_LENGTH = 255
"""Longest `registry/repository`, the distribution project's limit."""
DEFAULT_TAG = "latest"
DOCKER_HUB = "docker.io"
"""Where a bare name (`ubuntu`, `lab/tool`) is, as every container tool reads it."""
OWN_REGISTRY = "localhost"
"""What names corral's own registry in references (`localhost/PROJECT/NAME:TAG`), as podman names its store."""
_DOCKER_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_HOST_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_HOST = re.compile(rf"(?:{_HOST_LABEL}(?:\.{_HOST_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{{1,5}})?")
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_IMAGE_ID = re.compile(r"[0-9a-f]{64}")


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
    return "." in part or ":" in part or part == OWN_REGISTRY or part.startswith("[")


def parse_reference(text: str) -> ImageReference:
    """Resolve `text` (see the module docstring): bare names are Docker Hub's."""
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
        path, registry = remainder, DOCKER_HUB
        if _IMAGE_ID.fullmatch(path):  # docker reads it as an image's ID, not a name
            raise InvalidImageReference(f"image {text!r}: a 64-digit hexadecimal name is an image ID, "
                                        "not a repository (write REPOSITORY@sha256:DIGEST)")
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


def names_own_registry(ref: ImageReference, own: Registry | None) -> bool:
    """Whether `ref` is of corral's own registry: `localhost/...`, or its real address (`own`'s host)."""
    return ref.registry == OWN_REGISTRY or (own is not None and ref.registry == own.host)


@dataclasses.dataclass(frozen=True)
class Mirror:
    """`REGISTRY=URL[/PREFIX]` (`--registry-mirror`): pulls of REGISTRY's images ask the mirror first."""

    registry: str
    """The registry mirrored, as references name it (`docker.io`)."""
    endpoint: Registry
    """Where the mirror is (its scheme says whether it is plain HTTP)."""
    prefix: str = ""
    """Repository path the mirror keeps REGISTRY's repositories under (`docker.io`), or ''."""

    @classmethod
    def parse(cls, text: str) -> Mirror:
        """`REGISTRY=http[s]://HOST[:PORT][/PREFIX]` (or `REGISTRY=HOST[:PORT][/PREFIX]`, HTTPS); ValueError
        (InvalidImageReference) saying what is wrong."""
        registry, equals, url = text.strip().partition("=")
        if not equals or not registry or not url:
            raise InvalidImageReference(f"mirror {text!r}: not REGISTRY=URL "
                                        "(e.g. docker.io=https://mirror.example.com)")
        if not _HOST.fullmatch(registry):
            raise InvalidImageReference(f"mirror {text!r}: {registry!r} is not a registry host[:port]")
        if registry == OWN_REGISTRY:
            raise InvalidImageReference(f"mirror {text!r}: {OWN_REGISTRY!r} names corral's own registry, "
                                        "which has no mirror")
        scheme, found, rest = url.partition("://")
        host, _, prefix = (rest if found else url).partition("/")
        endpoint = Registry.parse(f"{scheme}://{host}" if found else host)
        prefix = prefix.strip("/")
        if prefix and not all(_COMPONENT.fullmatch(component) for component in prefix.split("/")):
            raise InvalidImageReference(f"mirror {text!r}: prefix {prefix!r} is not a repository path "
                                        "(lowercase components)")
        return cls(_canonical_host(registry), endpoint, prefix)

    def __str__(self) -> str:
        """As `parse` reads it back."""
        return f"{self.registry}={self.endpoint.url}" + (f"/{self.prefix}" if self.prefix else "")

    def locate(self, ref: ImageReference) -> ImageReference:
        """Where the mirror keeps `ref` (one of the mirrored registry's): its host, the prefix and the
        repository; tag and digest kept."""
        repository = f"{self.prefix}/{ref.repository}" if self.prefix else ref.repository
        return ImageReference(self.endpoint.host, repository, ref.tag, ref.digest)
