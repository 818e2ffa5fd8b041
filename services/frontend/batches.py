"""BatchService: submitting, reading and cancelling batches.

Submission of a large batch: CreateBatch (or CreateUpdate) reserves a block
of job ids; clients send AddJobs bunches in parallel (each bunch's ids are
fixed by its `first_index`, so a re-sent bunch is recognised); CommitUpdate
makes the jobs visible. SubmitBatch does all of it in one call for small
batches. Every step is idempotent under the client's tokens.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from corral.batch.v1 import batch_pb2, batch_service_pb2_grpc, job_state_pb2, update_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from services.common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    FieldViolation,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RequestError,
    Unavailable,
)
from services.common.telemetry import current_context_json
from services.common.identity import Principal, current_principal
from services.common.image_refs import ImageReference
from services.db.database import ConflictError, PermissionDeniedError, ProcedureError
from services.db.store import JobStore
from services.frontend import query as query_language
from services.frontend.estimate_store import EstimateStore
from services.frontend.estimates import estimate
from services.frontend.access import owned_batch, readable_batch
from services.frontend.batch_store import BatchCounts, BatchStore, sees_everything
from services.frontend.field_limits import FIRST_UPDATE_SUFFIX, RERUN_PREFIX, SUBMIT_SUFFIX
from services.frontend.limits import Limits
from services.frontend.notify import Notify, no_notify
from services.frontend.request_digest import (
    batch_token_conflict,
    request_digest,
    rerun_token_conflict,
    update_token_conflict,
)
from services.frontend.secret_store import SecretStore
from services.common.specs import SpecStore
from services.frontend.image_access import OwnRegistryNames, access_refusal
from services.frontend.image_checks import ImageChecks
from services.frontend.url_checks import UrlChecks
from services.frontend.validate import (
    UpdateBlock, check_bunch, job_group_rows, job_row, pool_machines, secret_reference,
)
from services.frontend.watch import BatchWatcher

log = logging.getLogger(__name__)

MAX_PAGE_SIZE = 1000
REQUIRED_TOKEN = "required: a client-generated unique string (e.g. a UUID), so that a retried call does not repeat it"
EMPTY_ESTIMATE = "a batch needs at least one job; there is nothing to price"
EMPTY_SUBMISSION = ("a batch needs at least one job (one of none would complete at once, having done nothing); to "
                    "open a batch and add its jobs later, use CreateBatch and CreateUpdate")
MAX_RESERVED_IDS = 2**31 - 1
"""Job (and job group) ids are INT columns: a batch reserves at most this many."""
# RerunFailedJobs' states as the bits of rerun_failed_jobs.
_RERUN_STATE_BITS = {job_state_pb2.JOB_STATE_FAILED: 2, job_state_pb2.JOB_STATE_ERROR: 4,
                     job_state_pb2.JOB_STATE_CANCELLED: 8}


def fan_out_violation(specs: Any, max_children: int, field: str = "jobs") -> FieldViolation | None:
    """The first parent that more than `max_children` of `specs` depend on, as a violation of
    the first job past the limit. Exact for a new batch, whose every parent is in `specs`;
    insert_jobs counts the children stored before for any other bunch."""
    children: dict[tuple[str, int], int] = {}
    for i, spec in enumerate(specs):
        for parent in spec.parents:
            key = (("offset", i + parent.in_update_offset) if parent.WhichOneof("ref") == "in_update_offset"
                   else ("id", parent.job_id))
            children[key] = children.get(key, 0) + 1
            if children[key] > max_children:
                return FieldViolation(f"{field}[{i}].parents", f"its parent would have more than {max_children:,} "
                                                               f"children (max_children_per_job)")
    return None


def _timestamp(ms: int | None) -> timestamp_pb2.Timestamp | None:
    if ms is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def update_proto(row: dict[str, Any]) -> update_pb2.Update:
    return update_pb2.Update(
        batch_id=row["batch_id"], update_id=row["update_id"], start_job_id=row["start_job_id"],
        n_jobs=row["n_jobs"], start_job_group_id=row["start_job_group_id"], n_job_groups=row["n_job_groups"],
        state=update_pb2.UPDATE_STATE_COMMITTED if row["committed"] else update_pb2.UPDATE_STATE_OPEN,
        created_at=_timestamp(row["time_created_ms"]), committed_at=_timestamp(row["time_committed_ms"]),
    )


_BATCH_STATES = {"open": batch_pb2.BATCH_STATE_OPEN, "running": batch_pb2.BATCH_STATE_RUNNING,
                 "complete": batch_pb2.BATCH_STATE_COMPLETE}


def _batch_message(row: dict[str, Any], counts: BatchCounts, attributes: dict[str, str]) -> batch_pb2.Batch:
    """A batch's message from its row (`BatchStore`'s select), counts and attributes."""
    cancellation = None
    if row["cancelled_by"] is not None:
        cause = (batch_pb2.CANCELLATION_CAUSE_FAILURE_LIMIT if row["cancel_reason"].startswith("cancel_after")
                 else batch_pb2.CANCELLATION_CAUSE_BILLING_LIMIT
                 if row["cancel_reason"] == "billing limit reached" and row["cancelled_by"] == "corral"
                 else batch_pb2.CANCELLATION_CAUSE_USER_REQUEST)
        cancellation = batch_pb2.CancellationInfo(
            cancelled_by=row["cancelled_by"], reason=row["cancel_reason"],
            cancelled_at=_timestamp(row["time_cancelled_ms"]), cause=cause)
    return batch_pb2.Batch(
        batch_id=row["batch_id"], user=row["user"], billing_project=row["billing_project"],
        attributes=attributes, state=_BATCH_STATES[row["state"]], cancellation=cancellation,
        hold=batch_pb2.HoldInfo(held_by=row["held_by"], held_at=_timestamp(row["time_held_ms"]))
        if row.get("held_by") is not None else None,
        counts=batch_pb2.JobCounts(
            n_jobs=counts.n_jobs, n_pending=counts.n_pending, n_ready=counts.n_ready,
            n_running=counts.n_running, n_succeeded=counts.n_succeeded, n_failed=counts.n_failed,
            n_errored=counts.n_errored, n_cancelled=counts.n_cancelled),
        cost_micro_usd=round(float(row["cost_usd"]) * 1_000_000),
        created_at=_timestamp(row["time_created_ms"]), completed_at=_timestamp(row["time_completed_ms"]),
        callback_url=row["callback_url"] or "", cancel_after_n_failures=row["cancel_after_n_failures"],
        last_event_id=row["last_event_id"],
    )


_HOLD_CHANGES = {"held": pb.HOLD_CHANGE_HELD, "already held": pb.HOLD_CHANGE_ALREADY_HELD,
                 "complete": pb.HOLD_CHANGE_COMPLETE, "released": pb.HOLD_CHANGE_RELEASED,
                 "not held": pb.HOLD_CHANGE_NOT_HELD}
"""hold_jobs' and release_jobs' words as the API says them."""


class BatchServicer(batch_service_pb2_grpc.BatchServiceServicer):
    """The batch half of the frontend."""

    def __init__(self, jobs: JobStore, batches: BatchStore, specs: SpecStore, notify: Notify = no_notify,
                 watcher: BatchWatcher | None = None, urls: UrlChecks | None = None, limits: Limits = Limits(),
                 secrets: SecretStore | None = None, images: ImageChecks | None = None,
                 own_registry: OwnRegistryNames | None = None):
        self.jobs = jobs
        self.batches = batches
        self.specs = specs
        self.notify = notify
        self.limits = limits
        self.watcher = watcher or BatchWatcher(batches, limits=limits)
        self.urls = urls or UrlChecks()
        self.secrets = secrets or SecretStore(batches.db)
        self.images = images or ImageChecks(max_registries=limits.max_registries_per_request)
        self.own_registry = own_registry or OwnRegistryNames()
        """How corral's own registry is named: its projects' images are their members' (image_access)."""
        self.estimates = EstimateStore(batches.db)

    # -- helpers -------------------------------------------------------------

    async def _batch_row(self, batch_id: int, principal: Principal) -> dict[str, Any]:
        """A batch the caller may read (see services.frontend.access)."""
        return await readable_batch(self.batches, batch_id, principal)

    async def _own_batch(self, batch_id: int, principal: Principal) -> dict[str, Any]:
        """A batch the caller may change: their own (administrators: any)."""
        return await owned_batch(self.batches, batch_id, principal)

    async def batch_proto(self, row: dict[str, Any]) -> batch_pb2.Batch:
        return (await self.batch_protos([row]))[0]

    async def batch_protos(self, rows: list[dict[str, Any]]) -> list[batch_pb2.Batch]:
        """The messages of these batch rows, their counts and attributes read once for all of them."""
        ids = [row["batch_id"] for row in rows]
        counts = await self.batches.counts({row["batch_id"]: row["n_jobs"] for row in rows})
        attributes = await self.batches.attributes(ids)
        return [_batch_message(row, counts[row["batch_id"]], attributes[row["batch_id"]]) for row in rows]

    def _job_caps(self) -> dict[str, int]:
        """The limits create_update and rerun_failed_jobs enforce."""
        return {"max_jobs_per_batch": self.limits.max_jobs_per_batch,
                "max_open_jobs_per_user": self.limits.max_open_jobs_per_user,
                "max_open_jobs_per_billing_project": self.limits.max_open_jobs_per_billing_project}

    def _batch_violations(self, request: Any, n_jobs: int, n_jobs_field: str) -> tuple[list[FieldViolation], str]:
        """What is wrong with a CreateBatch or SubmitBatch request's own fields, and the message."""
        violations = []
        if not request.billing_project:
            violations.append(FieldViolation("billing_project", "required"))
        if not request.idempotency_token:  # its length is a field limit (field_limits.py)
            violations.append(FieldViolation("idempotency_token", REQUIRED_TOKEN))
        if request.HasField("cancel_after_n_failures") and request.cancel_after_n_failures < 1:
            violations.append(FieldViolation("cancel_after_n_failures", "must be at least 1"))
        message = "invalid request"
        if n_jobs > self.limits.max_jobs_per_batch:
            message = (f"a batch may have at most {self.limits.max_jobs_per_batch:,} jobs (max_jobs_per_batch), "
                       f"not {n_jobs:,}")
            violations.append(FieldViolation(n_jobs_field, message))
        return violations, message

    async def _create_batch(self, principal: Principal, request: Any, digest: str, n_jobs: int = 0,
                            n_jobs_field: str = "n_jobs") -> tuple[int, bool]:
        """Create the batch; with `n_jobs`, first check that its update would be accepted, so
        that a refusal writes nothing. Its id, and whether this call created it (not a retry's).
        `digest` is the request's (request_digest): its token used for another request is ALREADY_EXISTS."""
        violations, message = self._batch_violations(request, n_jobs, n_jobs_field)
        if violations:
            raise InvalidRequest(violations, message)
        if request.callback_url:
            await self.urls.check_callback(request.callback_url)
        if n_jobs:
            await self.jobs.check_job_limits(principal.name, request.billing_project, n_jobs, request.idempotency_token,
                                             **self._job_caps())
        try:
            status = await self.jobs.create_batch(
                principal.name, request.billing_project, request.idempotency_token,
                request.callback_url or None,
                request.cancel_after_n_failures if request.HasField("cancel_after_n_failures") else None,
                dict(request.attributes), digest)
        except ConflictError as e:
            raise batch_token_conflict(request.idempotency_token, int(e.status["batch_id"])) from None
        except PermissionDeniedError:
            if sees_everything(principal):
                raise
            # Not a member: the answer of a project that does not exist (services.frontend.access).
            raise NotFound(f"no billing project {request.billing_project}") from None
        return int(status["batch_id"]), bool(status["created"])

    @contextlib.asynccontextmanager
    async def _discarded_if_refused(self, batch_id: int, created: bool, principal: Principal) -> AsyncIterator[None]:
        """Nothing half-written: when a step after create_batch is refused (someone else closed the project,
        took the quota, removed a region between the procedures), the batch this call created is taken back
        (discard_batch), so the caller's batches are as before and a retry starts afresh. A failure that is no
        refusal (the database away) keeps it: a retry with the same token finishes it."""
        try:
            yield
        except (ProcedureError, RequestError) as refusal:
            if created and not isinstance(refusal, (Unavailable, DeadlineExceeded)):
                try:
                    await self.jobs.discard_batch(batch_id, principal.name)
                except Exception:  # the refusal is the answer; the batch stays open, as before this existed
                    log.exception("could not discard batch %s after its submission was refused", batch_id)
            raise

    async def _create_update(self, batch_id: int, n_jobs: int, n_job_groups: int, token: str | None,
                             digest: str) -> dict[str, Any]:
        """Reserve the update's ids; `digest` is the request's (request_digest), stored with `token`."""
        if n_jobs < 0 or n_job_groups < 0:
            raise InvalidRequest(FieldViolation("n_jobs", "n_jobs and n_job_groups must not be negative"))
        # The trace of this call follows the update's jobs to their workers.
        status = await self.jobs.create_update(batch_id, n_jobs, n_job_groups, token, current_context_json(),
                                               request_digest=digest, **self._job_caps())
        row = await self.batches.get_update(batch_id, int(status["update_id"]))
        assert row is not None
        return row

    async def _job_violations(self, specs: list[Any], first_job_id: int, block: UpdateBlock, billing_project: str,
                              principal: Principal, field: str = "jobs", new_batch: bool = False
                              ) -> list[FieldViolation]:
        """Everything wrong with a bunch that can be known before writing it (validate.check_bunch),
        the regions and secrets it names included, and the registries of its images (image_checks)."""
        known_regions = await self.batches.region_names() if any(spec.regions for spec in specs) else None
        violations = check_bunch(specs, first_job_id, block, field, self.limits,
                                 self.urls.storage_roots(billing_project), billing_project, known_regions, new_batch,
                                 await self.batches.deployment())
        violations += await self.images.violations(specs, field)
        await self._check_image_access(specs, principal, field)
        return violations + await self._secret_violations(specs, billing_project, principal, field)

    async def _check_image_access(self, specs: list[Any], principal: Principal, field: str) -> None:
        """A job whose image is a billing project's in corral's own registry (`localhost/PROJECT/...`) is
        PERMISSION_DENIED unless the submitter is a member of PROJECT (services.frontend.image_access),
        decided on the name alone: a project that does not exist is refused alike."""
        named: list[tuple[int, ImageReference, str]] = []
        for i, spec in enumerate(specs):
            if (found := self.own_registry.project_of(spec.image)) is not None:
                named.append((i, *found))
        if not named:
            return
        mine = set()
        for project in {project for _, _, project in named}:
            access = await self.secrets.project(project)
            if access is not None and principal.name in access.members:
                mine.add(project)
        for i, reference, _ in named:
            if (why := access_refusal(reference, self.own_registry.keys, mine)) is not None:
                raise PermissionDenied(f"{field}[{i}].image: {why}")

    async def _secret_violations(self, specs: list[Any], billing_project: str, principal: Principal, field: str
                                 ) -> list[FieldViolation]:
        """The secrets the jobs mount, and those they pull their images with (image_pull_secret), must be their
        batch's project's. A secret named with another project (PROJECT/NAME) is PERMISSION_DENIED, decided on
        the name alone: the answer is the same whether that project, or its secret, exists. A secret of the
        batch's own project that it does not have is a violation of the field naming it, looked up only for a
        caller who may see the project (anyone else gets the answer of a project that does not exist, as
        create_batch gives them)."""
        wanted: dict[str, list[str]] = {}
        for i, spec in enumerate(specs):
            # (where, the field naming the secret, its name, what a job does with its project's secrets)
            named = [(f"{field}[{i}].secrets[{j}]", f"{field}[{i}].secrets[{j}].name", mount.name, "mounts")
                     for j, mount in enumerate(spec.secrets)]
            if spec.image_pull_secret:
                path = f"{field}[{i}].image_pull_secret"
                named.append((path, path, spec.image_pull_secret, "pulls its image with"))
            for where, path, written, uses in named:
                reference = secret_reference(written)
                if reference is None:
                    continue  # refused by check_bunch
                project, name = reference
                if project and project != billing_project:
                    raise PermissionDenied(
                        f"{where}: secret {written!r} is not of billing project {billing_project!r}: a job {uses} "
                        "secrets of its own batch's billing project only")
                wanted.setdefault(name, []).append(path)
        if not wanted:
            return []
        project_access = await self.secrets.project(billing_project)
        if project_access is None or not (sees_everything(principal) or principal.name in project_access.members):
            raise NotFound(f"no billing project {billing_project}")
        existing = await self.secrets.existing(billing_project, wanted)
        return [FieldViolation(path, f"billing project {billing_project} has no secret {name!r}")
                for name in sorted(set(wanted) - existing) for path in wanted[name]]

    async def _add_jobs(self, batch_id: int, update: dict[str, Any], first_index: int, jobs: Any,
                        billing_project: str, principal: Principal, field: str = "jobs",
                        checked: UpdateBlock | None = None) -> bool:
        """Validate (unless already `checked` against this update's block), store specs, insert;
        returns whether the bunch was already received."""
        block = UpdateBlock(update["start_job_id"], update["n_jobs"], update["start_job_group_id"],
                            update["n_job_groups"])
        first_job_id = block.start_job_id + first_index
        specs = list(jobs)
        if checked != block:
            violations = await self._job_violations(specs, first_job_id, block, billing_project, principal, field)
            if violations:
                raise InvalidRequest(violations)
        stored = await self.specs.store_bunch(batch_id, update["update_id"], first_job_id, specs)
        pools = pool_machines(await self.batches.deployment())
        rows = [job_row(spec, first_job_id + i, block, stored.refs[i], pools) for i, spec in enumerate(specs)]
        try:
            status = await self.jobs.insert_jobs(batch_id, update["update_id"], rows,
                                                 max_children_per_job=self.limits.max_children_per_job)
        except ProcedureError:
            # Refused, and rolled back: no job refers to the specs just stored. (Any
            # other error may have come after the commit: the specs stay.)
            await self.specs.discard(stored)
            raise
        return status["message"] == "duplicate"

    async def _create_job_groups(self, batch_id: int, update: dict[str, Any], first_index: int, specs: Any) -> None:
        block = UpdateBlock(update["start_job_id"], update["n_jobs"], update["start_job_group_id"],
                            update["n_job_groups"])
        groups, violations = job_group_rows(specs, block, first_index)
        if violations:
            raise InvalidRequest(violations)
        if groups:
            await self.jobs.insert_job_groups(batch_id, update["update_id"], groups)

    async def _open_update(self, batch_id: int, update_id: int, principal: Principal
                           ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The caller's batch and one of its updates."""
        batch = await self._own_batch(batch_id, principal)
        update = await self.batches.get_update(batch_id, update_id)
        if update is None:
            raise NotFound(f"no update {update_id} of batch {batch_id}")
        return batch, update

    # -- RPCs ----------------------------------------------------------------

    async def CreateBatch(self, request: pb.CreateBatchRequest, context: grpc.aio.ServicerContext
                          ) -> pb.CreateBatchResponse:
        principal = current_principal()
        # The first update's token is the batch's: it is checked with the batch's digest, and keeps it.
        digest = request_digest(request)
        batch_id, created = await self._create_batch(principal, request, digest, request.n_jobs)
        update = None
        if request.n_jobs or request.n_job_groups:
            token = request.idempotency_token + FIRST_UPDATE_SUFFIX
            async with self._discarded_if_refused(batch_id, created, principal):
                update = update_proto(await self._create_update(batch_id, request.n_jobs, request.n_job_groups,
                                                                token, digest))
        batch = await self.batch_proto(await self._batch_row(batch_id, principal))
        return pb.CreateBatchResponse(batch=batch, update=update)

    async def CreateUpdate(self, request: pb.CreateUpdateRequest, context: grpc.aio.ServicerContext
                           ) -> pb.CreateUpdateResponse:
        principal = current_principal()
        if not request.idempotency_token:
            raise InvalidRequest(FieldViolation("idempotency_token", REQUIRED_TOKEN))
        batch = await self._own_batch(request.batch_id, principal)
        for field, reserved, more in (("n_jobs", batch["n_reserved_jobs"], request.n_jobs),
                                      ("n_job_groups", batch["n_reserved_job_groups"], request.n_job_groups)):
            if reserved + more > MAX_RESERVED_IDS:
                raise InvalidRequest(FieldViolation(
                    field, f"batch {request.batch_id} has reserved {reserved}; with {more} more it would pass "
                           f"{MAX_RESERVED_IDS}, the most ids a batch has"))
        try:
            row = await self._create_update(request.batch_id, request.n_jobs, request.n_job_groups,
                                            request.idempotency_token, request_digest(request))
        except ConflictError as e:
            raise update_token_conflict(request.idempotency_token, request.batch_id,
                                        int(e.status["update_id"])) from None
        return pb.CreateUpdateResponse(update=update_proto(row))

    async def CreateJobGroups(self, request: pb.CreateJobGroupsRequest, context: grpc.aio.ServicerContext
                              ) -> pb.CreateJobGroupsResponse:
        _, update = await self._open_update(request.batch_id, request.update_id, current_principal())
        await self._create_job_groups(request.batch_id, update, request.first_index, request.job_groups)
        return pb.CreateJobGroupsResponse(first_job_group_id=update["start_job_group_id"] + request.first_index)

    async def AddJobs(self, request: pb.AddJobsRequest, context: grpc.aio.ServicerContext) -> pb.AddJobsResponse:
        principal = current_principal()
        batch, update = await self._open_update(request.batch_id, request.update_id, principal)
        # A committed update refuses new jobs in insert_jobs, but still
        # recognises a re-sent bunch.
        already = await self._add_jobs(request.batch_id, update, request.first_index, request.jobs,
                                       batch["billing_project"], principal)
        return pb.AddJobsResponse(first_job_id=update["start_job_id"] + request.first_index, already_received=already)

    async def CommitUpdate(self, request: pb.CommitUpdateRequest, context: grpc.aio.ServicerContext
                           ) -> pb.CommitUpdateResponse:
        principal = current_principal()
        await self._open_update(request.batch_id, request.update_id, principal)
        await self.jobs.commit_update(request.batch_id, request.update_id)
        await self.notify("jobs_ready", request.batch_id)
        update = await self.batches.get_update(request.batch_id, request.update_id)
        assert update is not None
        batch = await self.batch_proto(await self._batch_row(request.batch_id, principal))
        return pb.CommitUpdateResponse(update=update_proto(update), batch=batch)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: grpc.aio.ServicerContext
                          ) -> pb.SubmitBatchResponse:
        principal = current_principal()
        if not request.jobs:
            # A batch of no jobs completes at once having done nothing: a mistake (a file's `jobs: []`).
            # A batch that jobs are added to later is CreateBatch's, which says so by reserving none yet.
            raise InvalidRequest(FieldViolation("jobs", EMPTY_SUBMISSION))
        if len(request.jobs) > self.limits.max_jobs_per_bunch:
            raise InvalidRequest(FieldViolation(
                "jobs", f"SubmitBatch takes at most {self.limits.max_jobs_per_bunch} jobs (max_jobs_per_bunch); "
                        "use CreateBatch and AddJobs"))
        too_many = fan_out_violation(request.jobs, self.limits.max_children_per_job)
        if too_many is not None:
            raise InvalidRequest(too_many, too_many.description)
        # Everything that can be checked is checked before the batch is created: the
        # procedures commit one by one, so a refusal after create_batch leaves a batch
        # to take back (_discarded_if_refused), which is for someone else's change in
        # between only. A new batch's first update has job ids from 1 and group ids
        # from 1 (0 is the root).
        block = UpdateBlock(1, len(request.jobs), 1, len(request.job_groups))
        violations, message = self._batch_violations(request, len(request.jobs), "jobs")
        violations += job_group_rows(request.job_groups, block, 0, new_batch=True)[1]
        if request.jobs:
            violations += await self._job_violations(list(request.jobs), 1, block, request.billing_project,
                                                     principal, new_batch=True)
        if violations:
            raise InvalidRequest(violations, message)
        digest = request_digest(request)
        batch_id, created = await self._create_batch(principal, request, digest, len(request.jobs), "jobs")
        token = request.idempotency_token + SUBMIT_SUFFIX
        async with self._discarded_if_refused(batch_id, created, principal):
            update = await self._create_update(batch_id, len(request.jobs), len(request.job_groups), token, digest)
            if not update["committed"]:
                await self._create_job_groups(batch_id, update, 0, request.job_groups)
                if request.jobs:
                    await self._add_jobs(batch_id, update, 0, request.jobs, request.billing_project, principal,
                                         checked=block)
                await self.jobs.commit_update(batch_id, update["update_id"])
        if not update["committed"]:
            await self.notify("jobs_ready", batch_id, 0, request.billing_project)
        update = await self.batches.get_update(batch_id, update["update_id"])
        assert update is not None
        batch = await self.batch_proto(await self._batch_row(batch_id, principal))
        return pb.SubmitBatchResponse(batch=batch, update=update_proto(update))

    async def EstimateBatch(self, request: pb.EstimateBatchRequest, context: grpc.aio.ServicerContext
                            ) -> pb.EstimateBatchResponse:
        """SubmitBatch's checks of the batch's content, then its prices (services.frontend.estimates); reads only."""
        principal = current_principal()
        violations = []
        if not request.billing_project:
            violations.append(FieldViolation("billing_project", "required"))
        if not request.jobs:
            violations.append(FieldViolation("jobs", EMPTY_ESTIMATE))
        if len(request.jobs) > self.limits.max_jobs_per_bunch:
            violations.append(FieldViolation(
                "jobs", f"EstimateBatch takes at most {self.limits.max_jobs_per_bunch} jobs "
                        "(max_jobs_per_bunch); price a larger batch in bunches (first_index, n_jobs)"))
        n_jobs = request.n_jobs or request.first_index + len(request.jobs)
        n_job_groups = request.n_job_groups or len(request.job_groups)
        message = "invalid request"
        if request.first_index + len(request.jobs) > n_jobs:
            violations.append(FieldViolation(
                "n_jobs", f"the batch has {n_jobs:,} jobs: {len(request.jobs):,} from first_index "
                          f"{request.first_index:,} go past its end"))
        elif n_jobs > self.limits.max_jobs_per_batch:
            message = (f"a batch may have at most {self.limits.max_jobs_per_batch:,} jobs (max_jobs_per_batch), "
                       f"not {n_jobs:,}")
            violations.append(FieldViolation("n_jobs" if request.n_jobs else "jobs", message))
        if len(request.job_groups) > n_job_groups:
            violations.append(FieldViolation("n_job_groups", f"job_groups holds {len(request.job_groups):,} "
                                                             f"groups, more than n_job_groups"))
        if violations:
            raise InvalidRequest(violations, message)
        # Who may price a batch is who may submit it (create_batch's order: membership, then state).
        access = await self.estimates.project(request.billing_project, principal.name)
        if access is None or not (access.member or sees_everything(principal)):
            raise NotFound(f"no billing project {request.billing_project}")
        if not access.member:
            raise PermissionDenied(f"{principal.name} is not a member of billing project {request.billing_project}")
        if access.state != "open":
            raise FailedPrecondition(f"billing project {request.billing_project} is {access.state}")
        too_many = fan_out_violation(request.jobs, self.limits.max_children_per_job)
        if too_many is not None:
            raise InvalidRequest(too_many, too_many.description)
        block = UpdateBlock(1, n_jobs, 1, n_job_groups)
        first_job_id = 1 + request.first_index
        specs = list(request.jobs)
        violations = job_group_rows(request.job_groups, block, 0, new_batch=True)[1]
        violations += await self._job_violations(specs, first_job_id, block, request.billing_project, principal,
                                                 new_batch=True)
        if violations:
            raise InvalidRequest(violations)
        pools = pool_machines(await self.batches.deployment())
        rows = [job_row(spec, first_job_id + i, block, "", pools) for i, spec in enumerate(specs)]
        return await estimate(self.estimates, request.billing_project, access.limited, rows, specs)

    async def GetBatch(self, request: pb.GetBatchRequest, context: grpc.aio.ServicerContext) -> pb.GetBatchResponse:
        return pb.GetBatchResponse(batch=await self.batch_proto(await self._batch_row(request.batch_id,
                                                                                       current_principal())))

    async def WatchBatch(self, request: pb.WatchBatchRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[pb.WatchBatchResponse]:
        async for response in self.watcher.watch(request, current_principal()):
            yield response

    async def ListBatches(self, request: pb.ListBatchesRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListBatchesResponse:
        principal = current_principal()
        if request.page_size < 0:
            raise InvalidRequest(FieldViolation("page_size", "must not be negative"))
        limit = min(request.page_size or 100, MAX_PAGE_SIZE)  # the contract: more than the cap is the cap
        try:
            before = int(base64.urlsafe_b64decode(request.page_token).decode()) if request.page_token else None
        except ValueError:
            raise InvalidRequest(FieldViolation("page_token", "not a token this service returned")) from None
        try:
            where, params = query_language.to_sql(query_language.parse(
                request.query, "batches", self.limits.max_query_bytes, self.limits.max_query_terms))
        except query_language.QuerySyntaxError as e:
            raise InvalidRequest(FieldViolation("query", e.description)) from None
        rows = await self.batches.list_batches(where, params, principal, before, limit)
        next_token = base64.urlsafe_b64encode(str(rows[-1]["batch_id"]).encode()).decode() if len(rows) == limit else ""
        return pb.ListBatchesResponse(batches=await self.batch_protos(rows), next_page_token=next_token)

    async def ListRegions(self, request: pb.ListRegionsRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListRegionsResponse:
        regions = await self.batches.machine_regions()
        return pb.ListRegionsResponse(regions=regions, default_region=regions[0] if regions else "")

    async def CancelBatch(self, request: pb.CancelBatchRequest, context: grpc.aio.ServicerContext
                          ) -> pb.CancelBatchResponse:
        principal = current_principal()
        row = await self._own_batch(request.batch_id, principal)
        status = await self.jobs.cancel_job_group(request.batch_id, 0, principal.name,
                                                  request.reason or "cancelled by user")
        # A finished batch is left as it is (cancel_job_group): complete, with no cancellation.
        if status["message"] != "complete":
            await self.notify("batch_cancelled", request.batch_id, 0, row["billing_project"])
        batch = await self.batch_proto(await self._batch_row(request.batch_id, principal))
        return pb.CancelBatchResponse(batch=batch)

    async def HoldJobs(self, request: pb.HoldJobsRequest, context: grpc.aio.ServicerContext
                       ) -> pb.HoldJobsResponse:
        principal = current_principal()
        await self._own_batch(request.batch_id, principal)
        job_id = request.job_id if request.WhichOneof("target") == "job_id" else None
        status = await self.jobs.hold_jobs(request.batch_id, principal.name, request.job_group_id, job_id,
                                           max_held_jobs=self.limits.max_held_jobs_per_batch)
        return pb.HoldJobsResponse(change=_HOLD_CHANGES[status["message"]])

    async def ReleaseJobs(self, request: pb.ReleaseJobsRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ReleaseJobsResponse:
        principal = current_principal()
        row = await self._own_batch(request.batch_id, principal)
        job_id = request.job_id if request.WhichOneof("target") == "job_id" else None
        status = await self.jobs.release_jobs(request.batch_id, request.job_group_id, job_id)
        if status["message"] == "released":  # its jobs may start at the next cycle: wake the scheduler
            await self.notify("jobs_ready", request.batch_id, 0, row["billing_project"])
        return pb.ReleaseJobsResponse(change=_HOLD_CHANGES[status["message"]])

    async def DeleteBatch(self, request: pb.DeleteBatchRequest, context: grpc.aio.ServicerContext
                          ) -> pb.DeleteBatchResponse:
        principal = current_principal()
        row = await owned_batch(self.batches, request.batch_id, principal, include_deleted=True)
        if row["deleted"]:
            return pb.DeleteBatchResponse()
        # Cancel first, so the jobs drain and the cancellation is recorded as
        # any other; a crash in between leaves a cancelled batch that a
        # repeated DeleteBatch deletes.
        if row["state"] != "complete" and row["cancelled_by"] is None:
            await self.jobs.cancel_job_group(request.batch_id, 0, principal.name, "batch deleted")
            await self.notify("batch_cancelled", request.batch_id, 0, row["billing_project"])
        await self.jobs.delete_batch(request.batch_id)
        return pb.DeleteBatchResponse()

    async def RerunFailedJobs(self, request: pb.RerunFailedJobsRequest, context: grpc.aio.ServicerContext
                              ) -> pb.RerunFailedJobsResponse:
        principal = current_principal()
        violations = []
        if not request.idempotency_token:
            violations.append(FieldViolation("idempotency_token", REQUIRED_TOKEN))
        for i, state in enumerate(request.states):
            if state not in _RERUN_STATE_BITS:
                violations.append(FieldViolation(f"states[{i}]", "only FAILED, ERROR and CANCELLED are re-run"))
        if violations:
            raise InvalidRequest(violations)
        bits = sum(_RERUN_STATE_BITS[s] for s in set(request.states)) or (2 | 4)
        row = await self._own_batch(request.batch_id, principal)
        # The digest of what is re-run, not of how it was said: [FAILED, ERROR], [ERROR, FAILED] and [] are one.
        meant = pb.RerunFailedJobsRequest(batch_id=request.batch_id,
                                          states=sorted(s for s, bit in _RERUN_STATE_BITS.items() if bits & bit))
        try:
            status = await self.jobs.rerun_failed_jobs(request.batch_id,
                                                       RERUN_PREFIX + request.idempotency_token, bits,
                                                       max_children_per_job=self.limits.max_children_per_job,
                                                       request_digest=request_digest(meant), **self._job_caps())
        except ConflictError as e:
            raise rerun_token_conflict(request.idempotency_token, request.batch_id,
                                       int(e.status["update_id"])) from None
        if status["update_id"] is None:
            return pb.RerunFailedJobsResponse()
        update_id = int(status["update_id"])
        await self.jobs.commit_update(request.batch_id, update_id)
        await self.notify("jobs_ready", request.batch_id, 0, row["billing_project"])
        update = await self.batches.get_update(request.batch_id, update_id)
        assert update is not None
        return pb.RerunFailedJobsResponse(update=update_proto(update))
