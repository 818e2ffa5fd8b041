"""Jobs, logs, job groups, re-runs, locks, billing projects and users for the clients.

`AsyncCalls` (mixed into `corral.aio.Client`) and `Calls` (into
`corral.Client`) are the same calls, asyncio and blocking. Jobs, groups and
billing go to the frontend; users and tokens to the auth service, whose
address the client must then be given (`auth_address`). Lists are
iterators that fetch page after page; every error the server returns is a
typed `corral.errors.CorralError`, and a mistake found before any call (an
unknown state, role or breakdown; users asked of a client without an auth
address) is a `corral.errors.UsageError`.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc, token_pb2, user_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_explanation_pb2, job_group_pb2, job_group_service_pb2_grpc, job_pb2
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_service_pb2_grpc, job_state_pb2, lock_pb2, lock_service_pb2_grpc, update_pb2
from corral.batch.v1 import lock_service_pb2 as lpb
from corral.billing.v1 import billing_project_pb2, billing_service_pb2_grpc, spend_pb2
from corral.billing.v1 import billing_service_pb2 as cpb
from corral.errors import UsageError, from_rpc_error

T = TypeVar("T")
LOG_READ_BYTES = 4 * 1024 * 1024
"""The most GetJobLog returns in one call."""
_STATES = {"failed": job_state_pb2.JOB_STATE_FAILED, "error": job_state_pb2.JOB_STATE_ERROR,
           "cancelled": job_state_pb2.JOB_STATE_CANCELLED}
_ROLES = {"user": user_pb2.ROLE_USER, "developer": user_pb2.ROLE_DEVELOPER, "admin": user_pb2.ROLE_ADMIN}
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


class _Stubs:
    """The stubs both mixins call; `_auth` is None without an auth address."""

    _call: Callable[..., Any]
    _jobs: job_service_pb2_grpc.JobServiceStub
    _groups: job_group_service_pb2_grpc.JobGroupServiceStub
    _billing: billing_service_pb2_grpc.BillingServiceStub
    _locks: lock_service_pb2_grpc.LockServiceStub
    _auth: auth_service_pb2_grpc.AuthServiceStub | None
    _batches: Any

    def _open_stubs(self, channel: Any, auth_channel: Any | None) -> None:
        self._jobs = job_service_pb2_grpc.JobServiceStub(channel)
        self._groups = job_group_service_pb2_grpc.JobGroupServiceStub(channel)
        self._billing = billing_service_pb2_grpc.BillingServiceStub(channel)
        self._locks = lock_service_pb2_grpc.LockServiceStub(channel)
        self._auth = auth_service_pb2_grpc.AuthServiceStub(auth_channel) if auth_channel is not None else None

    def _auth_stub(self) -> auth_service_pb2_grpc.AuthServiceStub:
        if self._auth is None:
            raise UsageError("users and tokens are managed by the auth service: give the client its auth_address")
        return self._auth


class AsyncCalls(_Stubs):
    """The asyncio calls; see the module docstring."""

    _call: Callable[[Callable[..., Awaitable[T]], Any], Awaitable[T]]  # type: ignore[valid-type]
    _metadata: tuple[tuple[str, str], ...]

    async def jobs(self, batch_id: int, query: str = "", page_size: int = 100) -> AsyncIterator[job_pb2.Job]:
        """The batch's jobs matching `query` (the query language), by increasing id."""
        token = ""
        while True:
            page = await self._call(self._jobs.ListJobs, jpb.ListJobsRequest(
                batch_id=batch_id, query=query, page_size=page_size, page_token=token))
            for job in page.jobs:
                yield job
            token = page.next_page_token
            if not token:
                return

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

    async def follow_log(self, batch_id: int, job_id: int, attempt: str | None = None, start_byte: int = 0
                         ) -> AsyncIterator[bytes]:
        """The log from `start_byte`, then what the running attempt writes, until it ends."""
        call = self._jobs.StreamJobLog(jpb.StreamJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt or "", start_byte=start_byte),
            metadata=self._metadata)
        try:
            async for chunk in call:
                yield chunk.data
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    async def job_groups(self, batch_id: int, parent_job_group_id: int | None = None
                         ) -> AsyncIterator[job_group_pb2.JobGroup]:
        """The batch's job groups (or one group's children) by increasing id."""
        token = ""
        while True:
            page = await self._call(self._groups.ListJobGroups, gpb.ListJobGroupsRequest(
                batch_id=batch_id, parent_job_group_id=parent_job_group_id, page_token=token))
            for group in page.job_groups:
                yield group
            token = page.next_page_token
            if not token:
                return

    async def cancel_job_group(self, batch_id: int, job_group_id: int, reason: str = "") -> job_group_pb2.JobGroup:
        """Cancel a group and its subtree (0: the whole batch)."""
        return (await self._call(self._groups.CancelJobGroup, gpb.CancelJobGroupRequest(
            batch_id=batch_id, job_group_id=job_group_id, reason=reason))).job_group

    async def delete_batch(self, batch_id: int) -> None:
        """Cancel the batch if it runs and hide it from every read."""
        await self._call(self._batches.DeleteBatch, bpb.DeleteBatchRequest(batch_id=batch_id))

    async def rerun_failed(self, batch_id: int, states: Iterable[str] = (), token: str | None = None
                           ) -> update_pb2.Update | None:
        """Re-run the failed jobs and their dependents as a new update; None if none failed."""
        response = await self._call(self._batches.RerunFailedJobs, rerun_request(batch_id, states, token))
        return response.update if response.HasField("update") else None

    async def locks(self, project: str = "", level: str = "", name: str = "", page_size: int = 0
                    ) -> AsyncIterator[lock_pb2.LockStatus]:
        """Locks held by running jobs or wanted by ready ones, with their holders and waiters, by billing
        project, level and name: of `project` (default: every project the caller may see), at `level`, named
        `name` (with `level`)."""
        request = lpb.ListLocksRequest(billing_project=project, level=level, name=name, page_size=page_size)
        while True:
            page = await self._call(self._locks.ListLocks, request)
            for lock in page.locks:
                yield lock
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    async def billing_projects(self, member: str = "") -> AsyncIterator[billing_project_pb2.BillingProject]:
        """The billing projects the caller may see, by name."""
        token = ""
        while True:
            page = await self._call(self._billing.ListBillingProjects,
                                    cpb.ListBillingProjectsRequest(member=member, page_token=token))
            for project in page.billing_projects:
                yield project
            token = page.next_page_token
            if not token:
                return

    async def billing_project(self, name: str) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.GetBillingProject,
                                 cpb.GetBillingProjectRequest(billing_project=name))).billing_project

    async def create_billing_project(self, name: str, members: Sequence[str] = (), limit_usd: float | None = None
                                     ) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.CreateBillingProject, cpb.CreateBillingProjectRequest(
            name=name, members=list(members), limit_micro_usd=micro_usd(limit_usd)))).billing_project

    async def add_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.AddMember, cpb.AddMemberRequest(
            billing_project=project, username=username))).billing_project

    async def remove_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.RemoveMember, cpb.RemoveMemberRequest(
            billing_project=project, username=username))).billing_project

    async def set_limit(self, project: str, limit_usd: float | None, max_job_duration_s: float | None = None
                        ) -> billing_project_pb2.BillingProject:
        """A spending limit in USD; None removes it. `max_job_duration_s`: the timeout of the project's jobs
        without one while it has a limit (None keeps it)."""
        return (await self._call(self._billing.SetLimit, _set_limit(project, limit_usd,
                                                                    max_job_duration_s))).billing_project

    async def close_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.CloseBillingProject,
                                 cpb.CloseBillingProjectRequest(billing_project=project))).billing_project

    async def reopen_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        return (await self._call(self._billing.ReopenBillingProject,
                                 cpb.ReopenBillingProjectRequest(billing_project=project))).billing_project

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

    async def create_user(self, username: str, roles: Sequence[str] = ("user",), password: str | None = None,
                          service: bool = False, display_name: str = "", email: str = "") -> user_pb2.User:
        """A person (or service identity); administrators only."""
        return (await self._call(self._auth_stub().CreateUser, create_user_request(
            username, roles, password, service, display_name, email))).user

    async def users(self) -> AsyncIterator[user_pb2.User]:
        """Every user by username; administrators only."""
        token = ""
        while True:
            page = await self._call(self._auth_stub().ListUsers, apb.ListUsersRequest(page_token=token))
            for user in page.users:
                yield user
            token = page.next_page_token
            if not token:
                return

    async def create_token(self, name: str, username: str = "", ttl_s: float | None = None
                           ) -> tuple[token_pb2.Token, str]:
        """A named API token (for another user: administrators only) and its secret, shown once."""
        response = await self._call(self._auth_stub().CreateToken, create_token_request(name, username, ttl_s))
        return response.token, response.secret

    async def deactivate_user(self, username: str) -> user_pb2.User:
        """Deactivate a user and revoke their tokens; administrators only."""
        return (await self._call(self._auth_stub().DeactivateUser,
                                 apb.DeactivateUserRequest(username=username))).user


class Calls(_Stubs):
    """The blocking calls; see `AsyncCalls` for each one's contract."""

    _metadata: tuple[tuple[str, str], ...]

    def _pages(self, method: Callable[..., Any], request: Any, items: str) -> Iterator[Any]:
        while True:
            page = self._call(method, request)
            yield from getattr(page, items)
            if not page.next_page_token:
                return
            request.page_token = page.next_page_token

    def jobs(self, batch_id: int, query: str = "", page_size: int = 100) -> Iterator[job_pb2.Job]:
        return self._pages(self._jobs.ListJobs, jpb.ListJobsRequest(batch_id=batch_id, query=query,
                                                                    page_size=page_size), "jobs")

    def get_job(self, batch_id: int, job_id: int) -> job_pb2.Job:
        return self._call(self._jobs.GetJob, jpb.GetJobRequest(batch_id=batch_id, job_id=job_id)).job

    def explain_job(self, batch_id: int, job_id: int) -> job_explanation_pb2.JobExplanation:
        return self._call(self._jobs.ExplainJob, jpb.ExplainJobRequest(batch_id=batch_id, job_id=job_id)).explanation

    def job_log(self, batch_id: int, job_id: int, attempt: str | None = None, start_byte: int = 0) -> bytes:
        data, offset = b"", start_byte
        while True:
            chunk = self._call(self._jobs.GetJobLog, jpb.GetJobLogRequest(
                batch_id=batch_id, job_id=job_id, attempt_id=attempt or "", start_byte=offset,
                max_bytes=LOG_READ_BYTES))
            data += chunk.data
            offset = chunk.start_byte + len(chunk.data)
            if not chunk.data or offset >= chunk.total_bytes:
                return data

    def follow_log(self, batch_id: int, job_id: int, attempt: str | None = None, start_byte: int = 0
                   ) -> Iterator[bytes]:
        call = self._jobs.StreamJobLog(jpb.StreamJobLogRequest(
            batch_id=batch_id, job_id=job_id, attempt_id=attempt or "", start_byte=start_byte),
            metadata=self._metadata)
        try:
            for chunk in call:
                yield chunk.data
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    def job_groups(self, batch_id: int, parent_job_group_id: int | None = None) -> Iterator[job_group_pb2.JobGroup]:
        return self._pages(self._groups.ListJobGroups, gpb.ListJobGroupsRequest(
            batch_id=batch_id, parent_job_group_id=parent_job_group_id), "job_groups")

    def cancel_job_group(self, batch_id: int, job_group_id: int, reason: str = "") -> job_group_pb2.JobGroup:
        return self._call(self._groups.CancelJobGroup, gpb.CancelJobGroupRequest(
            batch_id=batch_id, job_group_id=job_group_id, reason=reason)).job_group

    def delete_batch(self, batch_id: int) -> None:
        self._call(self._batches.DeleteBatch, bpb.DeleteBatchRequest(batch_id=batch_id))

    def rerun_failed(self, batch_id: int, states: Iterable[str] = (), token: str | None = None
                     ) -> update_pb2.Update | None:
        response = self._call(self._batches.RerunFailedJobs, rerun_request(batch_id, states, token))
        return response.update if response.HasField("update") else None

    def locks(self, project: str = "", level: str = "", name: str = "", page_size: int = 0
              ) -> Iterator[lock_pb2.LockStatus]:
        return self._pages(self._locks.ListLocks, lpb.ListLocksRequest(
            billing_project=project, level=level, name=name, page_size=page_size), "locks")

    def billing_projects(self, member: str = "") -> Iterator[billing_project_pb2.BillingProject]:
        return self._pages(self._billing.ListBillingProjects, cpb.ListBillingProjectsRequest(member=member),
                           "billing_projects")

    def billing_project(self, name: str) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.GetBillingProject,
                          cpb.GetBillingProjectRequest(billing_project=name)).billing_project

    def create_billing_project(self, name: str, members: Sequence[str] = (), limit_usd: float | None = None
                               ) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.CreateBillingProject, cpb.CreateBillingProjectRequest(
            name=name, members=list(members), limit_micro_usd=micro_usd(limit_usd))).billing_project

    def add_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.AddMember, cpb.AddMemberRequest(
            billing_project=project, username=username)).billing_project

    def remove_member(self, project: str, username: str) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.RemoveMember, cpb.RemoveMemberRequest(
            billing_project=project, username=username)).billing_project

    def set_limit(self, project: str, limit_usd: float | None, max_job_duration_s: float | None = None
                  ) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.SetLimit, _set_limit(project, limit_usd, max_job_duration_s)).billing_project

    def close_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.CloseBillingProject,
                          cpb.CloseBillingProjectRequest(billing_project=project)).billing_project

    def reopen_billing_project(self, project: str) -> billing_project_pb2.BillingProject:
        return self._call(self._billing.ReopenBillingProject,
                          cpb.ReopenBillingProjectRequest(billing_project=project)).billing_project

    def spend(self, project: str, breakdown: str | None = None, first_day: str = "", last_day: str = ""
              ) -> tuple[int, list[spend_pb2.SpendLine]]:
        lines: list[spend_pb2.SpendLine] = []
        token = ""
        while True:
            page = self._call(self._billing.GetSpend, spend_request(project, breakdown, first_day, last_day, token))
            lines += page.lines
            token = page.next_page_token
            if not token:
                return page.total_micro_usd, lines

    def create_user(self, username: str, roles: Sequence[str] = ("user",), password: str | None = None,
                    service: bool = False, display_name: str = "", email: str = "") -> user_pb2.User:
        return self._call(self._auth_stub().CreateUser, create_user_request(
            username, roles, password, service, display_name, email)).user

    def users(self) -> Iterator[user_pb2.User]:
        return self._pages(self._auth_stub().ListUsers, apb.ListUsersRequest(), "users")

    def create_token(self, name: str, username: str = "", ttl_s: float | None = None) -> tuple[token_pb2.Token, str]:
        response = self._call(self._auth_stub().CreateToken, create_token_request(name, username, ttl_s))
        return response.token, response.secret

    def deactivate_user(self, username: str) -> user_pb2.User:
        return self._call(self._auth_stub().DeactivateUser, apb.DeactivateUserRequest(username=username)).user
