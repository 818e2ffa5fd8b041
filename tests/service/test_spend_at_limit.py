"""A billing project whose spend equals its limit takes no new work (issue 36, item 10b), over real gRPC.

One core for 450 ms costs 5 micro-dollars at the local rate (migration 0002); the limit is set to the spend
the project reads. At the limit is refused as above it: FAILED_PRECONDITION naming the spend and the limit
(billing_limit_reached compares both in whole micro-dollars, as the API shows them).
"""

from __future__ import annotations

import uuid

import grpc

from corral.batch.v1 import batch_service_pb2 as bpb
from services.db.invariants import check_invariants
from tests.service.test_jobs import Env, env, refused, spec  # noqa: F401 - env is a fixture


async def test_spend_equal_to_the_limit_refuses_a_new_batch_and_update(env: Env) -> None:
    w = env.world
    await w.instance()
    alice = env.as_("alice")
    batch_id = await env.submit(spec(), spec())
    attempt = await w.run(batch_id, 1)
    ref = {"batch_id": batch_id, "job_id": 1, "attempt_id": attempt}
    await w.store.add_attempt_resources(w.epoch, [{**ref, "resource": "cpu/local/1", "quantity": 1000}])
    await w.store.heartbeat_rollup(w.epoch, "i1", [{**ref, "rollup_time_ms": w.clock() + 450}])
    await w.db.execute("UPDATE billing_projects SET limit_usd = %s WHERE name = 'proj'", (5 / 1e6,))
    message = "billing project proj has spent $0.000005 of its $0.000005 limit"

    error = await refused(env.batches.SubmitBatch(bpb.SubmitBatchRequest(
        billing_project="proj", idempotency_token=uuid.uuid4().hex, jobs=[spec()]), metadata=alice))
    assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, message)
    error = await refused(env.batches.CreateUpdate(bpb.CreateUpdateRequest(
        batch_id=batch_id, idempotency_token=uuid.uuid4().hex, n_jobs=1), metadata=alice))
    assert (error.code(), error.details()) == (grpc.StatusCode.FAILED_PRECONDITION, message)
    assert await w.db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 1}
    # Below the limit by one micro-dollar of it, the project takes work.
    await w.db.execute("UPDATE billing_projects SET limit_usd = %s WHERE name = 'proj'", (6 / 1e6,))
    assert await env.submit(spec()) != batch_id
    assert await check_invariants(w.db) == []
