"""LockService.ListLocks over real gRPC, and `corral locks`: who holds each
lock, who waits for it and in what order, who may see it, bad requests,
and pages that cover every lock once.

Jobs are submitted through BatchService and started with the driver's
procedures on the same database (`tests.world.World`), as in test_jobs.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.batch.v1 import job_spec_pb2, lock_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import lock_service_pb2 as pb
from corral.cli_common import EXIT_NOT_FOUND
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from tests.service.conftest import person_channel
from tests.service.test_cli_jobs import corral, logged_in, out
from tests.service.test_jobs import Env, env, refused, spec, violations  # noqa: F401 - env is a fixture

SHARED, EXCLUSIVE = job_spec_pb2.LOCK_MODE_SHARED, job_spec_pb2.LOCK_MODE_EXCLUSIVE
ALL_EXCLUSIVE = job_spec_pb2.LOCK_MODE_ALL_EXCLUSIVE


def locked(mode: int, *names: str, level: str = "db", priority: int = 0) -> job_spec_pb2.JobSpec:
    return spec(locks=[job_spec_pb2.JobLock(level=level, mode=mode, names=list(names))], priority=priority)


@pytest.fixture
async def locks(env: Env, certs: DevCertificateAuthority) -> AsyncIterator[lock_service_pb2_grpc.LockServiceStub]:
    async with person_channel(certs.issue("someone"), env.frontend.public_port) as channel:
        yield lock_service_pb2_grpc.LockServiceStub(channel)


async def listed(locks: lock_service_pb2_grpc.LockServiceStub, env: Env, who: str, **request) -> list:
    return list((await locks.ListLocks(pb.ListLocksRequest(**request), metadata=env.as_(who))).locks)


def jobs(refs) -> list[int]:
    return [r.job_id for r in refs]


async def world(env: Env) -> int:
    """alice's batch in 'proj': jobs 1 and 2 hold db/x shared; 3 and 4 want it exclusively (4 first: higher
    priority); 5 wants it shared (no wait); 6 wants db/y, which nobody holds; 7 wants the whole level."""
    w = env.world
    await w.instance(cores_mcpu=64_000)
    batch_id = await env.submit(locked(SHARED, "x"), locked(SHARED, "x"), locked(EXCLUSIVE, "x"),
                                locked(EXCLUSIVE, "x", priority=5), locked(SHARED, "x"), locked(EXCLUSIVE, "y"),
                                locked(ALL_EXCLUSIVE), spec())
    await w.run(batch_id, 1)
    await w.run(batch_id, 2)
    return batch_id


async def test_holders_and_waiters(env: Env, locks: lock_service_pb2_grpc.LockServiceStub) -> None:
    batch_id = await world(env)
    found = await listed(locks, env, "bob")
    assert [(s.billing_project, s.level, s.name) for s in found] == [("proj", "db", ""), ("proj", "db", "x"),
                                                                      ("proj", "db", "y")]
    level, x, y = found
    # Shared holders hold together; the exclusive waiters wait behind both, the higher priority first; the
    # shared one does not wait.
    assert [(h.job.batch_id, h.job.job_id, h.mode) for h in x.holders] == [(batch_id, 1, SHARED),
                                                                           (batch_id, 2, SHARED)]
    assert all(h.since.ToMilliseconds() == env.world.clock() for h in x.holders)
    assert [(w.job.job_id, w.mode, w.priority) for w in x.waiters] == [(4, EXCLUSIVE, 5), (3, EXCLUSIVE, 0)]
    assert x.n_waiters == 2
    assert all(jobs(w.blocked_by) == [1, 2] for w in x.waiters)
    assert all(w.priority_weight >= 0 for w in x.waiters)
    # Wanted, held by nobody: listed, nobody waits.
    assert (list(y.holders), list(y.waiters), y.n_waiters) == ([], [], 0)
    # The whole level, exclusively: the shared holders of db/x are in its way.
    assert list(level.holders) == [] and level.n_waiters == 1
    [waiter] = level.waiters
    assert (waiter.job.job_id, waiter.mode, jobs(waiter.blocked_by)) == (7, ALL_EXCLUSIVE, [1, 2])

    assert [s.name for s in await listed(locks, env, "bob", level="db", name="x")] == ["x"]
    assert await listed(locks, env, "bob", level="other") == []

    # Once the holders are done, nobody waits any more.
    for job_id in (1, 2):
        await env.world.finish(batch_id, job_id, None, "Success")
    x = (await listed(locks, env, "bob", level="db", name="x"))[0]
    assert (list(x.holders), list(x.waiters), x.n_waiters) == ([], [], 0)


async def test_who_sees_which_projects(env: Env, locks: lock_service_pb2_grpc.LockServiceStub) -> None:
    await world(env)
    await env.batches.SubmitBatch(bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                                         billing_project="elsewhere", jobs=[locked(SHARED, "z")]),
                                  metadata=env.as_("carol"))
    assert {s.billing_project for s in await listed(locks, env, "bob")} == {"proj"}
    assert {s.billing_project for s in await listed(locks, env, "carol")} == {"elsewhere"}
    assert {s.billing_project for s in await listed(locks, env, "root")} == {"proj", "elsewhere"}
    assert {s.billing_project for s in await listed(locks, env, "root", billing_project="elsewhere")} == {
        "elsewhere"}
    # An outsider asking for a project is told what a missing project's asker is told.
    for project in ("proj", "no-such-project"):
        error = await refused(locks.ListLocks(pb.ListLocksRequest(billing_project=project),
                                              metadata=env.as_("carol")))
        assert (error.code(), error.details()) == (grpc.StatusCode.NOT_FOUND, f"no billing project {project}")


async def test_bad_requests(env: Env, locks: lock_service_pb2_grpc.LockServiceStub) -> None:
    for request, field in ((pb.ListLocksRequest(page_size=-1), "page_size"),
                           (pb.ListLocksRequest(page_token="not base64!"), "page_token"),
                           (pb.ListLocksRequest(page_token="W10="), "page_token"),  # base64 of []
                           (pb.ListLocksRequest(name="x"), "name")):
        error = await refused(locks.ListLocks(request, metadata=env.as_("bob")))
        assert (error.code(), violations(error)) == (grpc.StatusCode.INVALID_ARGUMENT, [field])
    error = await refused(locks.ListLocks(pb.ListLocksRequest(), metadata=()))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_pages_cover_every_lock_once(env: Env, locks: lock_service_pb2_grpc.LockServiceStub) -> None:
    await env.world.instance(cores_mcpu=64_000)
    await env.submit(*(locked(SHARED, f"n{i}", level=f"l{i % 3}") for i in range(7)), locked(ALL_EXCLUSIVE))
    everything = [(s.level, s.name) for s in await listed(locks, env, "alice", page_size=100)]
    assert len(everything) == 8 and everything == sorted(everything)
    paged, token = [], ""
    while True:
        page = await locks.ListLocks(pb.ListLocksRequest(page_size=3, page_token=token), metadata=env.as_("alice"))
        assert len(page.locks) <= 3
        paged += [(s.level, s.name) for s in page.locks]
        token = page.next_page_token
        if not token:
            break
    assert paged == everything


async def test_corral_locks(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    batch_id = await world(env)
    lines = out(await corral(logged_in(env, auth_app, certs, tmp_path, "bob"), "locks", "--project", "proj")
                ).splitlines()
    assert lines[0].split() == ["PROJECT", "LOCK", "MODE", "HOLDERS", "WAITERS"]
    rows = [line.split(None, 4) for line in lines[1:]]
    b = batch_id
    assert rows == [["proj", "db/[all]", "-", "-", f"all_exclusive:{b}/7"],
                    ["proj", "db/x", "shared", f"{b}/1,{b}/2", f"exclusive:{b}/4,{b}/3"],
                    ["proj", "db/y", "-", "-", "-"]]
    carol = logged_in(env, auth_app, certs, tmp_path, "carol")
    result = await corral(carol, "locks", "--project", "proj")
    assert (result.returncode, result.stderr.decode()) == (EXIT_NOT_FOUND, "error: no billing project proj\n")
    assert out(await corral(carol, "locks")) == "no lock is held or wanted\n"
