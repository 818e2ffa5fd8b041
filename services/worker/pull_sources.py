"""Where a worker asks for a job's image, in order, and with which login. Pure functions over references.

- `localhost/REPO` (or the own registry's real address) is corral's own registry: asked at its address,
  with the deployment's pull login, never the job's pull secret (which is for other registries).
- A reference of a registry with a mirror (`--registry-mirror REGISTRY=URL`) is asked at the mirror first
  (its prefix + the repository), then at its registry: containerd's hosts.toml order. The mirror is asked
  with the deployment's login when it is the own registry, else anonymously: the job's secret is for the
  registry it names, not for a mirror's host.
- Anything else is asked at the registry it names, with the job's pull secret if it has one: over HTTPS,
  unless the deployment allows it written `http://` (`--allowed-registries http://10.0.0.5:5000`: a
  registry on its private network without TLS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from services.common.image_refs import ImageReference, InvalidImageReference, Mirror, Registry, names_own_registry


@dataclasses.dataclass(frozen=True)
class Source:
    """One place to ask for an image."""

    reference: ImageReference
    """The image there (registry, repository, tag or digest)."""
    plain_http: bool
    """Whether that registry is reached over plain HTTP."""
    own: bool
    """Whether it is corral's own registry: asked with the deployment's login, and what it serves every
    job may use (public)."""
    mirror: bool = False
    """Whether it is a mirror of the registry the reference names (then another source follows)."""


def pull_sources(ref: ImageReference, own: Registry | None, mirrors: Sequence[Mirror] = (),
                 plain_http: Collection[str] = ()) -> list[Source]:
    """Where to ask for `ref`, in order (see the module docstring); `plain_http`: the registries (host[:port])
    reached over plain HTTP. InvalidImageReference for `localhost/...` when the deployment has no registry of
    its own."""
    if names_own_registry(ref, own):
        if own is None:
            raise InvalidImageReference(f"image {ref}: localhost/... names corral's own registry, and this "
                                        "deployment has none")
        return [Source(ImageReference(own.host, ref.repository, ref.tag, ref.digest), own.plain_http, own=True)]
    sources = [Source(mirror.locate(ref), mirror.endpoint.plain_http,
                      own=own is not None and mirror.endpoint.host == own.host, mirror=True)
               for mirror in mirrors if mirror.registry == ref.registry]
    return [*sources, Source(ref, ref.registry in plain_http, own=False)]
