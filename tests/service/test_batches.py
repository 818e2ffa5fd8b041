"""BatchService over real gRPC: submission, idempotency, validation, visibility."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import batch_pb2, batch_service_pb2_grpc, job_group_pb2, job_spec_pb2, job_state_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.invariants import check_invariants
from services.db.store import JobStore
from services.frontend.app import FrontendApp
from services.common.specs import SpecStore
from services.frontend.limits import Limits
from tests.service.conftest import bearer, person_channel


@pytest.fixture
async def tokens(auth_app: AuthApp, db: Database) -> dict[str, str]:
    """alice and bob are users; only alice is a member of 'proj'."""
    store = AuthStore(auth_app.db)
    found = {}
    for name in ("alice", "bob"):
        await store.create_user(name)
        found[name] = (await store.create_token(name, "api"))[1]
    await JobStore(db).create_billing_project("proj", ["alice"])
    return found


@pytest.fixture
async def stub(frontend: FrontendApp, certs: DevCertificateAuthority) -> AsyncIterator:
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        yield batch_service_pb2_grpc.BatchServiceStub(channel)


def job(*parents: int, image: str = "busybox", **kwargs) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image=image, argv=job_spec_pb2.Argv(args=["true"]),
                                parents=[job_spec_pb2.ParentRef(in_update_offset=p) for p in parents], **kwargs)


async def count(frontend: FrontendApp, table: str) -> int:
    row = await frontend.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}")
    return int(row["n"])


async def test_submit_a_small_dag_and_resubmit_with_the_same_token(stub, tokens, frontend) -> None:
    request = pb.SubmitBatchRequest(billing_project="proj", idempotency_token="t1", attributes={"name": "dag"},
                                    jobs=[job(), job(-1), job(-2, -1)])
    first = await stub.SubmitBatch(request, metadata=bearer(tokens["alice"]))
    b = first.batch
    assert (b.user, b.state, b.attributes["name"]) == ("alice", batch_pb2.BATCH_STATE_RUNNING, "dag")
    assert (b.counts.n_jobs, b.counts.n_ready, b.counts.n_pending) == (3, 1, 2)
    again = await stub.SubmitBatch(request, metadata=bearer(tokens["alice"]))
    assert again.batch.batch_id == b.batch_id
    assert await count(frontend, "jobs") == 3
    edges = await frontend.db.fetchall("SELECT job_id, parent_id FROM job_parents ORDER BY job_id, parent_id")
    assert [(e["job_id"], e["parent_id"]) for e in edges] == [(2, 1), (3, 1), (3, 2)]


async def test_large_submission_in_parallel_bunches(stub, tokens, frontend) -> None:
    alice = bearer(tokens["alice"])
    created = await stub.CreateBatch(pb.CreateBatchRequest(billing_project="proj", n_jobs=10, idempotency_token="b"),
                                     metadata=alice)
    batch_id, update_id = created.batch.batch_id, created.update.update_id
    bunches = [pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, bunch_index=i, first_index=5 * i,
                                 jobs=[job(-5) if i else job() for _ in range(5)]) for i in (1, 0)]
    results = await asyncio.gather(*(stub.AddJobs(b, metadata=alice) for b in bunches))
    assert [r.already_received for r in results] == [False, False]
    resent = await stub.AddJobs(bunches[0], metadata=alice)
    assert resent.already_received
    committed = await stub.CommitUpdate(pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id), metadata=alice)
    assert (committed.batch.counts.n_jobs, committed.batch.counts.n_ready) == (10, 5)
    # The stored spec is the one submitted.
    row = await frontend.db.fetchone("SELECT spec_ref FROM jobs WHERE batch_id = %s AND job_id = 7", (batch_id,))
    spec = await SpecStore("file:///").read(row["spec_ref"])
    assert (spec.image, list(spec.argv.args), spec.parents[0].in_update_offset) == ("busybox", ["true"], -5)


@pytest.mark.parametrize("bad_job, field", [
    (job_spec_pb2.JobSpec(argv=job_spec_pb2.Argv(args=["true"])), "jobs[1].image"),
    (job_spec_pb2.JobSpec(image="busybox"), "jobs[1].command"),
    (job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                          parents=[job_spec_pb2.ParentRef(job_id=2)]), "jobs[1].parents[0].job_id"),
    (job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                          resources=job_spec_pb2.ResourceRequest(cores_mcpu=-1)), "jobs[1].resources.cores_mcpu"),
    (job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]), parents=[
        job_spec_pb2.ParentRef(in_update_offset=-1, accepted_states=[job_state_pb2.JOB_STATE_RUNNING])]),
     "jobs[1].parents[0].accepted_states"),
])
async def test_malformed_specs_are_invalid_argument_and_nothing_is_written(stub, tokens, frontend, bad_job,
                                                                          field) -> None:
    request = pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj", jobs=[job(), bad_job])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(request, metadata=bearer(tokens["alice"]))
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error.value)
    assert status is not None
    details = error_details_pb2.BadRequest()
    assert status.details[0].Unpack(details)
    assert field in [v.field for v in details.field_violations]
    assert await count(frontend, "jobs") == 0


async def test_oversize_bunch_is_refused(stub, tokens, frontend) -> None:
    alice = bearer(tokens["alice"])
    most = Limits().max_jobs_per_bunch
    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                           billing_project="proj", n_jobs=most + 1), metadata=alice)
    request = pb.AddJobsRequest(batch_id=created.batch.batch_id, update_id=created.update.update_id,
                                jobs=[job() for _ in range(most + 1)])
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.AddJobs(request, metadata=alice)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await count(frontend, "jobs") == 0


async def test_only_members_see_or_touch_a_batch(stub, tokens, frontend) -> None:
    submitted = await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                             billing_project="proj", jobs=[job()]),
                                       metadata=bearer(tokens["alice"]))
    batch_id = submitted.batch.batch_id
    bob = bearer(tokens["bob"])  # outside proj: its batches are as missing to him as ones that never were
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                     billing_project="proj", jobs=[job()]), metadata=bob)
    assert (error.value.code(), error.value.details()) == (grpc.StatusCode.NOT_FOUND, "no billing project proj")
    for call in (stub.GetBatch(pb.GetBatchRequest(batch_id=batch_id), metadata=bob),
                 stub.CancelBatch(pb.CancelBatchRequest(batch_id=batch_id), metadata=bob),
                 stub.CreateUpdate(pb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                          batch_id=batch_id, n_jobs=1), metadata=bob)):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert (error.value.code(), error.value.details()) == (grpc.StatusCode.NOT_FOUND, f"no batch {batch_id}")
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.GetBatch(pb.GetBatchRequest(batch_id=batch_id + 1), metadata=bob)
    assert (error.value.code(), error.value.details()) == (grpc.StatusCode.NOT_FOUND, f"no batch {batch_id + 1}")
    assert (await count(frontend, "batches"), await count(frontend, "job_groups_cancelled"),
            await count(frontend, "batch_updates")) == (1, 0, 1)


@pytest.mark.parametrize("metadata", [(), bearer("garbage")], ids=["anonymous", "garbage"])
async def test_every_rpc_refuses_a_caller_without_valid_token(stub, tokens, frontend, metadata) -> None:
    calls = [
        stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                               billing_project="proj"), metadata=metadata),
        stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                               billing_project="proj", jobs=[job()]), metadata=metadata),
        stub.CreateUpdate(pb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                 batch_id=1, n_jobs=1), metadata=metadata),
        stub.CreateJobGroups(pb.CreateJobGroupsRequest(batch_id=1, update_id=1), metadata=metadata),
        stub.AddJobs(pb.AddJobsRequest(batch_id=1, update_id=1, jobs=[job()]), metadata=metadata),
        stub.CommitUpdate(pb.CommitUpdateRequest(batch_id=1, update_id=1), metadata=metadata),
        stub.GetBatch(pb.GetBatchRequest(batch_id=1), metadata=metadata),
        stub.ListBatches(pb.ListBatchesRequest(), metadata=metadata),
        stub.ListRegions(pb.ListRegionsRequest(), metadata=metadata),
        stub.CancelBatch(pb.CancelBatchRequest(batch_id=1), metadata=metadata),
    ]
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await count(frontend, "batches") == 0


async def test_cancel_records_who_and_why(stub, tokens, frontend) -> None:
    alice = bearer(tokens["alice"])
    submitted = await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                             billing_project="proj", jobs=[job(), job(-1)]),
                                       metadata=alice)
    cancelled = await stub.CancelBatch(pb.CancelBatchRequest(batch_id=submitted.batch.batch_id, reason="wrong input"),
                                       metadata=alice)
    info = cancelled.batch.cancellation
    assert (info.cancelled_by, info.reason, info.cause) == ("alice", "wrong input",
                                                             batch_pb2.CANCELLATION_CAUSE_USER_REQUEST)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.CreateUpdate(pb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                       batch_id=submitted.batch.batch_id, n_jobs=1), metadata=alice)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_list_regions_says_where_the_machines_are_made_the_preferred_first(stub, tokens, db) -> None:
    bob = bearer(tokens["bob"])  # no member of any project: any signed-in user may ask
    listed = await stub.ListRegions(pb.ListRegionsRequest(), metadata=bob)
    assert (list(listed.regions), listed.default_region) == (["local"], "local")  # no cloud: every region
    # A cloud's configured regions, in its order: `local`, which it lacks, is no longer listed.
    await JobStore(db).add_regions(["us-east1", "europe-west4"])
    listed = await stub.ListRegions(pb.ListRegionsRequest(), metadata=bob)
    assert (list(listed.regions), listed.default_region) == (["us-east1", "europe-west4"], "us-east1")
    await JobStore(db).add_regions(["europe-west4"])  # configured again, with one region only
    listed = await stub.ListRegions(pb.ListRegionsRequest(), metadata=bob)
    assert (list(listed.regions), listed.default_region) == (["europe-west4"], "europe-west4")


async def test_list_batches_with_a_query_and_pages(stub, tokens, frontend) -> None:
    alice = bearer(tokens["alice"])
    ids = []
    for i in range(5):
        submitted = await stub.SubmitBatch(pb.SubmitBatchRequest(
            idempotency_token=uuid.uuid4().hex,
            billing_project="proj", attributes={"stage": "a" if i % 2 else "b"}, jobs=[job()]), metadata=alice)
        ids.append(submitted.batch.batch_id)
    stage_a = await stub.ListBatches(pb.ListBatchesRequest(query="stage=a user=alice"), metadata=alice)
    assert [b.batch_id for b in stage_a.batches] == [ids[3], ids[1]]
    pages, token = [], ""
    while True:
        page = await stub.ListBatches(pb.ListBatchesRequest(page_size=2, page_token=token), metadata=alice)
        pages.append([b.batch_id for b in page.batches])
        token = page.next_page_token
        if not token:
            break
    assert sum(pages, []) == ids[::-1]
    assert (await stub.ListBatches(pb.ListBatchesRequest(), metadata=bearer(tokens["bob"]))).batches == []
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await stub.ListBatches(pb.ListBatchesRequest(query="cost>>1"), metadata=alice)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    status = rpc_status.from_call(error.value)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    assert details.field_violations[0].field == "query"


def violated(error: grpc.aio.AioRpcError) -> list[str]:
    status = rpc_status.from_call(error)
    details = error_details_pb2.BadRequest()
    assert status is not None and status.details[0].Unpack(details)
    return [v.field for v in details.field_violations]


async def listed(stub, metadata) -> list[int]:
    return [b.batch_id for b in (await stub.ListBatches(pb.ListBatchesRequest(), metadata=metadata)).batches]


async def test_the_idempotency_token_is_required(stub, tokens, frontend) -> None:
    """Issue 12: the protos say it is required; a request without one is INVALID_ARGUMENT, writing nothing."""
    alice = bearer(tokens["alice"])
    batch_id = (await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token="first", billing_project="proj",
                                                             jobs=[job()]), metadata=alice)).batch.batch_id
    before = (await count(frontend, "batches"), await count(frontend, "batch_updates"))
    for call in (stub.CreateBatch(pb.CreateBatchRequest(billing_project="proj", n_jobs=1), metadata=alice),
                 stub.SubmitBatch(pb.SubmitBatchRequest(billing_project="proj", jobs=[job()]), metadata=alice),
                 stub.CreateUpdate(pb.CreateUpdateRequest(batch_id=batch_id, n_jobs=1), metadata=alice)):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await call
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert violated(error.value) == ["idempotency_token"]
    assert (await count(frontend, "batches"), await count(frontend, "batch_updates")) == before


@pytest.mark.parametrize("rpc", ["SubmitBatch", "CreateBatch"])
async def test_a_submission_refused_after_its_batch_was_created_leaves_no_batch(
        stub, tokens, frontend, db, monkeypatch, rpc) -> None:
    """Issue 12, nothing half-written: the project closes between create_batch and create_update (someone
    else's change, which no check before create_batch can see). The refusal takes the batch back, so the
    batch list is as before, and the same request (the same token) succeeds once the project reopens."""
    alice = bearer(tokens["alice"])
    kept = (await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token="kept", billing_project="proj",
                                                         jobs=[job()]), metadata=alice)).batch.batch_id
    create_update = JobStore.create_update

    async def closed_meanwhile(self, *args, **kwargs):
        await db.execute("UPDATE billing_projects SET state = 'closed' WHERE name = 'proj'")
        return await create_update(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "create_update", closed_meanwhile)
    request = (pb.SubmitBatchRequest(idempotency_token="t", billing_project="proj", jobs=[job(), job(-1)])
               if rpc == "SubmitBatch" else pb.CreateBatchRequest(idempotency_token="t", billing_project="proj",
                                                                  n_jobs=2))
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await getattr(stub, rpc)(request, metadata=alice)
    assert (error.value.code(), error.value.details()) == (grpc.StatusCode.FAILED_PRECONDITION,
                                                           "billing project proj is closed")
    assert await listed(stub, alice) == [kept]
    assert await check_invariants(db) == []

    monkeypatch.undo()
    await db.execute("UPDATE billing_projects SET state = 'open' WHERE name = 'proj'")
    again = await getattr(stub, rpc)(request, metadata=alice)
    assert again.batch.batch_id != kept and await listed(stub, alice) == [again.batch.batch_id, kept]
    retried = await getattr(stub, rpc)(request, metadata=alice)  # the token names the new batch now
    assert retried.batch.batch_id == again.batch.batch_id


async def test_a_page_of_batches_costs_the_same_few_statements_however_long(stub, tokens, frontend,
                                                                           monkeypatch) -> None:
    """ListBatches reads a page's counts and attributes once for the page, not once per batch (a page of
    1,000 batches was 3,001 statements); the counts are each batch's own."""
    alice = bearer(tokens["alice"])
    ids = []
    for i in range(12):
        submitted = await stub.SubmitBatch(pb.SubmitBatchRequest(
            idempotency_token=uuid.uuid4().hex, billing_project="proj", attributes={"n": str(i)},
            jobs=[job()] * (i % 3 + 1)), metadata=alice)
        ids.append(submitted.batch.batch_id)
    await stub.CancelBatch(pb.CancelBatchRequest(batch_id=ids[0]), metadata=alice)
    statements: list[str] = []
    for method in ("fetchall", "fetchone", "execute", "call"):
        original = getattr(Database, method)

        def counting(self, sql, *args, _original=original, **kwargs):  # type: ignore[no-untyped-def]
            statements.append(str(sql)[:60])
            return _original(self, sql, *args, **kwargs)

        monkeypatch.setattr(Database, method, counting)

    async def statements_for(page_size: int) -> tuple[int, list[batch_pb2.Batch]]:
        statements.clear()
        page = await stub.ListBatches(pb.ListBatchesRequest(page_size=page_size), metadata=alice)
        return len(statements), list(page.batches)

    few, first_two = await statements_for(2)
    many, all_of_them = await statements_for(12)
    assert few == many, statements
    assert [b.batch_id for b in all_of_them] == ids[::-1] and first_two == all_of_them[:2]
    for batch in all_of_them:
        i = ids.index(batch.batch_id)
        assert batch.attributes["n"] == str(i) and batch.counts.n_jobs == i % 3 + 1
        single = (await stub.GetBatch(pb.GetBatchRequest(batch_id=batch.batch_id), metadata=alice)).batch
        assert single.counts == batch.counts and single.attributes == batch.attributes
    assert all_of_them[-1].counts.n_cancelled + all_of_them[-1].counts.n_ready == 1


async def test_a_submission_of_no_jobs_is_refused_and_an_empty_batch_to_fill_later_is_create_batch(
        stub, tokens, frontend) -> None:
    """SubmitBatch of no jobs (a file's `jobs: []`) would make a batch that completes at once, having done
    nothing: refused, nothing written. CreateBatch without jobs stays the way to open one and add jobs later."""
    alice = bearer(tokens["alice"])
    for groups in ([], [job_group_pb2.JobGroupSpec()]):
        with pytest.raises(grpc.aio.AioRpcError) as error:
            await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                         job_groups=groups), metadata=alice)
        assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = error_details_pb2.BadRequest()
        assert rpc_status.from_call(error.value).details[0].Unpack(details)
        assert [(v.field, v.description) for v in details.field_violations] == [(
            "jobs", "a batch needs at least one job (one of none would complete at once, having done nothing); to "
                    "open a batch and add its jobs later, use CreateBatch and CreateUpdate")]
    assert await count(frontend, "batches") == 0

    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                           billing_project="proj"), metadata=alice)
    update = await stub.CreateUpdate(pb.CreateUpdateRequest(batch_id=created.batch.batch_id, n_jobs=1,
                                                            idempotency_token=uuid.uuid4().hex), metadata=alice)
    await stub.AddJobs(pb.AddJobsRequest(batch_id=created.batch.batch_id, update_id=update.update.update_id,
                                         jobs=[job()]), metadata=alice)
    committed = await stub.CommitUpdate(pb.CommitUpdateRequest(batch_id=created.batch.batch_id,
                                                               update_id=update.update.update_id), metadata=alice)
    assert committed.batch.counts.n_jobs == 1
