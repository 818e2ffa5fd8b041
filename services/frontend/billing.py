"""BillingService: translates protos to BillingStore calls and enforces who may do what.

The rules (readers, administrators; NOT_FOUND for everybody else) are in
the docstring of `services.frontend.billing_store`. Checks run in this
order: the fields' limits (lengths and ranges, before the servicer runs:
services.frontend.field_limits), the caller's role for RPCs no reader may
use (create), then the request's fields (INVALID_ARGUMENT with every
violation at once), then whether the project exists and the caller may see
it (NOT_FOUND "no billing project X" for both, so outsiders learn no project
names), then whether they may change it (PERMISSION_DENIED), then the
project's state (FAILED_PRECONDITION).
"""

from __future__ import annotations

import asyncio
import datetime
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from corral.billing.v1 import billing_project_pb2 as project_pb
from corral.billing.v1 import billing_service_pb2 as pb
from corral.billing.v1 import billing_service_pb2_grpc, quota_pb2, spend_pb2
from services.common.errors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidRequest,
    NotFound,
)
from services.common.identity import Principal, current_principal
from services.frontend import page_tokens
from services.frontend.billing_store import (
    MAX_MICRO_USD,
    BatchCostTracker,
    BillingProject,
    BillingStore,
    ProjectExists,
    StateRefuses,
    UnknownUser,
    may_read,
    micro_from_usd,
    sees_every_project,
    usd_from_micro,
)
from services.frontend.quota_store import KINDS, MAX_CAP, MAX_WEIGHT, QuotaRow, QuotaStore

_PROJECT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# The auth service's username rule (services/auth/servicer.py).
_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")
DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
DEFAULT_WATCH_INTERVAL_S = 10.0
"""WatchSpend's min_interval when unset (the contract's default)."""
MIN_WATCH_INTERVAL_S = 1.0
MAX_WATCH_INTERVAL_S = 3600.0
MAX_BATCH_DELTAS = 100
MAX_RESERVATIONS = 1000
"""Batches GetSpend lists the reservations of (the largest)."""

_STATES = {"open": project_pb.BILLING_PROJECT_STATE_OPEN, "closed": project_pb.BILLING_PROJECT_STATE_CLOSED,
           "deleted": project_pb.BILLING_PROJECT_STATE_DELETED}
_LIST_STATES = {project_pb.BILLING_PROJECT_STATE_UNSPECIFIED: ("open", "closed"),
                project_pb.BILLING_PROJECT_STATE_OPEN: ("open",),
                project_pb.BILLING_PROJECT_STATE_CLOSED: ("closed",),
                project_pb.BILLING_PROJECT_STATE_DELETED: ("deleted",)}
_BREAKDOWNS = {spend_pb2.SPEND_BREAKDOWN_DAY: "day", spend_pb2.SPEND_BREAKDOWN_BATCH: "batch",
               spend_pb2.SPEND_BREAKDOWN_USER: "user"}


def _timestamp(ms: int | None) -> timestamp_pb2.Timestamp | None:
    if ms is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def project_proto(project: BillingProject) -> project_pb.BillingProject:
    # closed_at stays unset: the schema records no close time.
    return project_pb.BillingProject(
        name=project.name, state=_STATES[project.state], members=list(project.members),
        limit_micro_usd=None if project.limit_usd is None else micro_from_usd(project.limit_usd),
        spend_micro_usd=micro_from_usd(project.spend_usd), reserved_micro_usd=project.reserved_micro_usd,
        created_at=_timestamp(project.created_at_ms),
        max_job_duration=duration_pb2.Duration(seconds=project.max_job_duration_ms // 1000,
                                               nanos=project.max_job_duration_ms % 1000 * 1_000_000))


def _raise_if(violations: list[FieldViolation]) -> None:
    if violations:
        raise InvalidRequest(violations)


def _reference(name: str, field: str = "billing_project") -> list[FieldViolation]:
    """A name that refers to an existing project: anything else is simply not found
    (its length is a field limit: services.frontend.field_limits)."""
    if not name:
        return [FieldViolation(field, "required")]
    return []


def _username(username: str, field: str) -> list[FieldViolation]:
    if not _USERNAME.match(username):
        return [FieldViolation(field, "a username: lower-case letters, digits, '_', '.', '-'; 1-64 long")]
    return []


def _limit(request: pb.CreateBillingProjectRequest | pb.SetLimitRequest) -> list[FieldViolation]:
    if request.HasField("limit_micro_usd") and not 0 <= request.limit_micro_usd <= MAX_MICRO_USD:
        return [FieldViolation("limit_micro_usd", f"must be between 0 and {MAX_MICRO_USD} (1e9 USD)")]
    return []


MAX_JOB_DURATION_S = 7 * 24 * 3600
"""The longest SetLimit's max_job_duration may be."""


def _max_job_duration(request: pb.SetLimitRequest) -> list[FieldViolation]:
    if not request.HasField("max_job_duration"):
        return []
    seconds = request.max_job_duration.ToTimedelta().total_seconds()
    if not 1 <= seconds <= MAX_JOB_DURATION_S:
        return [FieldViolation("max_job_duration", f"must be between 1 s and {MAX_JOB_DURATION_S} s (7 days)")]
    return []


def _limit_usd(request: pb.CreateBillingProjectRequest | pb.SetLimitRequest) -> float | None:
    return usd_from_micro(request.limit_micro_usd) if request.HasField("limit_micro_usd") else None


def _page_size(page_size: int) -> tuple[int, list[FieldViolation]]:
    if page_size < 0:
        return 0, [FieldViolation("page_size", "must not be negative")]
    return min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE), []




def _day(text: str, field: str) -> tuple[datetime.date | None, list[FieldViolation]]:
    if not text:
        return None, []
    try:
        if _DAY.match(text):
            return datetime.date.fromisoformat(text), []
    except ValueError:
        pass
    return None, [FieldViolation(field, "a UTC day, YYYY-MM-DD")]


_QUOTA_KINDS = {quota_pb2.QUOTA_KIND_PROJECT: "project", quota_pb2.QUOTA_KIND_USER: "user"}
_QUOTA_KIND_PROTOS = {kind: proto for proto, kind in _QUOTA_KINDS.items()}


def quota_proto(row: QuotaRow) -> quota_pb2.Quota:
    return quota_pb2.Quota(kind=_QUOTA_KIND_PROTOS[row.kind], name=row.name,
                           max_running_cores_mcpu=row.max_running_cores_mcpu, max_running_jobs=row.max_running_jobs,
                           max_ready_jobs=row.max_ready_jobs, weight=row.weight, set_by=row.set_by,
                           set_at=_timestamp(row.time_set_ms))


def _quota(request: pb.SetQuotaRequest) -> tuple[QuotaRow, list[FieldViolation]]:
    """The quota a SetQuota asks for, and what is wrong with it (set_quota checks the same ranges)."""
    violations = []
    kind = _QUOTA_KINDS.get(request.kind)
    if kind is None:
        violations.append(FieldViolation("kind", "QUOTA_KIND_PROJECT or QUOTA_KIND_USER"))
    if not request.name:
        violations.append(FieldViolation("name", "required: the billing project or the username"))
    caps = {}
    for field in ("max_running_cores_mcpu", "max_running_jobs", "max_ready_jobs"):
        value = getattr(request, field) if request.HasField(field) else None
        if value is not None and not 1 <= value <= MAX_CAP:
            violations.append(FieldViolation(field, f"must be between 1 and {MAX_CAP}, or unset for no cap"))
        caps[field] = value
    if not 0 <= request.weight <= MAX_WEIGHT:
        violations.append(FieldViolation("weight", f"must be between 1 and {MAX_WEIGHT} (0 means 1)"))
    return QuotaRow(kind or "", request.name, weight=request.weight or 1, **caps), violations


class BillingServicer(billing_service_pb2_grpc.BillingServiceServicer):
    """Billing projects, their members, limits, spend, and the quotas of projects and users."""

    def __init__(self, store: BillingStore, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 quotas: QuotaStore | None = None):
        self.store = store
        self.quotas = quotas or QuotaStore(store.db, store.clock_ms)
        self._sleep = sleep
        self.active_watches = 0
        """WatchSpend streams being served (a gauge; tests check streams end)."""

    async def _readable(self, name: str, principal: Principal) -> BillingProject:
        """The project if the caller may see it; NOT_FOUND alike if there is none or the caller
        is outside it (as for batches: services.frontend.access)."""
        project = await self.store.get_project(name)
        if project is None or not may_read(principal, project):
            raise NotFound(f"no billing project {name}")
        return project

    async def _changed(self, name: str) -> BillingProject:
        project = await self.store.get_project(name)
        assert project is not None  # rows are never removed
        return project

    async def _change(self, name: str, principal: Principal, change: Callable[[], Awaitable[None]],
                      allowed: Callable[[BillingProject], bool] | None = None) -> BillingProject:
        """Run `change` for an administrator (or when `allowed`); the project afterwards."""
        project = await self._readable(name, principal)
        if allowed is None or not allowed(project):
            principal.require_admin()
        try:
            await change()
        except StateRefuses as e:
            raise FailedPrecondition(e.message) from None
        except UnknownUser as e:
            raise NotFound(f"no user {e.username}") from None
        return await self._changed(name)

    async def CreateBillingProject(self, request: pb.CreateBillingProjectRequest, context: grpc.aio.ServicerContext
                                   ) -> pb.CreateBillingProjectResponse:
        principal = current_principal()
        principal.require_admin()
        violations = []
        if not _PROJECT_NAME.match(request.name):
            violations.append(FieldViolation(
                "name", "1-64 characters: lower-case letters, digits, '-', '_', starting with a letter or digit"))
        violations += _limit(request)
        for i, member in enumerate(request.members):
            violations += _username(member, f"members[{i}]")
        _raise_if(violations)
        try:
            project = await self.store.create_project(
                request.name, {*request.members, principal.name}, _limit_usd(request))
        except ProjectExists:
            raise AlreadyExists(f"billing project {request.name} exists") from None
        except UnknownUser as e:
            raise NotFound(f"no user {e.username}") from None
        return pb.CreateBillingProjectResponse(billing_project=project_proto(project))

    async def GetBillingProject(self, request: pb.GetBillingProjectRequest, context: grpc.aio.ServicerContext
                                ) -> pb.GetBillingProjectResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project))
        project = await self._readable(request.billing_project, principal)
        return pb.GetBillingProjectResponse(billing_project=project_proto(project))

    async def ListBillingProjects(self, request: pb.ListBillingProjectsRequest, context: grpc.aio.ServicerContext
                                  ) -> pb.ListBillingProjectsResponse:
        principal = current_principal()
        limit, violations = _page_size(request.page_size)
        states = _LIST_STATES.get(request.state)
        if states is None:
            violations.append(FieldViolation("state", "unknown state"))
        after = page_tokens.decode(request.page_token) if request.page_token else ""
        if after is None:
            violations.append(FieldViolation("page_token", "not a token this service returned"))
        _raise_if(violations)
        assert states is not None and after is not None
        projects = await self.store.list_projects(
            states, request.member or None, None if sees_every_project(principal) else principal.name, after, limit)
        return pb.ListBillingProjectsResponse(
            billing_projects=[project_proto(p) for p in projects],
            next_page_token=page_tokens.encode(projects[-1].name) if len(projects) == limit else "")

    async def AddMember(self, request: pb.AddMemberRequest, context: grpc.aio.ServicerContext
                        ) -> pb.AddMemberResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project) + _username(request.username, "username"))
        project = await self._change(request.billing_project, principal,
                                     lambda: self.store.add_member(request.billing_project, request.username))
        return pb.AddMemberResponse(billing_project=project_proto(project))

    async def RemoveMember(self, request: pb.RemoveMemberRequest, context: grpc.aio.ServicerContext
                           ) -> pb.RemoveMemberResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project) + _username(request.username, "username"))
        project = await self._change(request.billing_project, principal,
                                     lambda: self.store.remove_member(request.billing_project, request.username),
                                     allowed=lambda _: request.username == principal.name)
        return pb.RemoveMemberResponse(billing_project=project_proto(project))

    async def SetLimit(self, request: pb.SetLimitRequest, context: grpc.aio.ServicerContext) -> pb.SetLimitResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project) + _limit(request) + _max_job_duration(request))
        duration_ms = round(request.max_job_duration.ToTimedelta().total_seconds() * 1000) \
            if request.HasField("max_job_duration") else None
        project = await self._change(request.billing_project, principal, lambda: self.store.set_limit(
            request.billing_project, _limit_usd(request), duration_ms))
        return pb.SetLimitResponse(billing_project=project_proto(project))

    async def SetQuota(self, request: pb.SetQuotaRequest, context: grpc.aio.ServicerContext) -> pb.SetQuotaResponse:
        principal = current_principal()
        principal.require_admin()
        quota, violations = _quota(request)
        _raise_if(violations)
        return pb.SetQuotaResponse(quota=quota_proto(await self.quotas.set_quota(quota, principal.name)))

    async def ListQuotas(self, request: pb.ListQuotasRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListQuotasResponse:
        principal = current_principal()
        limit, violations = _page_size(request.page_size)
        kinds = KINDS if request.kind == quota_pb2.QUOTA_KIND_UNSPECIFIED else \
            tuple(k for k in (_QUOTA_KINDS.get(request.kind),) if k)
        if not kinds:
            violations.append(FieldViolation("kind", "unknown kind"))
        after = None
        if request.page_token:
            kind, _, name = (page_tokens.decode(request.page_token) or "").partition(":")
            if kind not in KINDS or not name:
                violations.append(FieldViolation("page_token", "not a token this service returned"))
            after = (kind, name)
        _raise_if(violations)
        rows = await self.quotas.list_quotas(kinds, None if sees_every_project(principal) else principal.name,
                                             after, limit)
        return pb.ListQuotasResponse(
            quotas=[quota_proto(r) for r in rows],
            next_page_token=page_tokens.encode(f"{rows[-1].kind}:{rows[-1].name}") if len(rows) == limit else "")

    async def CloseBillingProject(self, request: pb.CloseBillingProjectRequest, context: grpc.aio.ServicerContext
                                  ) -> pb.CloseBillingProjectResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project))
        project = await self._change(request.billing_project, principal,
                                     lambda: self.store.set_open(request.billing_project, False))
        return pb.CloseBillingProjectResponse(billing_project=project_proto(project))

    async def ReopenBillingProject(self, request: pb.ReopenBillingProjectRequest, context: grpc.aio.ServicerContext
                                   ) -> pb.ReopenBillingProjectResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project))
        project = await self._change(request.billing_project, principal,
                                     lambda: self.store.set_open(request.billing_project, True))
        return pb.ReopenBillingProjectResponse(billing_project=project_proto(project))

    async def DeleteBillingProject(self, request: pb.DeleteBillingProjectRequest, context: grpc.aio.ServicerContext
                                   ) -> pb.DeleteBillingProjectResponse:
        principal = current_principal()
        _raise_if(_reference(request.billing_project))
        await self._change(request.billing_project, principal,
                           lambda: self.store.delete_project(request.billing_project))
        return pb.DeleteBillingProjectResponse()

    async def GetSpend(self, request: pb.GetSpendRequest, context: grpc.aio.ServicerContext) -> pb.GetSpendResponse:
        principal = current_principal()
        violations = _reference(request.billing_project)
        first_day, bad_first = _day(request.first_day, "first_day")
        last_day, bad_last = _day(request.last_day, "last_day")
        violations += bad_first + bad_last
        if first_day and last_day and first_day > last_day:
            violations.append(FieldViolation("first_day", "after last_day"))
        limit, bad_size = _page_size(request.page_size)
        violations += bad_size
        breakdown = _BREAKDOWNS.get(request.breakdown)
        if breakdown is None and request.breakdown != spend_pb2.SPEND_BREAKDOWN_UNSPECIFIED:
            violations.append(FieldViolation("breakdown", "unknown breakdown"))
        if breakdown == "batch":
            # A batch's cost is kept for its whole life, not by day.
            violations += [FieldViolation(f, "must be empty with SPEND_BREAKDOWN_BATCH: batch costs are not kept "
                                             "by day") for f in ("first_day", "last_day") if getattr(request, f)]
        after = self._spend_after(breakdown, request.page_token, violations)
        _raise_if(violations)
        project = await self._readable(request.billing_project, principal)
        name = project.name
        today = datetime.datetime.fromtimestamp(self.store.clock_ms() / 1000, tz=datetime.timezone.utc).date()
        last_day = last_day or today
        lines: list[spend_pb2.SpendLine] = []
        keys: list[str] = []
        if breakdown == "batch":
            total_usd = project.spend_usd
            for batch_id, cost in await self.store.spend_lines_by_batch(name, int(after or 0), limit):
                lines.append(spend_pb2.SpendLine(batch_id=batch_id, cost_micro_usd=micro_from_usd(cost)))
                keys.append(str(batch_id))
        else:
            total_usd = await self.store.spend_by_date(name, first_day, last_day)
            if breakdown == "day":
                after_day = datetime.date.fromisoformat(after) if after else None
                for day, cost in await self.store.spend_lines_by_day(name, first_day, last_day, after_day, limit):
                    lines.append(spend_pb2.SpendLine(day=day.isoformat(), cost_micro_usd=micro_from_usd(cost)))
                    keys.append(day.isoformat())
            elif breakdown == "user":
                for user, cost in await self.store.spend_lines_by_user(name, first_day, last_day, after or "", limit):
                    lines.append(spend_pb2.SpendLine(username=user, cost_micro_usd=micro_from_usd(cost)))
                    keys.append(user)
        next_token = page_tokens.encode(f"{breakdown}:{keys[-1]}") if breakdown and len(keys) == limit else ""
        reservations = [spend_pb2.Reservation(batch_id=r["batch_id"], reserved_micro_usd=int(r["reserved_micro_usd"]),
                                              since=_timestamp(r["since_ms"]), n_attempts=r["n_attempts"])
                        for r in await self.store.reservations(name, MAX_RESERVATIONS)]
        return pb.GetSpendResponse(total_micro_usd=micro_from_usd(total_usd), lines=lines, next_page_token=next_token,
                                   reservations=reservations)

    @staticmethod
    def _spend_after(breakdown: str | None, token: str, violations: list[FieldViolation]) -> str | None:
        """The last key of the previous page; a token of another breakdown is refused."""
        if not token or breakdown is None:
            return None
        decoded = page_tokens.decode(token) or ""
        kind, _, key = decoded.partition(":")
        valid = kind == breakdown and bool(key) and (
            (kind == "batch" and key.isdigit()) or (kind == "day" and _day(key, "")[0] is not None)
            or kind == "user")
        if not valid:
            violations.append(FieldViolation("page_token", "not a token this service returned for this breakdown"))
            return None
        return key

    async def WatchSpend(self, request: pb.WatchSpendRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[pb.WatchSpendResponse]:
        principal = current_principal()
        _raise_if(_reference(request.billing_project))
        interval_s = DEFAULT_WATCH_INTERVAL_S
        if request.HasField("min_interval"):
            interval_s = min(max(request.min_interval.ToNanoseconds() / 1e9, MIN_WATCH_INTERVAL_S),
                             MAX_WATCH_INTERVAL_S)
        name = request.billing_project
        project = await self._readable(name, principal)
        tracker = BatchCostTracker()
        sent: tuple[int, int | None] | None = None
        self.active_watches += 1
        try:
            while True:
                at_ms = self.store.clock_ms()
                spend = micro_from_usd(project.spend_usd)
                limit = None if project.limit_usd is None else micro_from_usd(project.limit_usd)
                if (spend, limit) != sent:
                    grown: list[tuple[int, int]] = []
                    if sent is None or spend != sent[0]:
                        # Read the highest id before the costs: see BatchCostTracker.
                        max_batch_id = await self.store.max_batch_id()
                        costs = await self.store.batch_costs(name, tracker.tracked(), tracker.after_id)
                        grown = tracker.sample(costs, max_batch_id)
                    yield pb.WatchSpendResponse(update=spend_pb2.SpendUpdate(
                        billing_project=name, at=_timestamp(at_ms), spend_micro_usd=spend,
                        delta_micro_usd=0 if sent is None else spend - sent[0], reserved_micro_usd=0,
                        limit_micro_usd=limit,
                        batch_deltas=[spend_pb2.SpendLine(batch_id=b, cost_micro_usd=d)
                                      for b, d in grown[:MAX_BATCH_DELTAS]]))
                    sent = (spend, limit)
                await self._sleep(interval_s)
                # Membership is re-checked at every poll: a removed member's stream ends (NOT_FOUND).
                project = await self._readable(name, principal)
        finally:
            self.active_watches -= 1
