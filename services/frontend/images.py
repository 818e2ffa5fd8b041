"""ImageService: billing projects' images in corral's own registry (`corral images`, docs/images.md).

A project's image lives at repository `PROJECT/NAME` of corral's registry and is written
`localhost/PROJECT/NAME:TAG`; the base images are `docker.io/library/NAME`, everybody's. Who may do what
is SecretService's rule (services.frontend.secrets): members and administrators import and delete, whoever
may read the project lists, anybody else gets NOT_FOUND "no billing project X". Who may *run* a project's
image is decided at submission (services.frontend.image_access).

ImportImage is a client stream: a header, then the archive in chunks. Checks, in this order: the header's
fields (INVALID_ARGUMENT, every violation at once), the project (NOT_FOUND, PERMISSION_DENIED,
FAILED_PRECONDITION for a deleted one), a free import slot on this replica (RESOURCE_EXHAUSTED), the
archive's size as it arrives (RESOURCE_EXHAUSTED past max_image_import_bytes, reading no further), then
its contents and the copy (services.frontend.image_import: INVALID_ARGUMENT for an archive that is not one
image, UNAVAILABLE for a registry that cannot be reached). The archive is written to a private temporary
directory and removed whatever happens. Without a push login (`--own-registry-push-login-file`) the
frontend imports, lists and deletes nothing: FAILED_PRECONDITION.

ListImages also says how many live workers hold each image (by digest), and lists after the registry's images
the public ones only workers hold, asked of the leading driver (DriverService.ListHeldImages, through the
driver notifier's channels). What a worker pulled with a job's credentials, and any `localhost/...` name (a
project's image), never reach that part: the worker reports only references any job may run
(services.worker.image_report), and this module checks again. No driver answering is no error: the registry's
images are listed alone and `workers_unknown` says why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc

from corral.batch.v1 import image_pb2, image_service_pb2_grpc
from corral.batch.v1 import image_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2
from services.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unavailable,
)
from services.common.identity import Principal, current_principal
from services.common.image_refs import DEFAULT_TAG, InvalidImageReference, names_own_registry, parse_reference
from services.frontend import page_tokens
from services.frontend.image_access import OWN_NAME
from services.frontend.image_import import BadArchive, CopyFailed, copy_to_registry, inspect_archive
from services.frontend.limits import Limits
from services.frontend.notify import DriversUnreachable
from services.frontend.own_registry import OwnRegistry
from services.frontend.secret_store import ProjectAccess, SecretStore
from services.frontend.secrets import may_change, may_see

BASE_PREFIX = "docker.io/library/"
"""Where the base images are (the mirror of Docker Hub's official images)."""
MAX_NAME_CHARS = 128
MAX_PROJECT_CHARS = 100
"""billing_projects.name is VARCHAR(100) (services.frontend.field_limits)."""
HELD_IMAGES_TIMEOUT_S = 3.0
"""How long ListImages waits for the drivers to say what the workers hold (finding the leader included): then
it lists without it. Each driver call has the notifier's own deadline (1 s)."""
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
NAME_RULE = ("one component of an image name: lowercase letters and digits, runs joined by '.', '_', '__' or "
             f"'-' (e.g. my-tool), at most {MAX_NAME_CHARS} characters")
TAG_RULE = "letters, digits, '_', '.' and '-', not starting with '.' or '-', at most 128 characters"


def image_proto(project: str, name: str, tag: str, digest: str, size_bytes: int, layers: int) -> image_pb2.Image:
    reference = f"{OWN_NAME}/{project}/{name}:{tag}" if project else f"{BASE_PREFIX}{name}:{tag}"
    return image_pb2.Image(reference=reference, billing_project=project, name=name, tag=tag, digest=digest,
                           size_bytes=size_bytes, layers=layers)


def name_violations(project_field: str, project: str, name: str, tag: str, prefix: str = "") -> list[FieldViolation]:
    """What is wrong with where an image goes: `localhost/PROJECT/NAME:TAG` must be an image reference
    (services.common.image_refs), NAME one component."""
    violations = [] if project else [FieldViolation(f"{prefix}{project_field}", "required")]
    if len(project) > MAX_PROJECT_CHARS:
        violations.append(FieldViolation(f"{prefix}{project_field}", f"at most {MAX_PROJECT_CHARS} characters"))
    if not name or "/" in name or len(name) > MAX_NAME_CHARS:
        violations.append(FieldViolation(f"{prefix}name", NAME_RULE))
    if violations:
        return violations
    try:
        parse_reference(f"{OWN_NAME}/{project}/{name}:{tag or DEFAULT_TAG}")
    except InvalidImageReference:
        # Which part: each alone against the grammar.
        for field, text, rule in (("name", f"{OWN_NAME}/x/{name}", NAME_RULE),
                                  ("tag", f"{OWN_NAME}/x/x:{tag or DEFAULT_TAG}", TAG_RULE),
                                  (project_field, f"{OWN_NAME}/{project}/x", "a billing project's name")):
            try:
                parse_reference(text)
            except InvalidImageReference:
                violations.append(FieldViolation(f"{prefix}{field}", rule))
        violations = violations or [FieldViolation(f"{prefix}name", NAME_RULE)]
    return violations


class ImageServicer(image_service_pb2_grpc.ImageServiceServicer):
    """See the module docstring."""

    def __init__(self, projects: SecretStore, registry: OwnRegistry | None, limits: Limits = Limits(),
                 temp_dir: Path | None = None, held: HeldImages | None = None):
        self.projects = projects
        """Who belongs to which project (the store SecretService asks)."""
        self.registry = registry
        """None: no push login, no images."""
        self.limits = limits
        self.temp_dir = temp_dir
        """Where archives are held while they are imported (the system's temporary directory if None)."""
        self._imports = asyncio.Semaphore(limits.max_concurrent_image_imports)
        self.held = held
        """Asks the leading driver what the live workers hold (None: this frontend knows no drivers)."""

    def _registry(self) -> OwnRegistry:
        if self.registry is None:
            raise FailedPrecondition("this deployment keeps no images of its own: its frontend has no push login "
                                     "for its registry (operator settings --own-registry-push and "
                                     "--own-registry-push-login-file)")
        return self.registry

    async def _project(self, name: str, principal: Principal, change: bool) -> ProjectAccess:
        project = await self.projects.project(name) if name else None
        if project is None or not may_see(principal, project):
            raise NotFound(f"no billing project {name}")
        if change and not may_change(principal, project):
            raise PermissionDenied(f"only members of billing project {name} and administrators change its images")
        if change and project.state == "deleted":
            raise FailedPrecondition(f"billing project {name} is deleted")
        return project

    async def ImportImage(self, request_iterator: AsyncIterator[pb.ImportImageRequest],
                          context: grpc.aio.ServicerContext) -> pb.ImportImageResponse:
        principal = current_principal()
        limits = self.limits
        try:
            async with asyncio.timeout(limits.max_image_import_s):
                return await self._import(request_iterator, principal)
        except TimeoutError:
            raise DeadlineExceeded(f"the import took longer than this server allows one "
                                   f"({limits.max_image_import_s:g} s: max_image_import_s)") from None

    async def _import(self, requests: AsyncIterator[pb.ImportImageRequest], principal: Principal
                      ) -> pb.ImportImageResponse:
        iterator = requests.__aiter__()
        try:
            first = await iterator.__anext__()
        except StopAsyncIteration:
            raise InvalidRequest(FieldViolation("header", "the first message must be the header")) from None
        if first.WhichOneof("part") != "header":
            raise InvalidRequest(FieldViolation("header", "the first message must be the header"))
        header = first.header
        tag = header.tag or DEFAULT_TAG
        violations = name_violations("billing_project", header.billing_project, header.name, tag, "header.")
        if header.size_bytes < 0:
            violations.append(FieldViolation("header.size_bytes", "must not be negative"))
        if violations:
            raise InvalidRequest(violations)
        await self._project(header.billing_project, principal, change=True)
        if header.size_bytes > self.limits.max_image_import_bytes:
            raise self._too_big()
        registry = self._registry()
        if self._imports.locked():
            raise ResourceExhausted(f"this server already runs {self.limits.max_concurrent_image_imports} imports, "
                                    "the most it runs at once (max_concurrent_image_imports): try again shortly")
        async with self._imports:
            work = Path(tempfile.mkdtemp(prefix="corral-import-", dir=self.temp_dir))  # 0700
            try:
                archive = work / "image.tar"
                await self._receive(iterator, archive, header.size_bytes)
                try:
                    kind = await asyncio.to_thread(inspect_archive, archive, self.limits.max_image_layers)
                except BadArchive as e:
                    raise InvalidRequest(FieldViolation("chunk", f"the archive is not an image corral imports: {e}"))
                repository = f"{header.billing_project}/{header.name}"
                try:
                    digest = await copy_to_registry(archive, kind, registry.address, registry.registry.plain_http,
                                                    registry.login, repository, tag, work,
                                                    self.limits.max_image_import_s)
                except CopyFailed as e:
                    if e.unreachable:
                        raise Unavailable("corral's registry could not be reached; try again later") from None
                    raise InvalidRequest(FieldViolation("chunk", f"the archive could not be imported: {e}")) from None
            finally:
                await asyncio.to_thread(shutil.rmtree, work, True)
        manifest = await registry.manifest(repository, digest)
        size, layers = (manifest.size_bytes, manifest.layers) if manifest else (0, kind.layers)
        return pb.ImportImageResponse(image=image_proto(header.billing_project, header.name, tag, digest, size,
                                                        layers))

    def _too_big(self) -> ResourceExhausted:
        return ResourceExhausted(f"the archive is larger than {self.limits.max_image_import_bytes:,} bytes, the most "
                                 "this server imports (max_image_import_bytes)")

    async def _receive(self, iterator: AsyncIterator[pb.ImportImageRequest], archive: Path, declared: int) -> None:
        """Write the chunks to `archive`, refusing (and reading no further) past max_image_import_bytes, or past
        the size the header `declared` (0: none)."""
        limit = self.limits.max_image_import_bytes
        received = 0
        with open(archive, "xb") as out:
            async for message in iterator:
                if message.WhichOneof("part") != "chunk":
                    raise InvalidRequest(FieldViolation("header", "only the first message is a header"))
                received += len(message.chunk)
                if received > limit:
                    raise self._too_big()
                if declared and received > declared:
                    raise InvalidRequest(FieldViolation("chunk", f"the archive is larger than the header's "
                                                                 f"size_bytes ({declared:,})"))
                await asyncio.to_thread(out.write, message.chunk)
        if declared and received != declared:
            raise InvalidRequest(FieldViolation("chunk", f"{received:,} bytes were sent, not the header's "
                                                         f"size_bytes ({declared:,})"))
        if received == 0:
            raise InvalidRequest(FieldViolation("chunk", "no archive was sent after the header"))

    async def ListImages(self, request: pb.ListImagesRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListImagesResponse:
        principal = current_principal()
        violations = [] if request.billing_project else [FieldViolation("billing_project", "required")]
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        after = page_tokens.decode(request.page_token) if request.page_token else ""
        if after is None:
            violations.append(FieldViolation("page_token", "not a token this service returned"))
        if violations:
            raise InvalidRequest(violations)
        assert after is not None
        await self._project(request.billing_project, principal, change=False)
        registry = self._registry()
        limit = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        # The project's images first, then the base images: each listed by (order, repository, tag); then the
        # public images only workers hold, by ("2", reference, "").
        keys: list[tuple[str, str, str]] = []
        for order, prefix in (("0", f"{request.billing_project}/"), ("1", BASE_PREFIX)):
            for repository in await registry.repositories(prefix):
                if order == "1" and "/" in repository.removeprefix(BASE_PREFIX):
                    continue
                keys += [(order, repository, tag) for tag in await registry.tags(repository)]
        held, unknown = await self._held()
        in_registry = {f"{repository}:{tag}" for order, repository, tag in keys if order == "1"}
        only_held = {reference: digest for reference, digest in held.public.items()
                     if reference not in in_registry and not names_own_registry(parse_reference(reference),
                                                                                 registry.registry)}
        keys += [("2", reference, "") for reference in only_held]
        remaining = [key for key in sorted(keys) if "\0".join(key) > after]
        page = remaining[:limit]
        images = []
        for order, repository, tag in page:
            if order == "2":
                digest = only_held[repository]
                images.append(image_pb2.Image(reference=repository, digest=digest,
                                              workers_holding=held.workers_holding.get(digest, 0)))
                continue
            manifest = await registry.manifest(repository, tag)
            if manifest is None:
                continue  # deleted meanwhile
            project, name = ("", repository.removeprefix(BASE_PREFIX)) if order == "1" else \
                (request.billing_project, repository.removeprefix(f"{request.billing_project}/"))
            image = image_proto(project, name, tag, manifest.digest, manifest.size_bytes, manifest.layers)
            if not unknown:
                image.workers_holding = held.workers_holding.get(manifest.digest, 0)
            images.append(image)
        more = len(remaining) > limit
        return pb.ListImagesResponse(images=images, workers_unknown=unknown,
                                     next_page_token=page_tokens.encode("\0".join(page[-1])) if more else "")

    async def _held(self) -> tuple[WorkersHold, str]:
        """What the live workers hold, and why it is unknown (empty when it is known)."""
        if self.held is None:
            return WorkersHold(), "this frontend knows no drivers (--driver-addresses), so not what workers hold"
        try:
            async with asyncio.timeout(HELD_IMAGES_TIMEOUT_S):
                return workers_hold(await self.held()), ""
        except DriversUnreachable as e:
            return WorkersHold(), f"what workers hold is unknown: {e}"
        except TimeoutError:
            return WorkersHold(), (f"what workers hold is unknown: the drivers did not answer within "
                                   f"{HELD_IMAGES_TIMEOUT_S:g} s")

    async def DeleteImage(self, request: pb.DeleteImageRequest, context: grpc.aio.ServicerContext
                          ) -> pb.DeleteImageResponse:
        principal = current_principal()
        tag = request.tag or DEFAULT_TAG
        violations = name_violations("billing_project", request.billing_project, request.name, tag)
        if violations:
            raise InvalidRequest(violations)
        await self._project(request.billing_project, principal, change=True)
        reference = f"{OWN_NAME}/{request.billing_project}/{request.name}:{tag}"
        if not await self._registry().delete_tag(f"{request.billing_project}/{request.name}", tag):
            raise NotFound(f"billing project {request.billing_project} has no image {reference}")
        return pb.DeleteImageResponse()


HeldImages = Callable[[], Awaitable[driver_service_pb2.ListHeldImagesResponse]]
"""Asks the leading driver what the live workers' caches hold (DriverNotifier.held_images); raises
DriversUnreachable."""


@dataclasses.dataclass(frozen=True)
class WorkersHold:
    """What the live workers hold, as ListImages shows it."""

    workers_holding: dict[str, int] = dataclasses.field(default_factory=dict)
    """Digest -> how many live workers hold it."""
    public: dict[str, str] = dataclasses.field(default_factory=dict)
    """Reference any job may run -> the digest workers hold under it."""


def workers_hold(answer: driver_service_pb2.ListHeldImagesResponse) -> WorkersHold:
    """The driver's answer as ListImages uses it. A public reference is kept only if it is a normalised image
    reference of another registry than corral's (`localhost/...` names a project's private image, whatever a
    worker reported)."""
    hold = WorkersHold()
    for image in answer.images:
        hold.workers_holding[image.digest] = image.workers_holding
        for reference in image.public_references:
            try:
                ref = parse_reference(reference)
            except InvalidImageReference:
                continue
            if str(ref) == reference and ref.registry != OWN_NAME:
                hold.public.setdefault(reference, image.digest)
    return hold



