"""Who may run an image of corral's own registry. Pure functions over a parsed reference.

corral's own registry (the one `localhost/` names, also reached at its real address, `127.0.0.1:PORT`)
holds two kinds of repositories (docs/images.md):

- `PROJECT/NAME`: a billing project's imported images (`corral images import`), which only the
  project's members run;
- everything else: `docker.io/...` (the mirror of Docker Hub's images, the base images among them) and
  repositories of a single component (what `corral up` itself pushed), which every job may run.

The answer is decided on the name alone: a job that names another project's image is refused whether or
not that project, or its image, exists, so a refusal tells nobody which projects or images there are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from services.common.image_refs import ImageReference, InvalidImageReference, Registry, parse_reference
from services.common.registry_rules import RegistryHost

OWN_NAME = "localhost"
"""How references name corral's own registry, whatever its address (docs/images.md)."""

PUBLIC_PREFIXES = ("docker.io/",)
"""Repositories of corral's registry that every job may run, whoever submits it."""


def own_registry_keys(*registries: str | None) -> frozenset[str]:
    """What tells corral's own registry apart (`RegistryHost.key`): `localhost` and each of `registries` (URLs
    or `host[:port]`, as `Registry.parse` reads them; None ones left out)."""
    names = [OWN_NAME, *(Registry.parse(r).host for r in registries if r)]
    return frozenset(RegistryHost.parse(name).key for name in names)


def image_project(reference: ImageReference, own_registries: Collection[str]) -> str | None:
    """The billing project whose private image `reference` names: the first component of a repository of
    two or more in corral's own registry (`own_registries`: `own_registry_keys`) that is not public; None for
    every other image."""
    try:
        key = RegistryHost.parse(reference.registry).key
    except InvalidImageReference:
        return None  # not a registry a job may pull from at all: image_checks refuses it
    if key not in own_registries or reference.repository.startswith(PUBLIC_PREFIXES):
        return None
    project, slash, _ = reference.repository.partition("/")
    return project if slash else None


def access_refusal(reference: ImageReference, own_registries: Collection[str], user_projects: Collection[str]
                   ) -> str | None:
    """Why the user, a member of `user_projects`, may not run `reference`; None if they may."""
    project = image_project(reference, own_registries)
    if project is None or project in user_projects:
        return None
    return (f"image {reference} is a private image of billing project {project}: only its members run it "
            "(import your own with `corral images import`)")


@dataclasses.dataclass(frozen=True)
class OwnRegistryNames:
    """How a deployment names corral's own registry, for the checks above."""

    keys: frozenset[str] = frozenset({f"{OWN_NAME}:443"})
    """`own_registry_keys` of its addresses."""

    @classmethod
    def of(cls, *addresses: str | None) -> OwnRegistryNames:
        """corral's own registry by its addresses (URLs: the one the workers pull from, the push one)."""
        return cls(own_registry_keys(*addresses))

    def project_of(self, image: str) -> tuple[ImageReference, str] | None:
        """The job's image, parsed, and the project whose private image it is; None if it is nobody's (or
        not a reference: image_checks refuses it)."""
        try:
            reference = parse_reference(image)
        except InvalidImageReference:
            return None
        project = image_project(reference, self.keys)
        return None if project is None else (reference, project)
