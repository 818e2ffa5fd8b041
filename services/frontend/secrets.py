"""SecretService: a billing project's secrets, sealed on the way in and never
read out (docs/security.md, *Secrets*).

Who may do what: the project's members and administrators create, replace
and delete its secrets; whoever may read the project (members,
administrators, developers) lists them; anybody else gets NOT_FOUND "no
billing project X", the answer for a project that does not exist
(services.frontend.access). Checks, in this order: the fields' limits
(services.frontend.field_limits: name lengths, a file's size, the number
of files), the request's own rules (INVALID_ARGUMENT, every violation at
once: names, file names, the contents' total size), the project
(NOT_FOUND), the caller's right to change it (PERMISSION_DENIED), its state
(FAILED_PRECONDITION for a deleted one), then the store (ALREADY_EXISTS;
NOT_FOUND for a secret the project does not have).

The files are sealed with the deployment's public key (services.common.
sealing) before they are stored: the frontend holds no key that opens them,
and no answer, log line or error here holds a file's contents, only file
names. A deployment given no public key (--secrets-public-key-file) keeps
no secrets: CreateSecret is FAILED_PRECONDITION, saying so.
"""

from __future__ import annotations


import grpc

from corral.batch.v1 import secret_pb2, secret_service_pb2_grpc
from corral.batch.v1 import secret_service_pb2 as pb
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidRequest,
    NotFound,
    PermissionDenied,
)
from services.common.identity import Principal, current_principal
from services.common.sealing import Sealer, pack_files, secret_row
from services.frontend import page_tokens
from services.frontend.billing_store import sees_every_project
from services.frontend.job_protos import timestamp
from services.frontend.limits import Limits
from services.frontend.secret_store import ProjectAccess, SecretExists, SecretInfo, SecretStore
from services.frontend.validate import SECRET_FILE_RULE, SECRET_NAME, SECRET_NAME_RULE, secret_file_name_ok

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


def secret_proto(info: SecretInfo) -> secret_pb2.Secret:
    return secret_pb2.Secret(billing_project=info.billing_project, name=info.name, keys=list(info.file_names),
                             created_at=timestamp(info.created_at_ms), created_by=info.created_by)


def may_see(principal: Principal, project: ProjectAccess) -> bool:
    """Whoever may read the project (billing_store.may_read): members, administrators, developers."""
    return sees_every_project(principal) or principal.name in project.members


def may_change(principal: Principal, project: ProjectAccess) -> bool:
    """Members and administrators."""
    return principal.is_admin or principal.name in project.members


class SecretServicer(secret_service_pb2_grpc.SecretServiceServicer):
    """See the module docstring."""

    def __init__(self, store: SecretStore, sealer: Sealer | None, limits: Limits = Limits()):
        self.store = store
        self.sealer = sealer
        """None: this deployment keeps no secrets."""
        self.limits = limits

    async def _project(self, name: str, principal: Principal, change: bool) -> ProjectAccess:
        project = await self.store.project(name) if name else None
        if project is None or not may_see(principal, project):
            raise NotFound(f"no billing project {name}")
        if change and not may_change(principal, project):
            raise PermissionDenied(f"only members of billing project {name} and administrators change its secrets")
        return project

    async def CreateSecret(self, request: pb.CreateSecretRequest, context: grpc.aio.ServicerContext
                           ) -> pb.CreateSecretResponse:
        principal = current_principal()
        violations = _required(request.billing_project) + _name(request.name)
        if not request.files:
            violations.append(FieldViolation("files", "a secret holds at least one file"))
        for file_name in sorted(request.files):
            if not secret_file_name_ok(file_name):
                violations.append(FieldViolation("files", f"{file_name[:20]!r} is not {SECRET_FILE_RULE}"))
        total = sum(len(content) for content in request.files.values())
        if total > self.limits.max_secret_bytes:
            violations.append(FieldViolation("files", f"the files hold {total:,} bytes together, more than "
                                                      f"{self.limits.max_secret_bytes:,} (max_secret_bytes)"))
        if violations:
            raise InvalidRequest(violations)
        project = await self._project(request.billing_project, principal, change=True)
        if project.state == "deleted":
            raise FailedPrecondition(f"billing project {request.billing_project} is deleted")
        if self.sealer is None:
            raise FailedPrecondition("this deployment keeps no secrets: its frontend has no key to seal them with "
                                     "(operator setting --secrets-public-key-file)")
        sealed = self.sealer.seal(pack_files(request.files), secret_row(request.billing_project, request.name))
        try:
            info = await self.store.create(request.billing_project, request.name, list(request.files), sealed,
                                           self.sealer.key_id, principal.name, request.replace)
        except SecretExists:
            # API-neutral words (the request's field); the CLI says its option, --replace.
            raise AlreadyExists(f"billing project {request.billing_project} has a secret {request.name} "
                                "(replace: true replaces it)") from None
        return pb.CreateSecretResponse(secret=secret_proto(info))

    async def ListSecrets(self, request: pb.ListSecretsRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListSecretsResponse:
        principal = current_principal()
        violations = _required(request.billing_project)
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        after = page_tokens.decode(request.page_token) if request.page_token else ""
        if after is None:
            violations.append(FieldViolation("page_token", "not a token this service returned"))
        if violations:
            raise InvalidRequest(violations)
        assert after is not None
        await self._project(request.billing_project, principal, change=False)
        limit = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)  # more than the cap is the cap
        secrets = await self.store.page(request.billing_project, after, limit)
        return pb.ListSecretsResponse(secrets=[secret_proto(s) for s in secrets],
                                      next_page_token=page_tokens.encode(secrets[-1].name) if len(secrets) == limit else "")

    async def DeleteSecret(self, request: pb.DeleteSecretRequest, context: grpc.aio.ServicerContext
                           ) -> pb.DeleteSecretResponse:
        principal = current_principal()
        violations = _required(request.billing_project) + _required(request.name, "name")
        if violations:
            raise InvalidRequest(violations)
        await self._project(request.billing_project, principal, change=True)
        if not await self.store.delete(request.billing_project, request.name):
            raise NotFound(f"billing project {request.billing_project} has no secret {request.name}")
        return pb.DeleteSecretResponse()


def _required(value: str, field: str = "billing_project") -> list[FieldViolation]:
    return [] if value else [FieldViolation(field, "required")]


def _name(name: str) -> list[FieldViolation]:
    return [] if SECRET_NAME.match(name) else [FieldViolation("name", SECRET_NAME_RULE)]


