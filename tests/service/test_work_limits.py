"""Caps on work through the frontend: jobs per batch, open jobs per user and
project, children per job. Each refusal is INVALID_ARGUMENT (a shape) or
RESOURCE_EXHAUSTED with a QuotaFailure (a quota), names the limit and its
value, and writes nothing."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from corral.batch.v1 import batch_service_pb2_grpc, job_spec_pb2
from corral.batch.v1 import batch_service_pb2 as pb
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.app import FrontendApp, FrontendConfig
from services.frontend.app import start as start_frontend
from services.frontend.limits import Limits
from tests.conftest import service_url
from tests.service.conftest import bearer, limits_for_tests, person_channel

LIMITS = limits_for_tests(max_jobs_per_batch=10, max_open_jobs_per_user=15, max_open_jobs_per_billing_project=100,
                max_children_per_job=3)


@pytest.fixture
async def small_frontend(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                         tmp_path: Path) -> AsyncIterator[FrontendApp]:
    app = await start_frontend(FrontendConfig(service_url(db_config, "frontend"), certs.directory,
                                              f"localhost:{auth_app.internal_port}", f"file://{tmp_path / 'blobs'}",
                                              limits=LIMITS))
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def alice(auth_app: AuthApp, db: Database) -> tuple[tuple[str, str], ...]:
    store = AuthStore(auth_app.db)
    await store.create_user("alice")
    await JobStore(db).create_billing_project("proj", ["alice"])
    return bearer((await store.create_token("alice", "api"))[1])


@pytest.fixture
async def stub(small_frontend: FrontendApp, certs: DevCertificateAuthority) -> AsyncIterator:
    async with person_channel(certs.issue("someone"), small_frontend.public_port) as channel:
        yield batch_service_pb2_grpc.BatchServiceStub(channel)


def job(*parents: int) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                parents=[job_spec_pb2.ParentRef(in_update_offset=p) for p in parents])


async def rows(frontend: FrontendApp) -> tuple[int, ...]:
    counts = []
    for table in ("batches", "batch_updates", "jobs", "job_parents"):
        counts.append(int((await frontend.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}"))["n"]))
    return tuple(counts)


async def refused(frontend: FrontendApp, code: grpc.StatusCode, message: str, call) -> grpc.aio.AioRpcError:
    before = await rows(frontend)
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call
    assert error.value.code() == code, error.value.details()
    assert message in error.value.details()
    assert await rows(frontend) == before
    return error.value


async def test_a_batch_over_the_cap_is_refused_before_anything_is_written(stub, alice, small_frontend) -> None:
    error = await refused(small_frontend, grpc.StatusCode.INVALID_ARGUMENT, "at most 10 jobs (max_jobs_per_batch)",
                          stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                                 billing_project="proj", n_jobs=11), metadata=alice))
    details = error_details_pb2.BadRequest()
    status = rpc_status.from_call(error)
    assert status is not None and status.details[0].Unpack(details)
    assert [v.field for v in details.field_violations] == ["n_jobs"]
    await refused(small_frontend, grpc.StatusCode.INVALID_ARGUMENT, "max_jobs_per_batch",
                  stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                         billing_project="proj", jobs=[job()] * 11), metadata=alice))
    # Growing a batch past it, update by update, is refused too.
    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                           billing_project="proj", n_jobs=8), metadata=alice)
    await refused(small_frontend, grpc.StatusCode.INVALID_ARGUMENT,
                  "a batch may have at most 10 jobs (max_jobs_per_batch); this one would have 11",
                  stub.CreateUpdate(pb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                           batch_id=created.batch.batch_id, n_jobs=3), metadata=alice))


async def test_open_jobs_past_the_quota_are_resource_exhausted(stub, alice, small_frontend) -> None:
    await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                 billing_project="proj", n_jobs=10), metadata=alice)
    error = await refused(
        small_frontend, grpc.StatusCode.RESOURCE_EXHAUSTED,
        "user alice has 10 open jobs; 6 more would pass the limit (max_open_jobs_per_user) of 15",
        stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                               billing_project="proj", n_jobs=6), metadata=alice))
    status = rpc_status.from_call(error)
    failure = error_details_pb2.QuotaFailure()
    assert status is not None and status.details[0].Unpack(failure)
    assert "max_open_jobs_per_user" in failure.violations[0].description
    await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                 billing_project="proj", n_jobs=5), metadata=alice)


async def test_a_fan_out_over_the_cap_is_refused(stub, alice, small_frontend) -> None:
    await refused(small_frontend, grpc.StatusCode.INVALID_ARGUMENT,
                  "its parent would have more than 3 children (max_children_per_job)",
                  stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex, billing_project="proj",
                                                         jobs=[job(), job(-1), job(-2), job(-3), job(-4)]),
                                   metadata=alice))
    done = await stub.SubmitBatch(pb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                        billing_project="proj", jobs=[job(), job(-1), job(-2),
                                                                                     job(-3)]), metadata=alice)
    assert done.batch.counts.n_jobs == 4
    # AddJobs to a later update counts the children stored before (in the database).
    created = await stub.CreateBatch(pb.CreateBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                           billing_project="proj", n_jobs=3), metadata=alice)
    batch_id, update_id = created.batch.batch_id, created.update.update_id
    await stub.AddJobs(pb.AddJobsRequest(batch_id=batch_id, update_id=update_id, jobs=[job(), job(-1), job(-2)]),
                       metadata=alice)
    await stub.CommitUpdate(pb.CommitUpdateRequest(batch_id=batch_id, update_id=update_id), metadata=alice)
    update = await stub.CreateUpdate(pb.CreateUpdateRequest(idempotency_token=uuid.uuid4().hex,
                                                            batch_id=batch_id, n_jobs=2), metadata=alice)
    later = [job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                  parents=[job_spec_pb2.ParentRef(job_id=1)])]
    await refused(small_frontend, grpc.StatusCode.INVALID_ARGUMENT,
                  "would have 4 children; the limit (max_children_per_job) is 3",
                  stub.AddJobs(pb.AddJobsRequest(batch_id=batch_id, update_id=update.update.update_id,
                                                 jobs=later * 2), metadata=alice))


def test_every_cap_is_an_operator_flag() -> None:
    parser = argparse.ArgumentParser()
    Limits.add_flags(parser)
    limits = Limits.from_args(parser.parse_args(["--max-children-per-job", "1000000", "--max-jobs-per-batch", "5"]))
    assert (limits.max_children_per_job, limits.max_jobs_per_batch) == (1_000_000, 5)
    assert Limits.from_args(parser.parse_args([])) == Limits()
    with pytest.raises(ValueError, match="max_open_jobs_per_user must be positive"):
        Limits(max_open_jobs_per_user=0)
