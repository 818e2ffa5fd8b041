"""An idempotency token reused for a different request is ALREADY_EXISTS (issue 36, item 4), over real gRPC.

The same request under a token finds what the first call made (a client's retry, `corral submit` of the
same file); a different one is refused, naming the token as the user wrote it and what it made, and
writes nothing. A batch stored before migration 0027 (no digest) keeps the token-alone answer.
"""

from __future__ import annotations

import grpc

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_state_pb2
from services.db.invariants import check_invariants
from tests.service.test_jobs import Env, complete, env, refused, spec  # noqa: F401 - env is a fixture


def nightly(*words: str, token: str = "nightly-3", **fields) -> bpb.SubmitBatchRequest:
    """A batch of one `echo WORD` job per word under `token`."""
    jobs = []
    for word in words:
        job = spec()
        job.argv.args[:] = ["echo", word]
        jobs.append(job)
    return bpb.SubmitBatchRequest(billing_project="proj", idempotency_token=token, jobs=jobs,
                                  attributes={"name": "nightly"}, **fields)


async def count(env: Env, table: str) -> int:
    return int((await env.world.db.fetchone(f"SELECT COUNT(*) AS n FROM {table}"))["n"])


async def test_submit_batch_same_request_same_batch_changed_request_already_exists(env: Env) -> None:
    alice = env.as_("alice")
    first = (await env.batches.SubmitBatch(nightly("a", "b"), metadata=alice)).batch
    again = (await env.batches.SubmitBatch(nightly("a", "b"), metadata=alice)).batch
    assert again.batch_id == first.batch_id and again.counts.n_jobs == 2
    message = (f'idempotency token "nightly-3" was used for batch {first.batch_id} with a different request; '
               "use a new token to submit a changed batch")
    # A changed job, one more job, another batch field: each a different request.
    for changed in (nightly("a", "c"), nightly("a", "b", "c"), nightly("a", "b", cancel_after_n_failures=1)):
        error = await refused(env.batches.SubmitBatch(changed, metadata=alice))
        assert (error.code(), error.details()) == (grpc.StatusCode.ALREADY_EXISTS, message)
    # Under a new token the changed batch is a new batch.
    other = (await env.batches.SubmitBatch(nightly("a", "c", token="nightly-4"), metadata=alice)).batch
    assert other.batch_id != first.batch_id
    assert (await count(env, "batches"), await count(env, "jobs")) == (2, 4)
    # A CreateBatch under a SubmitBatch's token is another request too.
    error = await refused(env.batches.CreateBatch(bpb.CreateBatchRequest(
        billing_project="proj", idempotency_token="nightly-3", attributes={"name": "nightly"}), metadata=alice))
    assert error.code() == grpc.StatusCode.ALREADY_EXISTS
    assert await check_invariants(env.world.db) == []


async def test_a_batch_stored_without_a_digest_keeps_the_token_alone(env: Env) -> None:
    """Batches made before migration 0027 have no digest: any request with their token finds them, as before."""
    alice = env.as_("alice")
    first = (await env.batches.SubmitBatch(nightly("a"), metadata=alice)).batch
    await env.world.db.execute("UPDATE batches SET request_digest = NULL")
    await env.world.db.execute("UPDATE batch_updates SET request_digest = NULL")
    again = (await env.batches.SubmitBatch(nightly("changed"), metadata=alice)).batch
    assert again.batch_id == first.batch_id and again.counts.n_jobs == 1
    assert await count(env, "batches") == 1


async def test_create_batch_and_create_update_tokens(env: Env) -> None:
    alice = env.as_("alice")
    create = bpb.CreateBatchRequest(billing_project="proj", idempotency_token="big-1", n_jobs=2)
    first = await env.batches.CreateBatch(create, metadata=alice)
    again = await env.batches.CreateBatch(create, metadata=alice)
    assert (again.batch.batch_id, again.update.update_id) == (first.batch.batch_id, first.update.update_id)
    batch_id = first.batch.batch_id
    error = await refused(env.batches.CreateBatch(bpb.CreateBatchRequest(
        billing_project="proj", idempotency_token="big-1", n_jobs=3), metadata=alice))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.ALREADY_EXISTS,
        f'idempotency token "big-1" was used for batch {batch_id} with a different request; '
        "use a new token to submit a changed batch")

    update = bpb.CreateUpdateRequest(batch_id=batch_id, idempotency_token="more-1", n_jobs=1)
    made = (await env.batches.CreateUpdate(update, metadata=alice)).update
    assert (await env.batches.CreateUpdate(update, metadata=alice)).update.update_id == made.update_id
    error = await refused(env.batches.CreateUpdate(bpb.CreateUpdateRequest(
        batch_id=batch_id, idempotency_token="more-1", n_jobs=5), metadata=alice))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.ALREADY_EXISTS,
        f'idempotency token "more-1" was used for update {made.update_id} of batch {batch_id} with a different '
        "request; use a new token to create a changed update")
    row = await env.world.db.fetchone("SELECT n_updates, n_reserved_jobs FROM batches WHERE batch_id = %s",
                                      (batch_id,))
    assert (row["n_updates"], row["n_reserved_jobs"]) == (2, 3)  # the refused call reserved nothing


async def test_rerun_tokens_compare_the_states_meant(env: Env) -> None:
    w = env.world
    await w.instance()
    alice = env.as_("alice")
    batch_id = await env.submit(spec(), spec())
    await complete(env, batch_id, 1, await w.run(batch_id, 1), "Failed", exit_code=1)
    await complete(env, batch_id, 2, await w.run(batch_id, 2), "Error")
    failed, errored = job_state_pb2.JOB_STATE_FAILED, job_state_pb2.JOB_STATE_ERROR
    first = (await env.batches.RerunFailedJobs(bpb.RerunFailedJobsRequest(
        batch_id=batch_id, idempotency_token="r1"), metadata=alice)).update
    # The default states are Failed and Error, in any order: the same re-run.
    for states in ([failed, errored], [errored, failed, failed]):
        again = (await env.batches.RerunFailedJobs(bpb.RerunFailedJobsRequest(
            batch_id=batch_id, idempotency_token="r1", states=states), metadata=alice)).update
        assert again.update_id == first.update_id
    error = await refused(env.batches.RerunFailedJobs(bpb.RerunFailedJobsRequest(
        batch_id=batch_id, idempotency_token="r1", states=[failed]), metadata=alice))
    assert (error.code(), error.details()) == (
        grpc.StatusCode.ALREADY_EXISTS,
        f'idempotency token "r1" was used for update {first.update_id} of batch {batch_id} to re-run other '
        "states; use a new token to re-run these")
    assert await count(env, "batch_updates") == 2
    assert await check_invariants(w.db) == []
