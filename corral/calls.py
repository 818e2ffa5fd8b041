"""Jobs, logs, job groups, re-runs, locks, secrets, images, billing projects, the fleet and users: the calls of
`corral.aio.Client` beyond batches (which `corral.Client` wraps, blocking).

Jobs, groups and billing go to the frontend; users and tokens to the auth
service, whose address the client must then be given (`auth_address`).
Lists are iterators that fetch page after page; every error the server
returns is a typed `corral.errors.CorralError`, and a mistake found before
any call (an unknown state, role or breakdown; users asked of a client
without an auth address) is a `corral.errors.UsageError`.
"""

from __future__ import annotations

import functools
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc, token_pb2, user_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import batch_service_pb2_grpc, fleet_pb2, fleet_service_pb2_grpc, image_pb2
from corral.batch.v1 import image_service_pb2_grpc
from corral.batch.v1 import fleet_service_pb2 as fpb
from corral.batch.v1 import image_service_pb2 as ipb
from corral.batch.v1 import job_explanation_pb2, job_group_pb2, job_group_service_pb2_grpc, job_pb2
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_service_pb2_grpc, job_state_pb2, lock_pb2, lock_service_pb2_grpc, update_pb2
from corral.batch.v1 import lock_service_pb2 as lpb
from corral.batch.v1 import secret_pb2, secret_service_pb2_grpc
from corral.batch.v1 import secret_service_pb2 as spb
from corral.billing.v1 import billing_project_pb2, billing_service_pb2_grpc, quota_pb2, spend_pb2
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.errors import CorralError, UsageError, from_rpc_error
from corral.pages import Pages
from corral.quantities import parse_mcpu

T = TypeVar("T")
LOG_READ_BYTES = 4 * 1024 * 1024
"""The most GetJobLog returns in one call."""
IMAGE_CHUNK_BYTES = 1024 * 1024
"""Bytes of an image archive per ImportImage message (the frontend takes up to 4 MiB a message)."""
CLIENT_WRITE_RACE = "Internal error from Core"
"""What grpcio's client reports (INTERNAL) instead of the server's status when the server ends a client stream
while the client still writes to it (grpc/grpc#36066)."""
_STATES = {"failed": job_state_pb2.JOB_STATE_FAILED, "error": job_state_pb2.JOB_STATE_ERROR,
           "cancelled": job_state_pb2.JOB_STATE_CANCELLED}
_ROLES = {"user": user_pb2.ROLE_USER, "developer": user_pb2.ROLE_DEVELOPER, "admin": user_pb2.ROLE_ADMIN}
_INSTANCE_STATES = {"pending": fleet_pb2.INSTANCE_STATE_PENDING, "active": fleet_pb2.INSTANCE_STATE_ACTIVE,
                    "inactive": fleet_pb2.INSTANCE_STATE_INACTIVE, "deleted": fleet_pb2.INSTANCE_STATE_DELETED}
_BREAKDOWNS = {None: spend_pb2.SPEND_BREAKDOWN_UNSPECIFIED, "day": spend_pb2.SPEND_BREAKDOWN_DAY,
               "batch": spend_pb2.SPEND_BREAKDOWN_BATCH, "user": spend_pb2.SPEND_BREAKDOWN_USER}


def micro_usd(usd: float | None) -> int | None:
    """Dollars to the API's micro-dollars (None stays None: no limit)."""
    return None if usd is None else round(usd * 1_000_000)


def _set_limit(project: str, limit_usd: float | None, max_job_duration_s: float | None) -> cpb.SetLimitRequest:
    request = cpb.SetLimitRequest(billing_project=project, limit_micro_usd=micro_usd(limit_usd))
    if max_job_duration_s is not None:
        request.max_job_duration.FromMilliseconds(round(max_job_duration_s * 1000))
    return request


def rerun_request(batch_id: int, states: Iterable[str], token: str | None) -> bpb.RerunFailedJobsRequest:
    """`states` by name (failed, error, cancelled); empty means failed and error."""
    try:
        codes = [_STATES[s.lower()] for s in states]
    except KeyError as e:
        raise UsageError(f"unknown state {e.args[0]!r}: failed, error or cancelled") from None
    return bpb.RerunFailedJobsRequest(batch_id=batch_id, states=codes, idempotency_token=token or str(uuid.uuid4()))


def create_user_request(username: str, roles: Sequence[str], password: str | None, service: bool,
                        display_name: str, email: str) -> apb.CreateUserRequest:
    try:
        role_codes = [_ROLES[r] for r in roles]
    except KeyError as e:
        raise UsageError(f"unknown role {e.args[0]!r}: user, developer or admin") from None
    kind = user_pb2.USER_KIND_SERVICE if service else user_pb2.USER_KIND_PERSON
    return apb.CreateUserRequest(username=username, kind=kind, roles=role_codes, password=password or "",
                                 display_name=display_name, email=email)


def create_token_request(name: str, username: str, ttl_s: float | None) -> apb.CreateTokenRequest:
    ttl = None
    if ttl_s is not None:
        ttl = duration_pb2.Duration()
        ttl.FromMilliseconds(int(ttl_s * 1000))
    return apb.CreateTokenRequest(name=name, username=username, ttl=ttl)


def spend_request(project: str, breakdown: str | None, first_day: str, last_day: str, page_token: str
                  ) -> cpb.GetSpendRequest:
    if breakdown not in _BREAKDOWNS:
        raise UsageError(f"unknown breakdown {breakdown!r}: day, batch or user")
    return cpb.GetSpendRequest(billing_project=project, breakdown=_BREAKDOWNS[breakdown], first_day=first_day,
                               last_day=last_day, page_token=page_token)


class AsyncCalls:
    """The calls; `corral.aio.Client` opens the stubs and is the `_call` every unary call goes through."""

    _call: Callable[[Callable[..., Awaitable[T]], Any], Awaitable[T]]  # type: ignore[valid-type]
    _metadata: tuple[tuple[str, str], ...]
    _batches: batch_service_pb2_grpc.BatchServiceStub
    _jobs: job_service_pb2_grpc.JobServiceStub
    _groups: job_group_service_pb2_grpc.JobGroupServiceStub
    _billing: billing_service_pb2_grpc.BillingServiceStub
    _locks: lock_service_pb2_grpc.LockServiceStub
    _fleet: fleet_service_pb2_grpc.FleetServiceStub
    _secrets: secret_service_pb2_grpc.SecretServiceStub
    _images: image_service_pb2_grpc.ImageServiceStub
    _auth: auth_service_pb2_grpc.AuthServiceStub | None
    """None without an auth address."""

    def _open_stubs(self, channel: grpc.aio.Channel, auth_channel: grpc.aio.Channel | None) -> None:
        self._batches = batch_service_pb2_grpc.BatchServiceStub(channel)
        self._jobs = job_service_pb2_grpc.JobServiceStub(channel)
        self._groups = job_group_service_pb2_grpc.JobGroupServiceStub(channel)
        self._billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        self._locks = lock_service_pb2_grpc.LockServiceStub(channel)
        self._fleet = fleet_service_pb2_grpc.FleetServiceStub(channel)
        self._secrets = secret_service_pb2_grpc.SecretServiceStub(channel)
        self._images = image_service_pb2_grpc.ImageServiceStub(channel)
        self._auth = auth_service_pb2_grpc.AuthServiceStub(auth_channel) if auth_channel is not None else None

    def _auth_stub(self) -> auth_service_pb2_grpc.AuthServiceStub:
        if self._auth is None:
            raise UsageError("users and tokens are managed by the auth service: give the client its auth_address")
        return self._auth

    def _pages(self, method: Callable[..., Awaitable[Any]], request: Any, field: str) -> Pages[Any]:
        """The items in `field` of the list call `method`, page by page from `request` on."""
        return Pages(functools.partial(self._call, method), request, field)

    def jobs(self, batch_id: int, query: str = "", page_size: int = 100, with_parents: bool = False,
             with_attempts: bool = False) -> AsyncIterator[job_pb2.Job]:
        """The batch's jobs matching `query` (the query language), by increasing id; with their parents' ids
        (`parent_job_ids`) and their attempts when asked (each read once per page, not per job)."""
        return self._pages(self._jobs.ListJobs, jpb.ListJobsRequest(
            batch_id=batch_id, query=query, page_size=page_size, with_parents=with_parents,
            with_attempts=with_attempts), "jobs")

    async def get_job(self, batch_id: int, job_id: int) -> job_pb2.Job:
        """One job with its spec and attempts."""
        return (await self._call(self._jobs.GetJob, jpb.GetJobRequest(batch_id=batch_id, job_id=job_id))).job

    async def explain_job(self, batch_id: int, job_id: int) -> job_explanation_pb2.JobExplanation:
        """Why the job is not running (or that it is, or is finished)."""
        return (await self._call(self._jobs.ExplainJob,
                                 jpb.ExplainJobRequest(batch_id=batch_id, job_id=job_id))).explanation

    async def job_log(self, batch_id: int, job_id: int, attempt: str | None = None, start_byte: int = 0) -> bytes:
        """The log of an attempt (default: the latest) as written so far, from `start_byte`
        (negative: from the end)."""
        data, offset = b"", start_byte
        while True:
            chunk = await self._call(self._jobs.GetJobLog, jpb.GetJobLogRequest(
                batch_id=batch_id, job_id=job_id, attempt_id=attempt or "", start_byte=offset,
                max_bytes=LOG_READ_BYTES))
            data += chunk.data
            offset = chunk.start_byte + len(chunk.data)
            if not chunk.data or offset >= chunk.total_bytes:
                return data

    async def attempt_usage(self, batch_id: int, job_id: int, attempt: str | None = None
                            ) -> jpb.GetAttemptUsageResponse:
        """An attempt's (default: the latest) resource usage over time: `samples` (cpu time, memory now and
        at its peak, block I/O; each a `UsageSample`, oldest first, the end-of-attempt reading last),
        `summary`, and `note` saying what is missing. While the attempt runs, the samples so far (from its
        worker) and `complete` false."""
        return await self._call(self._jobs.GetAttemptUsage, jpb.GetAttemptUsageRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt or ""))

    async def follow_log(self, batch_id: int, job_id: int, attempt: str | None = None, start_byte: int = 0
                         ) -> AsyncIterator[bytes]:
        """The log's bytes from `start_byte`, then what the attempt writes, until it ends. Without `attempt`,
        the job's: it waits for the job to start if it has not, goes on with each later attempt (a retry)
        and ends when the job is final; `follow_log_messages` tells the attempts apart."""
        async for message in self.follow_log_messages(batch_id, job_id, attempt, start_byte):
            if message.data:
                yield message.data

    async def follow_log_messages(self, batch_id: int, job_id: int, attempt: str | None = None,
                                  start_byte: int = 0) -> AsyncIterator[jpb.StreamJobLogResponse]:
        """`follow_log` as the server sends it (`StreamJobLogResponse`): without `attempt`, an empty message
        first if the job has not run yet, then for each attempt a message without data naming it
        (`attempt_id`, `attempt_number`, `instance_name`) followed by its log's `data`, and last a message
        whose `job_state` is the state the job ended in."""
        call = self._jobs.StreamJobLog(jpb.StreamJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt or "", start_byte=start_byte),
            metadata=self._metadata)
        try:
            async for message in call:
                yield message
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    def job_groups(self, batch_id: int, parent_job_group_id: int | None = None
                   ) -> AsyncIterator[job_group_pb2.JobGroup]:
        """The batch's job groups (or one group's children) by increasing id."""
        return self._pages(self._groups.ListJobGroups, gpb.ListJobGroupsRequest(
            batch_id=batch_id, parent_job_group_id=parent_job_group_id), "job_groups")

    async def cancel_job_group(self, batch_id: int, job_group_id: int, reason: str = "") -> job_group_pb2.JobGroup:
        """Cancel a group and its subtree (0: the whole batch)."""
        return (await self._call(self._groups.CancelJobGroup, gpb.CancelJobGroupRequest(
            batch_id=batch_id, job_group_id=job_group_id, reason=reason))).job_group

    async def hold(self, batch_id: int, job_id: int | None = None, job_group_id: int | None = None) -> str:
        """Hold the batch, one job group (with the groups under it) or one job: its Ready jobs stay Ready but
        are not scheduled until `release`. Returns what changed: 'held', 'already held' or 'complete' (a final
        job: nothing to hold)."""
        request = bpb.HoldJobsRequest(batch_id=batch_id, **_hold_target(job_id, job_group_id))
        return _change_words((await self._call(self._batches.HoldJobs, request)).change)

    async def release(self, batch_id: int, job_id: int | None = None, job_group_id: int | None = None) -> str:
        """Release the hold of the batch, of one job group or of one job (only that hold: a job whose group is
        held too stays held). Returns 'released' or 'not held'."""
        request = bpb.ReleaseJobsRequest(batch_id=batch_id, **_hold_target(job_id, job_group_id))
        return _change_words((await self._call(self._batches.ReleaseJobs, request)).change)

    async def delete_batch(self, batch_id: int) -> None:
        """Cancel the batch if it runs and hide it from every read."""
        await self._call(self._batches.DeleteBatch, bpb.DeleteBatchRequest(batch_id=batch_id))

    async def rerun_failed(self, batch_id: int, states: Iterable[str] = (), token: str | None = None
                           ) -> update_pb2.Update | None:
        """Re-run the failed jobs and their dependents as a new update; None if none failed."""
        response = await self._call(self._batches.RerunFailedJobs, rerun_request(batch_id, states, token))
        return response.update if response.HasField("update") else None

    def locks(self, project: str = "", level: str = "", name: str = "", page_size: int = 0
              ) -> AsyncIterator[lock_pb2.LockStatus]:
        """Locks held by running jobs or wanted by ready ones, with their holders and waiters, by billing
        project, level and name: of `project` (default: every project the caller may see), at `level`, named
        `name` (with `level`)."""
        return self._pages(self._locks.ListLocks, lpb.ListLocksRequest(
            billing_project=project, level=level, name=name, page_size=page_size), "locks")

    async def create_secret(self, project: str, name: str, files: Mapping[str, bytes], replace: bool = False
                            ) -> secret_pb2.Secret:
        """Store a secret of `project`: its files (file name to content), which the project's jobs mount
        read-only (JobSpec.secrets) and no call returns again. A taken name is ALREADY_EXISTS unless
        `replace`."""
        return (await self._call(self._secrets.CreateSecret, spb.CreateSecretRequest(
            billing_project=project, name=name, files=dict(files), replace=replace))).secret

    def secrets(self, project: str, page_size: int = 0) -> AsyncIterator[secret_pb2.Secret]:
        """The project's secrets by name: names, file names and who made them when; never contents."""
        return self._pages(self._secrets.ListSecrets,
                           spb.ListSecretsRequest(billing_project=project, page_size=page_size), "secrets")

    async def delete_secret(self, project: str, name: str) -> None:
        """Delete a secret of `project`; jobs submitted before that mount it end in Error when they start."""
        await self._call(self._secrets.DeleteSecret, spb.DeleteSecretRequest(billing_project=project, name=name))

    async def import_image(self, project: str, path: str | os.PathLike[str], name: str, tag: str = "latest"
                           ) -> image_pb2.Image:
        """Import the image archive at `path` (a `docker save` tarball, or an OCI layout tarball as `skopeo copy
        ... oci-archive:` writes it) into `project` as `localhost/PROJECT/NAME:TAG`, which the project's jobs
        name as their image; an existing tag is replaced. Returns the image: its reference and digest."""
        archive = os.fspath(path)
        if not os.path.isfile(archive):
            raise UsageError(f"{archive}: no such file")

        header = ipb.ImportImageRequest(header=ipb.ImportImageHeader(billing_project=project, name=name, tag=tag,
                                                                     size_bytes=os.path.getsize(archive)))

        async def messages(with_archive: bool) -> AsyncIterator[ipb.ImportImageRequest]:
            yield header
            if not with_archive:
                return
            with open(archive, "rb") as f:
                while chunk := f.read(IMAGE_CHUNK_BYTES):
                    yield ipb.ImportImageRequest(chunk=chunk)

        def upload(with_archive: bool, metadata: Any) -> Awaitable[ipb.ImportImageResponse]:
            return self._images.ImportImage(messages(with_archive), metadata=metadata)  # a new stream at each try

        try:
            return (await self._call(upload, True)).image
        except CorralError as e:
            if e.code != grpc.StatusCode.INTERNAL or CLIENT_WRITE_RACE not in e.message:
                raise
            # grpcio's client may report INTERNAL instead of the server's answer when the server refuses the
            # header (a bad name, a project not the caller's, an archive too large) while chunks are still being
            # written (grpc/grpc#36066). The header alone gets that answer; if the header was fine, the first error
            # stands.
            try:
                await self._call(upload, False)
            except CorralError as refusal:
                if not any(v.field == "chunk" for v in refusal.field_violations):
                    raise refusal from None
            raise

    def images(self, project: str, page_size: int = 0) -> AsyncIterator[image_pb2.Image]:
        """The images `project`'s jobs may run from corral's own registry: its own (`localhost/PROJECT/...`),
        then the base images (`docker.io/library/...`), each with its tag, digest, size and how many live workers
        hold it (`workers_holding`, unset when the drivers could not be asked); then the public images only
        workers hold, by the reference they were pulled as."""
        return self._pages(self._images.ListImages,
                           ipb.ListImagesRequest(billing_project=project, page_size=page_size), "images")

    async def delete_image(self, project: str, name: str, tag: str = "latest") -> None:
        """Delete tag `tag` of `project`'s image `name` (`localhost/PROJECT/NAME:TAG`)."""
        await self._call(self._images.DeleteImage,
                         ipb.DeleteImageRequest(billing_project=project, name=name, tag=tag))

    def billing_projects(self, member: str = "") -> AsyncIterator[billing_project_pb2.BillingProject]:
        """The billing projects the caller may see, by name."""
        return self._pages(self._billing.ListBillingProjects, cpb.ListBillingProjectsRequest(member=member),
                           "billing_projects")

    async def billing_project(self, name: str) -> billing_project_pb2.BillingProject:
        """One billing project, with its members and limit."""
        return (await self._call(self._billing.GetBillingProject,
                                 cpb.GetBillingProjectRequest(billing_project=name))).billing_project

    async def create_billing_project(self, name: str, members: Sequence[str] = (), limit_usd: float | None = None
                                     ) -> billing_project_pb2.BillingProject:
        """An open billing project with `members` and a spending limit in USD (None: none); administrators
        only."""
        return (await self._call(self._billing.CreateBillingProject, cpb.CreateBillingProjectRequest(
            name=name, members=list(members), limit_micro_usd=micro_usd(limit_usd)))).billing_project

    async def add_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        """Add a user to the project's members (again: no change); administrators only."""
        return (await self._call(self._billing.AddMember, cpb.AddMemberRequest(
            billing_project=project, username=username))).billing_project

    async def remove_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        """Remove a user from the project's members (their running batches go on); administrators, or a
        member removing themselves."""
        return (await self._call(self._billing.RemoveMember, cpb.RemoveMemberRequest(
            billing_project=project, username=username))).billing_project

    async def set_limit(self, project: str, limit_usd: float | None, max_job_duration_s: float | None = None
                        ) -> billing_project_pb2.BillingProject:
        """A spending limit in USD; None removes it. `max_job_duration_s`: the timeout of the project's jobs
        without one while it has a limit (None keeps it)."""
        return (await self._call(self._billing.SetLimit, _set_limit(project, limit_usd,
                                                                    max_job_duration_s))).billing_project

    async def close_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        """Close the project: new batches and updates are refused; administrators only."""
        return (await self._call(self._billing.CloseBillingProject,
                                 cpb.CloseBillingProjectRequest(billing_project=project))).billing_project

    async def reopen_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        """Reopen a closed project; administrators only."""
        return (await self._call(self._billing.ReopenBillingProject,
                                 cpb.ReopenBillingProjectRequest(billing_project=project))).billing_project

    async def set_quota(self, name: str, *, user: bool = False, running_cores: str | int | float | None = None,
                        running_jobs: int | None = None, ready_jobs: int | None = None, weight: int = 1
                        ) -> quota_pb2.Quota:
        """Set the quota of billing project `name` (of user `name` if `user`), whole: caps on its running cores
        (cores, or "250m"), running jobs and ready (open) jobs, each None for no cap, counted across every pool,
        and its fair-share weight (1 to 1000). No cap and weight 1 clears it. Administrators only."""
        return (await self._call(self._billing.SetQuota, cpb.SetQuotaRequest(
            kind=quota_pb2.QUOTA_KIND_USER if user else quota_pb2.QUOTA_KIND_PROJECT, name=name,
            max_running_cores_mcpu=None if running_cores is None else parse_mcpu(running_cores),
            max_running_jobs=running_jobs, max_ready_jobs=ready_jobs, weight=weight))).quota

    def quotas(self, kind: str | None = None) -> AsyncIterator[quota_pb2.Quota]:
        """The quotas set (`kind`: 'project' or 'user'; None: both), projects first, by name: administrators
        see every one, others their projects' and their own."""
        kinds = {None: quota_pb2.QUOTA_KIND_UNSPECIFIED, "project": quota_pb2.QUOTA_KIND_PROJECT,
                 "user": quota_pb2.QUOTA_KIND_USER}
        if kind not in kinds:
            raise UsageError(f"a quota's kind is 'project' or 'user', not {kind!r}")
        return self._pages(self._billing.ListQuotas, cpb.ListQuotasRequest(kind=kinds[kind]), "quotas")

    async def spend(self, project: str, breakdown: str | None = None, first_day: str = "", last_day: str = ""
                    ) -> tuple[int, list[spend_pb2.SpendLine]]:
        """Total spend in micro-USD over the days, and its lines by `breakdown` (day, batch, user)."""
        lines: list[spend_pb2.SpendLine] = []
        token = ""
        while True:
            page = await self._call(self._billing.GetSpend,
                                    spend_request(project, breakdown, first_day, last_day, token))
            lines += page.lines
            token = page.next_page_token
            if not token:
                return page.total_micro_usd, lines

    async def reservations(self, project: str) -> list[spend_pb2.Reservation]:
        """The budget the project's running work holds now, per batch (the largest first, at most 1000)."""
        return list((await self._call(self._billing.GetSpend, cpb.GetSpendRequest(billing_project=project))
                     ).reservations)

    async def pools(self) -> list[fleet_pb2.Pool]:
        """The deployment's pools (and job-private collection) with their instances' counts; administrators
        only."""
        return list((await self._call(self._fleet.ListPools, fpb.ListPoolsRequest())).pools)

    async def pause_pool(self, pool: str) -> fleet_pb2.Pool:
        """Pause a pool: nothing new starts there and it gets no new machine; its running jobs finish.
        Administrators only."""
        return (await self._call(self._fleet.PausePool, fpb.PausePoolRequest(pool=pool))).pool

    async def resume_pool(self, pool: str) -> fleet_pb2.Pool:
        """Resume a paused pool: its ready jobs are scheduled again. Administrators only."""
        return (await self._call(self._fleet.ResumePool, fpb.ResumePoolRequest(pool=pool))).pool

    def instances(self, pool: str = "", state: str | None = None) -> AsyncIterator[fleet_pb2.Instance]:
        """The instances of `pool` (default: every pool) in `state` (pending, active, inactive, deleted; default:
        every state but deleted), by name; administrators only."""
        if state is not None and state not in _INSTANCE_STATES:
            raise UsageError(f"unknown state {state!r}: pending, active, inactive or deleted")
        request = fpb.ListInstancesRequest(pool=pool, state=_INSTANCE_STATES.get(state or "", 0))
        return self._pages(self._fleet.ListInstances, request, "instances")

    async def create_user(self, username: str, roles: Sequence[str] = ("user",), password: str | None = None,
                          service: bool = False, display_name: str = "", email: str = "") -> user_pb2.User:
        """A person (or service identity); administrators only."""
        return (await self._call(self._auth_stub().CreateUser, create_user_request(
            username, roles, password, service, display_name, email))).user

    def users(self) -> AsyncIterator[user_pb2.User]:
        """Every user by username; administrators only."""
        return self._pages(self._auth_stub().ListUsers, apb.ListUsersRequest(), "users")

    async def create_token(self, name: str, username: str = "", ttl_s: float | None = None
                           ) -> tuple[token_pb2.Token, str]:
        """A named API token (for another user: administrators only) and its secret, shown once."""
        response = await self._call(self._auth_stub().CreateToken, create_token_request(name, username, ttl_s))
        return response.token, response.secret

    async def deactivate_user(self, username: str) -> user_pb2.User:
        """Deactivate a user and revoke their tokens; administrators only."""
        return (await self._call(self._auth_stub().DeactivateUser,
                                 apb.DeactivateUserRequest(username=username))).user


def _hold_target(job_id: int | None, job_group_id: int | None) -> dict[str, int]:
    if job_id is not None and job_group_id is not None:
        raise ValueError("hold or release a job or a job group, not both")
    return {"job_id": job_id} if job_id is not None else (
        {"job_group_id": job_group_id} if job_group_id is not None else {})


def _change_words(change: int) -> str:
    """HOLD_CHANGE_ALREADY_HELD -> 'already held'."""
    return bpb.HoldChange.Name(change).removeprefix("HOLD_CHANGE_").lower().replace("_", " ")
