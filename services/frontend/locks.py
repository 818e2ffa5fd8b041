"""LockService: the lock monitor (ListLocks, `corral locks`), like Ganeti's.

One LockStatus per lock (billing project, level, name) that a running or
starting job holds or a Ready job the scheduler may start needs; its
holders with the mode and their attempt's start; its waiters as
`services.policy.lock_monitor` decides them (the scheduler's conflict rule
and order), the first MAX_WAITERS with n_waiters counting all.

Who sees what: a project's locks are read by whoever may read the project
(`billing_store.may_read`: members, administrators, developers). Asking
for a project one may not read is NOT_FOUND "no billing project X", the
answer for a project that does not exist; without a project, a caller sees
the projects they are a member of (administrators and developers: all).
Checks, in this order: the fields' limits (services.frontend.field_limits),
then page_size, page_token and name without level (INVALID_ARGUMENT, all at
once), then the project (NOT_FOUND). A page whose reads would pass their
caps (services.frontend.lock_store) is RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import base64
import json

import grpc

from corral.batch.v1 import job_pb2, job_spec_pb2, lock_pb2, lock_service_pb2_grpc
from corral.batch.v1 import lock_service_pb2 as pb
from services.common.errors import FieldViolation, InvalidRequest, NotFound, ResourceExhausted
from services.common.identity import current_principal
from services.frontend.billing_store import BillingStore, may_read, sees_every_project
from services.frontend.job_protos import timestamp
from services.frontend.lock_store import LockKey, LockStore, TooManyLocks, rows_of
from services.policy.lock_contention import LockMode
from services.policy.lock_monitor import order_waiters, waiting_modes

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
"""Locks per page: each carries up to 100 waiters, so a full page stays well under a message's 4 MiB."""


def encode_page_token(key: LockKey) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key), ensure_ascii=False).encode()).decode()


def decode_page_token(token: str) -> LockKey | None:
    """The last lock of the previous page; None if the token is not one this service returned."""
    try:
        key = json.loads(base64.urlsafe_b64decode(token.encode()).decode())
    except (ValueError, UnicodeDecodeError):
        return None
    if not (isinstance(key, list) and len(key) == 3 and all(isinstance(k, str) for k in key)):
        return None
    return key[0], key[1], key[2]


def _mode(mode: LockMode) -> int:
    return job_spec_pb2.LockMode.Value(f"LOCK_MODE_{mode.name}")


def _ref(key: tuple[int, int]) -> job_pb2.JobRef:
    return job_pb2.JobRef(batch_id=key[0], job_id=key[1])


class LockServicer(lock_service_pb2_grpc.LockServiceServicer):
    """See the module docstring."""

    def __init__(self, locks: LockStore, projects: BillingStore):
        self.locks = locks
        self.projects = projects

    async def ListLocks(self, request: pb.ListLocksRequest, context: grpc.aio.ServicerContext
                        ) -> pb.ListLocksResponse:
        principal = current_principal()
        violations = []
        if request.page_size < 0:
            violations.append(FieldViolation("page_size", "must not be negative"))
        limit = min(request.page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)  # more than the cap is the cap
        after = decode_page_token(request.page_token) if request.page_token else None
        if request.page_token and after is None:
            violations.append(FieldViolation("page_token", "not a token this service returned"))
        if request.name and not request.level:
            violations.append(FieldViolation("name", "a lock name is looked up within its level: give level too"))
        if violations:
            raise InvalidRequest(violations)
        project = request.billing_project or None
        if project is not None:
            row = await self.projects.get_project(project)
            if row is None or not may_read(principal, row):
                raise NotFound(f"no billing project {project}")
        member = None if project is not None or sees_every_project(principal) else principal.name
        try:
            keys = await self.locks.page(project=project, member=member, level=request.level, name=request.name,
                                         after=after, limit=limit)
            statuses = await self._statuses(keys)
        except TooManyLocks as e:
            raise ResourceExhausted(f"{e}: ask for one billing project and level") from None
        return pb.ListLocksResponse(locks=statuses,
                                    next_page_token=encode_page_token(keys[-1]) if len(keys) == limit else "")

    async def _statuses(self, keys: list[LockKey]) -> list[lock_pb2.LockStatus]:
        if not keys:
            return []
        holders = await self.locks.holders([k[0] for k in keys])
        wanted = await self.locks.wanted(keys)
        modes = {key: waiting_modes(holders[key[0]].index, key[1], key[2]) for key in keys}
        heads = await self.locks.waiting(modes)
        now_s = self.locks.now_s()
        statuses = []
        for key in keys:
            project, level, name = key
            held = holders[project]
            waiters = order_waiters(heads.get(key, ()), held.index, level, name, now_s)
            statuses.append(lock_pb2.LockStatus(
                billing_project=project, level=level, name=name,
                holders=[lock_pb2.LockHolder(job=_ref(h.key), mode=_mode(h.mode), since=timestamp(h.since_ms))
                         for h in rows_of(held, key)],
                waiters=[lock_pb2.LockWaiter(job=_ref(w.key), mode=_mode(w.mode),
                                             since=timestamp(round(w.created_s * 1000)),
                                             priority_weight=w.weight, blocked_by=[_ref(b) for b in w.blocked_by],
                                             priority=w.priority) for w in waiters],
                n_waiters=sum(wanted.get((key, m), 0) for m in modes[key])))
        return statuses
