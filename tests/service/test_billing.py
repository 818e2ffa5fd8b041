"""BillingService over real gRPC, served the way the frontend serves it:
TLS for people, bearer tokens verified by the auth service over mutual TLS.

Spend is produced by the real procedures (`JobStore`) against the same
database and compared with a ledger computed here from the documented
prices, independently of the SQL.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from hypothesis import given
from hypothesis import strategies as st

from corral.aio import Client
from corral.billing.v1 import billing_project_pb2 as project_pb
from corral.billing.v1 import billing_service_pb2 as pb
from corral.billing.v1 import billing_service_pb2_grpc, quota_pb2, spend_pb2
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, FailedPreconditionError
from services.db.store import JobStore
from services.frontend.billing_store import MAX_MICRO_USD, micro_from_usd, usd_from_micro
from tests.world import FakeClock, World
from tests.service.conftest import FrontendServer, UserToken, bearer, person_channel

OPEN, CLOSED, DELETED = (project_pb.BILLING_PROJECT_STATE_OPEN, project_pb.BILLING_PROJECT_STATE_CLOSED,
                         project_pb.BILLING_PROJECT_STATE_DELETED)
TIMEOUT_S = 10.0
MIN_MS = 60_000
# The first UTC midnight after FakeClock's start: 2023-11-15T00:00:00Z.
MIDNIGHT_MS = 1_700_006_400_000
DAY_1, DAY_2 = "2023-11-14", "2023-11-15"
# The local prices that sql/migrations/0002_local_defaults.sql means to set, per
# unit-millisecond. Its SQL computes them with DECIMAL division (scale 2 + 4 =
# 6 digits), which stores 0.0 for all three, so the tests set them themselves.
CPU_USD_PER_MCPU_MS = 0.04 / (1000 * 3600000)
MEMORY_USD_PER_MIB_MS = 0.005 / (1024 * 3600000)


@pytest.fixture
async def stub(frontend_billing: FrontendServer, certs: DevCertificateAuthority):
    async with person_channel(certs.issue("someone"), frontend_billing.port) as channel:
        yield billing_service_pb2_grpc.BillingServiceStub(channel)


async def refused(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    """The error a unary call (or a stream's first read) ends with."""
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await asyncio.wait_for(call, TIMEOUT_S)
    return error.value


def violated_fields(error: grpc.aio.AioRpcError) -> list[str]:
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    status = rpc_status.from_call(error)
    assert status is not None
    bad_request = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(bad_request)
    return sorted(v.field for v in bad_request.field_violations)


async def billing_rows(db: Database) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Everything the billing RPCs may write."""
    projects = await db.fetchall("SELECT name, state, limit_usd, time_created_ms FROM billing_projects ORDER BY name")
    members = await db.fetchall("SELECT billing_project, user FROM billing_project_members "
                                "ORDER BY billing_project, user")
    return projects, members


async def eventually(predicate: Callable[[], Awaitable[bool] | bool], timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def every_rpc(stub: billing_service_pb2_grpc.BillingServiceStub, project: str, metadata: tuple,
              username: str = "mallory") -> dict[str, Callable[[], Awaitable[Any]]]:
    """By RPC name, a call on `project` not yet made (WatchSpend: its first message)."""
    return {
        "CreateBillingProject": lambda: stub.CreateBillingProject(
            pb.CreateBillingProjectRequest(name="new-project", members=[username]), metadata=metadata),
        "GetBillingProject": lambda: stub.GetBillingProject(
            pb.GetBillingProjectRequest(billing_project=project), metadata=metadata),
        "ListBillingProjects": lambda: stub.ListBillingProjects(pb.ListBillingProjectsRequest(), metadata=metadata),
        "AddMember": lambda: stub.AddMember(
            pb.AddMemberRequest(billing_project=project, username=username), metadata=metadata),
        "RemoveMember": lambda: stub.RemoveMember(
            pb.RemoveMemberRequest(billing_project=project, username="alice"), metadata=metadata),
        "SetLimit": lambda: stub.SetLimit(
            pb.SetLimitRequest(billing_project=project, limit_micro_usd=1), metadata=metadata),
        "CloseBillingProject": lambda: stub.CloseBillingProject(
            pb.CloseBillingProjectRequest(billing_project=project), metadata=metadata),
        "ReopenBillingProject": lambda: stub.ReopenBillingProject(
            pb.ReopenBillingProjectRequest(billing_project=project), metadata=metadata),
        "DeleteBillingProject": lambda: stub.DeleteBillingProject(
            pb.DeleteBillingProjectRequest(billing_project=project), metadata=metadata),
        "GetSpend": lambda: stub.GetSpend(pb.GetSpendRequest(billing_project=project), metadata=metadata),
        "WatchSpend": lambda: stub.WatchSpend(
            pb.WatchSpendRequest(billing_project=project), metadata=metadata).read(),
        "SetQuota": lambda: stub.SetQuota(
            pb.SetQuotaRequest(kind=quota_pb2.QUOTA_KIND_PROJECT, name=project, weight=2), metadata=metadata),
        "ListQuotas": lambda: stub.ListQuotas(pb.ListQuotasRequest(), metadata=metadata),
    }


async def create(stub, token: str, name: str = "lab", members: tuple[str, ...] = ("alice",),
                 limit_micro_usd: int | None = None) -> project_pb.BillingProject:
    response = await stub.CreateBillingProject(
        pb.CreateBillingProjectRequest(name=name, members=members, limit_micro_usd=limit_micro_usd),
        metadata=bearer(token))
    return response.billing_project


async def project_world(db: Database, clock: FakeClock) -> World:
    """The procedures' side: prices, a leader epoch and one active 16-core instance."""
    for name, rate_usd in (("cpu/local/1", CPU_USD_PER_MCPU_MS), ("memory/local/1", MEMORY_USD_PER_MIB_MS)):
        await db.execute("UPDATE resources SET rate_usd = %s WHERE name = %s", (rate_usd, name))
    world = World(db, JobStore(db, clock), clock)
    world.epoch = await world.store.elect_leader("driver-0")
    await world.instance("i1", cores_mcpu=16_000)
    return world


# -- lifecycle ----------------------------------------------------------------


async def test_create_get_list_members_limit_close_reopen_delete(
        stub, frontend_billing: FrontendServer, admin_token: str, user_token: UserToken) -> None:
    alice = await user_token("alice")
    await user_token("bob")
    root = bearer(admin_token)
    created = await create(stub, admin_token, members=("alice",), limit_micro_usd=5_000_000)
    assert (created.name, created.state, list(created.members)) == ("lab", OPEN, ["alice", "root"])
    assert created.limit_micro_usd == 5_000_000 and created.spend_micro_usd == 0 and created.created_at.seconds > 0
    assert not created.HasField("closed_at")

    got = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="lab"), metadata=bearer(alice))
    assert got.billing_project == created
    listed = await stub.ListBillingProjects(pb.ListBillingProjectsRequest(), metadata=bearer(alice))
    assert [p.name for p in listed.billing_projects] == ["lab"] and listed.next_page_token == ""

    for _ in range(2):  # adding and removing again change nothing
        added = await stub.AddMember(pb.AddMemberRequest(billing_project="lab", username="bob"), metadata=root)
        assert list(added.billing_project.members) == ["alice", "bob", "root"]
    for _ in range(2):
        removed = await stub.RemoveMember(pb.RemoveMemberRequest(billing_project="lab", username="bob"), metadata=root)
        assert list(removed.billing_project.members) == ["alice", "root"]

    limited = await stub.SetLimit(pb.SetLimitRequest(billing_project="lab", limit_micro_usd=1_234_567), metadata=root)
    assert limited.billing_project.limit_micro_usd == 1_234_567
    row = await frontend_billing.db.fetchone("SELECT limit_usd FROM billing_projects WHERE name = 'lab'")
    assert row is not None and row["limit_usd"] == 1.234567
    assert limited.billing_project.max_job_duration.ToSeconds() == 3600  # the default
    # The timeout of its jobs that set none (their worst case is reserved for it), kept when not sent.
    longer = await stub.SetLimit(pb.SetLimitRequest(billing_project="lab", limit_micro_usd=2_000_000,
                                                    max_job_duration=duration_pb2.Duration(seconds=7200)), metadata=root)
    assert longer.billing_project.max_job_duration.ToSeconds() == 7200
    for seconds in (0, 7 * 24 * 3600 + 1):
        error = await refused(stub.SetLimit(pb.SetLimitRequest(
            billing_project="lab", limit_micro_usd=1, max_job_duration=duration_pb2.Duration(seconds=seconds)),
            metadata=root))
        assert violated_fields(error) == ["max_job_duration"]
    unlimited = await stub.SetLimit(pb.SetLimitRequest(billing_project="lab"), metadata=root)
    assert not unlimited.billing_project.HasField("limit_micro_usd")
    assert unlimited.billing_project.max_job_duration.ToSeconds() == 7200
    row = await frontend_billing.db.fetchone("SELECT limit_usd, max_job_duration_ms FROM billing_projects "
                                             "WHERE name = 'lab'")
    assert row == {"limit_usd": None, "max_job_duration_ms": 7_200_000}

    error = await refused(stub.DeleteBillingProject(pb.DeleteBillingProjectRequest(billing_project="lab"),
                                                    metadata=root))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "close it" in (error.details() or "")

    # Closed: no new batches, and closing again changes nothing; reopened: batches again.
    jobs = JobStore(frontend_billing.db, FakeClock())
    for _ in range(2):
        closed = await stub.CloseBillingProject(pb.CloseBillingProjectRequest(billing_project="lab"), metadata=root)
        assert closed.billing_project.state == CLOSED
    with pytest.raises(FailedPreconditionError):
        await jobs.create_batch("alice", "lab")
    reopened = await stub.ReopenBillingProject(pb.ReopenBillingProjectRequest(billing_project="lab"), metadata=root)
    assert reopened.billing_project.state == OPEN
    batch_id = int((await jobs.create_batch("alice", "lab"))["batch_id"])
    update = await jobs.create_update(batch_id, 1)
    await jobs.insert_jobs(batch_id, update["update_id"],
                           [{"job_id": 1, "cores_mcpu": 1000, "inst_coll": "standard", "job_group_id": 0}])
    await jobs.commit_update(batch_id, update["update_id"])

    # A closed project with a running batch is not deleted; the batch goes on.
    await stub.CloseBillingProject(pb.CloseBillingProjectRequest(billing_project="lab"), metadata=root)
    error = await refused(stub.DeleteBillingProject(pb.DeleteBillingProjectRequest(billing_project="lab"),
                                                    metadata=root))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and str(batch_id) in (error.details() or "")

    epoch = await jobs.elect_leader("driver-0")
    await jobs.cancel_job_group(batch_id, 0, "alice", "done with it")
    assert await jobs.cancel_ready_jobs(epoch, batch_id, 10) == 1
    for _ in range(2):
        await stub.DeleteBillingProject(pb.DeleteBillingProjectRequest(billing_project="lab"), metadata=root)

    # Deleted: still readable by its members, hidden from lists unless asked for, read-only, name kept.
    got = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="lab"), metadata=bearer(alice))
    assert got.billing_project.state == DELETED
    for token in (alice, admin_token):
        listed = await stub.ListBillingProjects(pb.ListBillingProjectsRequest(), metadata=bearer(token))
        assert [p.name for p in listed.billing_projects] == []
    listed = await stub.ListBillingProjects(pb.ListBillingProjectsRequest(state=DELETED), metadata=bearer(alice))
    assert [p.name for p in listed.billing_projects] == ["lab"]
    for call in [stub.ReopenBillingProject(pb.ReopenBillingProjectRequest(billing_project="lab"), metadata=root),
                 stub.CloseBillingProject(pb.CloseBillingProjectRequest(billing_project="lab"), metadata=root),
                 stub.AddMember(pb.AddMemberRequest(billing_project="lab", username="bob"), metadata=root),
                 stub.SetLimit(pb.SetLimitRequest(billing_project="lab", limit_micro_usd=1), metadata=root)]:
        assert (await refused(call)).code() == grpc.StatusCode.FAILED_PRECONDITION
    error = await refused(stub.CreateBillingProject(pb.CreateBillingProjectRequest(name="lab"), metadata=root))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    spend = await stub.GetSpend(pb.GetSpendRequest(billing_project="lab"), metadata=bearer(alice))
    assert spend.total_micro_usd == 0


async def test_list_filters_and_pages(stub, admin_token: str, user_token: UserToken) -> None:
    alice = await user_token("alice")
    await user_token("bob")
    for name, members in [("a-lab", ("alice",)), ("b-lab", ("bob",)), ("c-lab", ("alice", "bob")), ("d-lab", ())]:
        await create(stub, admin_token, name, members)
    root = bearer(admin_token)

    async def names(request: pb.ListBillingProjectsRequest, token: tuple) -> list[str]:
        pages, found = 0, []
        while True:
            page = await stub.ListBillingProjects(request, metadata=token)
            found += [p.name for p in page.billing_projects]
            pages += 1
            if not page.next_page_token:
                return found
            assert pages < 10
            request.page_token = page.next_page_token

    assert await names(pb.ListBillingProjectsRequest(page_size=1), root) == ["a-lab", "b-lab", "c-lab", "d-lab"]
    assert await names(pb.ListBillingProjectsRequest(member="bob"), root) == ["b-lab", "c-lab"]
    assert await names(pb.ListBillingProjectsRequest(page_size=1), bearer(alice)) == ["a-lab", "c-lab"]
    assert await names(pb.ListBillingProjectsRequest(member="bob"), bearer(alice)) == ["c-lab"]
    await stub.CloseBillingProject(pb.CloseBillingProjectRequest(billing_project="c-lab"), metadata=root)
    assert await names(pb.ListBillingProjectsRequest(state=OPEN), bearer(alice)) == ["a-lab"]
    assert await names(pb.ListBillingProjectsRequest(state=CLOSED), bearer(alice)) == ["c-lab"]


# -- who may do what ----------------------------------------------------------


async def test_non_members_are_refused_and_members_may_not_manage(
        stub, frontend_billing: FrontendServer, admin_token: str, user_token: UserToken) -> None:
    alice, carol = await user_token("alice"), await user_token("carol")
    dave = await user_token("dave", roles=("user", "developer"))
    await create(stub, admin_token, "lab", ("alice",))
    before = await billing_rows(frontend_billing.db)

    # A non-member is told what a project that does not exist gets: she learns no names.
    for project, code, details in (
            ("lab", grpc.StatusCode.NOT_FOUND, "no billing project lab"),
            ("no-such-project", grpc.StatusCode.NOT_FOUND, "no billing project no-such-project")):
        calls = every_rpc(stub, project, bearer(carol), username="carol")
        # Those: elsewhere (the quotas' in tests/service/test_quotas.py: administrators only, or a list).
        for rpc in calls.keys() - {"CreateBillingProject", "ListBillingProjects", "SetQuota", "ListQuotas"}:
            error = await refused(calls[rpc]())
            assert (error.code(), error.details()) == (code, details), rpc
    for request in (pb.ListBillingProjectsRequest(), pb.ListBillingProjectsRequest(member="alice")):
        listed = await stub.ListBillingProjects(request, metadata=bearer(carol))
        assert list(listed.billing_projects) == []

    # Members and developers see it but may not manage it.
    for token in (alice, dave):
        got = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="lab"), metadata=bearer(token))
        assert got.billing_project.name == "lab"
        await stub.GetSpend(pb.GetSpendRequest(billing_project="lab"), metadata=bearer(token))
        for call in [
            stub.AddMember(pb.AddMemberRequest(billing_project="lab", username="carol"), metadata=bearer(token)),
            stub.RemoveMember(pb.RemoveMemberRequest(billing_project="lab", username="root"), metadata=bearer(token)),
            stub.SetLimit(pb.SetLimitRequest(billing_project="lab", limit_micro_usd=1), metadata=bearer(token)),
            stub.CloseBillingProject(pb.CloseBillingProjectRequest(billing_project="lab"), metadata=bearer(token)),
            stub.ReopenBillingProject(pb.ReopenBillingProjectRequest(billing_project="lab"), metadata=bearer(token)),
            stub.DeleteBillingProject(pb.DeleteBillingProjectRequest(billing_project="lab"), metadata=bearer(token)),
        ]:
            assert (await refused(call)).code() == grpc.StatusCode.PERMISSION_DENIED
    listed = await stub.ListBillingProjects(pb.ListBillingProjectsRequest(), metadata=bearer(dave))
    assert [p.name for p in listed.billing_projects] == ["lab"]
    assert await billing_rows(frontend_billing.db) == before

    # A member may leave; then the project is closed to them.
    left = await stub.RemoveMember(pb.RemoveMemberRequest(billing_project="lab", username="alice"),
                                   metadata=bearer(alice))
    assert list(left.billing_project.members) == ["root"]
    error = await refused(stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="lab"),
                                                 metadata=bearer(alice)))
    assert error.code() == grpc.StatusCode.NOT_FOUND


async def test_only_admins_create_and_nothing_is_written(
        stub, frontend_billing: FrontendServer, admin_token: str, user_token: UserToken) -> None:
    alice = await user_token("alice")
    dave = await user_token("dave", roles=("user", "developer"))
    before = await billing_rows(frontend_billing.db)
    for token in (alice, dave):
        error = await refused(stub.CreateBillingProject(
            pb.CreateBillingProjectRequest(name="mine", members=["alice"]), metadata=bearer(token)))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await billing_rows(frontend_billing.db) == before == ([], [])



async def test_a_member_who_is_not_a_user_is_not_found_and_nothing_is_written(
        stub, frontend_billing: FrontendServer, admin_token: str, user_token: UserToken) -> None:
    """Issue 12: a member list names only users."""
    await user_token("alice")
    root = bearer(admin_token)
    await create(stub, admin_token, "lab", ("alice",))
    before = await billing_rows(frontend_billing.db)
    for call in (stub.AddMember(pb.AddMemberRequest(billing_project="lab", username="nobody"), metadata=root),
                 stub.CreateBillingProject(pb.CreateBillingProjectRequest(name="other", members=["alice", "nobody"]),
                                           metadata=root)):
        error = await refused(call)
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, "no user nobody")
    assert await billing_rows(frontend_billing.db) == before
    got = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="lab"), metadata=root)
    assert list(got.billing_project.members) == ["alice", "root"]
    # Once the user exists, adding them works.
    await user_token("nobody")
    added = await stub.AddMember(pb.AddMemberRequest(billing_project="lab", username="nobody"), metadata=root)
    assert list(added.billing_project.members) == ["alice", "nobody", "root"]

@pytest.mark.parametrize("credentials", ["anonymous", "garbage"])
async def test_every_rpc_refuses_bad_credentials(stub, frontend_billing: FrontendServer, admin_token: str,
                                                 credentials: str) -> None:
    await create(stub, admin_token, "lab", ("root",))
    before = await billing_rows(frontend_billing.db)
    metadata = () if credentials == "anonymous" else bearer("0123456789abcdef.not-a-real-token")
    calls = every_rpc(stub, "lab", metadata)
    assert calls.keys() == {m.name for m in pb.DESCRIPTOR.services_by_name["BillingService"].methods}
    for rpc, call in calls.items():
        assert (await refused(call())).code() == grpc.StatusCode.UNAUTHENTICATED, rpc
    assert await billing_rows(frontend_billing.db) == before


async def test_bad_requests_are_invalid_argument_with_field_violations(
        stub, frontend_billing: FrontendServer, admin_token: str) -> None:
    root = bearer(admin_token)
    await create(stub, admin_token, "lab", ())
    before = await billing_rows(frontend_billing.db)
    cases: list[tuple[Awaitable[Any], list[str]]] = [
        (stub.CreateBillingProject(pb.CreateBillingProjectRequest(
            name="Bad Name!", limit_micro_usd=-1, members=["ok", "Not OK"]), metadata=root),
         ["limit_micro_usd", "members[1]", "name"]),
        (stub.CreateBillingProject(pb.CreateBillingProjectRequest(name="x" * 65), metadata=root), ["name"]),
        (stub.CreateBillingProject(pb.CreateBillingProjectRequest(name="-lab"), metadata=root), ["name"]),
        (stub.CreateBillingProject(pb.CreateBillingProjectRequest(name=""), metadata=root), ["name"]),
        (stub.CreateBillingProject(pb.CreateBillingProjectRequest(
            name="rich", limit_micro_usd=MAX_MICRO_USD + 1), metadata=root), ["limit_micro_usd"]),
        (stub.SetLimit(pb.SetLimitRequest(billing_project="lab", limit_micro_usd=-5), metadata=root),
         ["limit_micro_usd"]),
        (stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project=""), metadata=root), ["billing_project"]),
        (stub.AddMember(pb.AddMemberRequest(billing_project="lab", username=""), metadata=root), ["username"]),
        (stub.ListBillingProjects(pb.ListBillingProjectsRequest(page_size=-1, page_token="__4="), metadata=root),
         ["page_size", "page_token"]),
        (stub.GetSpend(pb.GetSpendRequest(billing_project="lab", first_day="2023-13-01", last_day="yesterday"),
                       metadata=root), ["first_day", "last_day"]),
        (stub.GetSpend(pb.GetSpendRequest(billing_project="lab", first_day=DAY_2, last_day=DAY_1), metadata=root),
         ["first_day"]),
        (stub.GetSpend(pb.GetSpendRequest(billing_project="lab", first_day=DAY_1,
                                          breakdown=spend_pb2.SPEND_BREAKDOWN_BATCH), metadata=root), ["first_day"]),
        (stub.GetSpend(pb.GetSpendRequest(billing_project="lab", breakdown=9), metadata=root), ["breakdown"]),
        (stub.GetSpend(pb.GetSpendRequest(billing_project="lab", breakdown=spend_pb2.SPEND_BREAKDOWN_DAY,
                                          page_token="dXNlcjphbGljZQ=="), metadata=root), ["page_token"]),
        (stub.WatchSpend(pb.WatchSpendRequest(billing_project=""), metadata=root).read(), ["billing_project"]),
    ]
    for call, fields in cases:
        assert violated_fields(await refused(call)) == fields
    assert await billing_rows(frontend_billing.db) == before


@given(st.integers(min_value=0, max_value=MAX_MICRO_USD))
def test_limits_survive_the_double_column(micro_usd: int) -> None:
    assert micro_from_usd(usd_from_micro(micro_usd)) == micro_usd


# -- spend --------------------------------------------------------------------


def at(minutes: float) -> int:
    """Milliseconds since the epoch, `minutes` from the midnight between DAY_1 and DAY_2."""
    return MIDNIGHT_MS + int(minutes * MIN_MS)


async def start_jobs(world: World, jobs: list[tuple[int, int, str, int, int]]) -> dict[tuple[int, int], str]:
    """SJ, MJS and resources for (batch, job, user, cpu mcpu, memory MiB); the attempt of each (batch, job)."""
    attempts = {}
    for batch_id, job_id, _, cpu, memory in jobs:
        attempts[batch_id, job_id] = attempt = await world.run(batch_id, job_id)
        await world.store.add_attempt_resources(world.epoch, [
            {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "resource": name, "quantity": q}
            for name, q in (("cpu/local/1", cpu), ("memory/local/1", memory)) if q])
    return attempts


async def heartbeat(world: World, attempts: dict[tuple[int, int], str], rollup_ms: int) -> None:
    world.clock.now_ms = rollup_ms
    await world.store.heartbeat_rollup(world.epoch, "i1", [
        {"batch_id": b, "job_id": j, "attempt_id": a, "rollup_time_ms": rollup_ms} for (b, j), a in attempts.items()])


async def test_spend_equals_the_cost_of_the_procedures_by_day_user_and_batch(
        stub, db: Database, admin_token: str, user_token: UserToken) -> None:
    alice, bob = await user_token("alice"), await user_token("bob")
    await create(stub, admin_token, "proj", ("alice", "bob"))
    clock = FakeClock(at(-30))
    world = await project_world(db, clock)
    alice_batch, _, a1 = await world.batch([{}, {}], user="alice")
    bob_batch, _, b1 = await world.batch([{}], user="bob")
    jobs = [(alice_batch, a1, "alice", 1000, 1024), (alice_batch, a1 + 1, "alice", 2000, 0),
            (bob_batch, b1, "bob", 500, 0)]
    attempts = await start_jobs(world, jobs)

    # Rollups at -10 minutes (billed on DAY_1), +20 and +50 (DAY_2); the first job ends at +20.
    ledger: dict[tuple[str, str, int], float] = defaultdict(float)  # (day, user, batch) -> USD
    rolled_up_ms = {(b, j): at(-30) for b, j, *_ in jobs}
    for minutes, running in ((-10, jobs), (20, jobs), (50, jobs[1:])):
        await heartbeat(world, {(b, j): attempts[b, j] for b, j, *_ in running}, at(minutes))
        for batch_id, job_id, user, cpu, memory in running:
            elapsed_ms = at(minutes) - rolled_up_ms[batch_id, job_id]
            rolled_up_ms[batch_id, job_id] = at(minutes)
            day = DAY_1 if minutes < 0 else DAY_2
            ledger[day, user, batch_id] += elapsed_ms * (cpu * CPU_USD_PER_MCPU_MS + memory * MEMORY_USD_PER_MIB_MS)
        if minutes == 20:
            assert await world.finish(alice_batch, a1, attempts[alice_batch, a1], "Success") == "completed"
    for batch_id, job_id, *_ in jobs[1:]:
        assert await world.finish(batch_id, job_id, attempts[batch_id, job_id], "Success") == "completed"

    def expected(key: Callable[[tuple[str, str, int]], Any], days: tuple[str, ...] = (DAY_1, DAY_2)
                 ) -> dict[Any, int]:
        sums: dict[Any, float] = defaultdict(float)
        for k, usd in ledger.items():
            if k[0] in days:
                sums[key(k)] += usd
        return {k: micro_from_usd(v) for k, v in sums.items()}

    def near(got: dict[Any, int], want: dict[Any, int]) -> bool:
        """Equal to the micro-dollar: each line is rounded on its own."""
        return got.keys() == want.keys() and all(abs(got[k] - want[k]) <= 1 for k in want)

    total = micro_from_usd(sum(ledger.values()))
    assert total > 50_000  # some cents: the comparisons below mean something

    async def spend(token: str, **kwargs: Any) -> pb.GetSpendResponse:
        return await stub.GetSpend(pb.GetSpendRequest(billing_project="proj", **kwargs), metadata=bearer(token))

    for token in (alice, bob, admin_token):  # every member sees the whole project's spend
        response = await spend(token)
        assert abs(response.total_micro_usd - total) <= 1 and list(response.lines) == []
    got = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="proj"), metadata=bearer(alice))
    assert abs(got.billing_project.spend_micro_usd - total) <= 1

    by_day = await spend(alice, first_day=DAY_1, last_day=DAY_2, breakdown=spend_pb2.SPEND_BREAKDOWN_DAY)
    assert [line.day for line in by_day.lines] == [DAY_1, DAY_2] and abs(by_day.total_micro_usd - total) <= 1
    assert near({line.day: line.cost_micro_usd for line in by_day.lines}, expected(lambda k: k[0]))
    by_user = await spend(alice, breakdown=spend_pb2.SPEND_BREAKDOWN_USER)
    assert [line.username for line in by_user.lines] == ["alice", "bob"]
    assert near({line.username: line.cost_micro_usd for line in by_user.lines}, expected(lambda k: k[1]))
    by_batch = await spend(bob, breakdown=spend_pb2.SPEND_BREAKDOWN_BATCH)
    assert [line.batch_id for line in by_batch.lines] == sorted([alice_batch, bob_batch])
    assert near({line.batch_id: line.cost_micro_usd for line in by_batch.lines}, expected(lambda k: k[2]))
    assert abs(by_batch.total_micro_usd - total) <= 1
    day_2 = await spend(alice, first_day=DAY_2, breakdown=spend_pb2.SPEND_BREAKDOWN_USER)
    assert near({line.username: line.cost_micro_usd for line in day_2.lines}, expected(lambda k: k[1], (DAY_2,)))
    assert abs(day_2.total_micro_usd - expected(lambda k: k[0])[DAY_2]) <= 1
    later = await spend(alice, first_day="2023-11-16", last_day="2023-12-31", breakdown=spend_pb2.SPEND_BREAKDOWN_DAY)
    assert (later.total_micro_usd, list(later.lines)) == (0, [])

    # Lines come in pages; the token carries the last key.
    days, token = [], ""
    for _ in range(5):
        page = await spend(alice, breakdown=spend_pb2.SPEND_BREAKDOWN_DAY, page_size=1, page_token=token)
        days += [line.day for line in page.lines]
        token = page.next_page_token
        if not token:
            break
    assert days == [DAY_1, DAY_2] and not token


async def test_spend_lists_the_budget_each_batch_holds(
        stub, frontend_billing: FrontendServer, certs: DevCertificateAuthority, db: Database, admin_token: str,
        user_token: UserToken) -> None:
    """GetSpend lists, per batch, what its unfinished attempts reserved: schedule_jobs' reservations, summing to
    the project's reserved_micro_usd, given back as the attempts end."""
    alice, bob = await user_token("alice"), await user_token("bob")
    await create(stub, admin_token, "proj", ("alice", "bob"), limit_micro_usd=9_000_000)
    world = await project_world(db, FakeClock(at(0)))
    big, _, b1 = await world.batch([{"cores_mcpu": 4000}, {"cores_mcpu": 4000}], user="alice")
    small, _, s1 = await world.batch([{}], user="bob")
    attempts = {(big, b1): await world.run(big, b1), (small, s1): await world.run(small, s1)}
    world.clock.now_ms = at(5)
    attempts[big, b1 + 1] = await world.run(big, b1 + 1)

    async def held() -> dict[int, tuple[int, int, int]]:
        """What the database says each batch's open attempts reserve: (micro-USD, attempts, first start)."""
        rows = await db.fetchall(
            "SELECT batch_id, SUM(reserved_micro_usd) AS r, COUNT(*) AS n, MIN(start_time_ms) AS since "
            "FROM attempts WHERE end_time_ms IS NULL GROUP BY batch_id")
        return {int(r["batch_id"]): (int(r["r"]), int(r["n"]), int(r["since"])) for r in rows}

    async def listed(token: str) -> list[tuple[int, int, int, int]]:
        response = await stub.GetSpend(pb.GetSpendRequest(billing_project="proj"), metadata=bearer(token))
        return [(r.batch_id, r.reserved_micro_usd, r.n_attempts, r.since.ToMilliseconds())
                for r in response.reservations]

    expected = await held()
    assert expected[big][0] > expected[small][0] > 0  # the limit makes schedule_jobs reserve
    assert expected[big][2] == at(0)  # since its first attempt started
    for token in (alice, bob, admin_token):
        assert await listed(token) == [(b, *expected[b]) for b in (big, small)]  # the largest first
    async with Client(f"localhost:{frontend_billing.port}", bob, certs.ca_cert_path) as client:
        assert [(r.batch_id, r.reserved_micro_usd) for r in await client.reservations("proj")] == [
            (b, expected[b][0]) for b in (big, small)]
    project = await stub.GetBillingProject(pb.GetBillingProjectRequest(billing_project="proj"), metadata=bearer(bob))
    assert project.billing_project.reserved_micro_usd == expected[big][0] + expected[small][0]
    # Every page of every breakdown carries them.
    by_day = await stub.GetSpend(pb.GetSpendRequest(billing_project="proj", breakdown=spend_pb2.SPEND_BREAKDOWN_DAY),
                                 metadata=bearer(alice))
    assert [r.batch_id for r in by_day.reservations] == [big, small]

    # An attempt that ends gives its share back; a batch whose attempts all ended holds nothing.
    assert await world.finish(small, s1, attempts[small, s1], "Success") == "completed"
    assert await world.finish(big, b1, attempts[big, b1], "Success") == "completed"
    expected = await held()
    assert await listed(alice) == [(big, *expected[big])] and expected[big][1:] == (1, at(5))
    assert await world.finish(big, b1 + 1, attempts[big, b1 + 1], "Failed") == "completed"
    assert await listed(alice) == []


async def test_watch_spend_sends_the_current_spend_then_each_change(
        stub, frontend_billing: FrontendServer, db: Database, admin_token: str, user_token: UserToken) -> None:
    alice = await user_token("alice")
    await create(stub, admin_token, "proj", ("alice",), limit_micro_usd=9_000_000)
    world = await project_world(db, FakeClock(at(0)))
    batch_id, _, job_id = await world.batch([{}], user="alice")
    attempts = await start_jobs(world, [(batch_id, job_id, "alice", 4000, 0)])
    await heartbeat(world, attempts, at(10))

    async def project_spend() -> int:
        response = await stub.GetSpend(pb.GetSpendRequest(billing_project="proj"), metadata=bearer(alice))
        return response.total_micro_usd

    before = await project_spend()
    assert before > 0
    one_second = duration_pb2.Duration(seconds=1)
    stream = stub.WatchSpend(pb.WatchSpendRequest(billing_project="proj", min_interval=one_second),
                             metadata=bearer(alice))
    try:
        first = (await asyncio.wait_for(stream.read(), TIMEOUT_S)).update
        first_at = time.monotonic()
        assert (first.billing_project, first.spend_micro_usd, first.delta_micro_usd) == ("proj", before, 0)
        assert first.limit_micro_usd == 9_000_000 and first.reserved_micro_usd == 0 and list(first.batch_deltas) == []

        await heartbeat(world, attempts, at(25))
        after = await project_spend()
        assert after > before
        second = (await asyncio.wait_for(stream.read(), TIMEOUT_S)).update
        assert time.monotonic() - first_at >= 0.9  # no more often than min_interval
        assert (second.spend_micro_usd, second.delta_micro_usd) == (after, after - before)
        assert [(line.batch_id, line.cost_micro_usd) for line in second.batch_deltas] == [(batch_id, after - before)]
        assert second.at.ToMilliseconds() >= first.at.ToMilliseconds()

        # A limit change is news too; spend unchanged.
        await stub.SetLimit(pb.SetLimitRequest(billing_project="proj"), metadata=bearer(admin_token))
        third = (await asyncio.wait_for(stream.read(), TIMEOUT_S)).update
        assert (third.spend_micro_usd, third.delta_micro_usd, third.HasField("limit_micro_usd")) == (after, 0, False)
        assert frontend_billing.billing.active_watches == 1
    finally:
        stream.cancel()
    await eventually(lambda: frontend_billing.billing.active_watches == 0)


async def test_watch_spend_ends_when_the_watcher_leaves_the_project(
        stub, frontend_billing: FrontendServer, admin_token: str, user_token: UserToken) -> None:
    alice = await user_token("alice")
    await create(stub, admin_token, "proj", ("alice",))
    stream = stub.WatchSpend(pb.WatchSpendRequest(billing_project="proj", min_interval=duration_pb2.Duration(nanos=1)),
                             metadata=bearer(alice))
    try:
        first = (await asyncio.wait_for(stream.read(), TIMEOUT_S)).update
        assert first.spend_micro_usd == 0
        await stub.RemoveMember(pb.RemoveMemberRequest(billing_project="proj", username="alice"),
                                metadata=bearer(admin_token))
        error = await refused(stream.read())
        assert error.code() == grpc.StatusCode.NOT_FOUND
    finally:
        stream.cancel()
    await eventually(lambda: frontend_billing.billing.active_watches == 0)
