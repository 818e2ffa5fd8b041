"""An idempotency token reused for a different request is refused (issue 36, migration 0027), on a real MariaDB.

create_batch, create_update and rerun_failed_jobs store the request's digest beside the token: the same
digest finds what the first call made, as before; another is rc 5 (ConflictError) with the id of what the
token made, and writes nothing. Rows made before the migration (no digest) and calls without one are
matched on the token alone, as before it.
"""

from __future__ import annotations

import asyncio

import pytest

from services.db.database import ConflictError
from services.db.invariants import check_invariants
from tests.db.test_reruns import failed_dag
from tests.world import World

A = "a" * 64
B = "b" * 64


async def n_batches(world: World) -> int:
    return int((await world.db.fetchone("SELECT COUNT(*) AS n FROM batches"))["n"])


async def test_a_batch_token_with_the_same_digest_is_the_same_batch_and_with_another_refused(world: World) -> None:
    first = await world.store.create_batch("alice", "proj", "nightly-3", request_digest=A)
    assert first["created"] == 1
    again = await world.store.create_batch("alice", "proj", "nightly-3", request_digest=A)
    assert (again["batch_id"], again["created"], again["message"]) == (first["batch_id"], 0, "exists")
    with pytest.raises(ConflictError) as refused:
        await world.store.create_batch("alice", "proj", "nightly-3", request_digest=B)
    assert refused.value.rc == 5
    assert refused.value.status["batch_id"] == first["batch_id"]
    assert refused.value.message == (f'idempotency token "nightly-3" was used for batch {first["batch_id"]} '
                                     "with a different request")
    row = await world.batch_row(first["batch_id"])
    assert row["request_digest"] == A  # the refusal changed nothing
    # The token is the user's: bob's "nightly-3" is his own batch.
    bobs = await world.store.create_batch("bob", "proj", "nightly-3", request_digest=B)
    assert bobs["created"] == 1
    assert await n_batches(world) == 2
    assert await check_invariants(world.db) == []


async def test_rows_and_calls_without_a_digest_keep_the_token_alone(world: World) -> None:
    old = await world.store.create_batch("alice", "proj", "before-0027")  # as a row made before the migration
    assert (await world.batch_row(old["batch_id"]))["request_digest"] is None
    for digest in (A, B, None):
        found = await world.store.create_batch("alice", "proj", "before-0027", request_digest=digest)
        assert (found["batch_id"], found["created"]) == (old["batch_id"], 0)
    new = await world.store.create_batch("alice", "proj", "after-0027", request_digest=A)
    found = await world.store.create_batch("alice", "proj", "after-0027")  # a caller that sends no digest
    assert (found["batch_id"], found["created"]) == (new["batch_id"], 0)
    assert await n_batches(world) == 2


async def test_concurrent_calls_with_one_token_make_one_batch_and_refuse_the_other_request(world: World) -> None:
    for round_ in range(5):
        token = f"race-{round_}"
        results = await asyncio.gather(world.store.create_batch("alice", "proj", token, request_digest=A),
                                       world.store.create_batch("alice", "proj", token, request_digest=B),
                                       return_exceptions=True)
        made = [r for r in results if isinstance(r, dict)]
        conflicts = [r for r in results if isinstance(r, ConflictError)]
        assert len(made) == 1 and len(conflicts) == 1, results
        assert made[0]["created"] == 1 and conflicts[0].status["batch_id"] == made[0]["batch_id"]
    assert await n_batches(world) == 5


async def test_an_update_token_with_another_digest_is_refused(world: World) -> None:
    batch_id, _, _ = await world.batch([{}])
    first = await world.store.create_update(batch_id, 2, idempotency_token="more", request_digest=A)
    again = await world.store.create_update(batch_id, 2, idempotency_token="more", request_digest=A)
    assert (again["update_id"], again["message"]) == (first["update_id"], "exists")
    with pytest.raises(ConflictError) as refused:
        await world.store.create_update(batch_id, 3, idempotency_token="more", request_digest=B)
    assert refused.value.status["update_id"] == first["update_id"]
    assert refused.value.message == (f'idempotency token "more" was used for update {first["update_id"]} of batch '
                                     f"{batch_id} with a different request")
    row = await world.batch_row(batch_id)
    assert (row["n_updates"], row["n_reserved_jobs"]) == (2, 3)  # nothing more reserved
    # An update made before the migration is matched on its token alone.
    old = await world.store.create_update(batch_id, 1, idempotency_token="old")
    assert (await world.store.create_update(batch_id, 5, idempotency_token="old", request_digest=B)
            )["update_id"] == old["update_id"]
    assert await check_invariants(world.db) == []


async def test_a_rerun_token_with_another_digest_is_refused(world: World) -> None:
    batch_id = await failed_dag(world)
    first = await world.store.rerun_failed_jobs(batch_id, "r1", 2, request_digest=A)
    again = await world.store.rerun_failed_jobs(batch_id, "r1", 2, request_digest=A)
    assert (again["update_id"], again["message"]) == (first["update_id"], "exists")
    with pytest.raises(ConflictError) as refused:
        await world.store.rerun_failed_jobs(batch_id, "r1", 8, request_digest=B)
    assert refused.value.status["update_id"] == first["update_id"]
    assert "with a different request" in refused.value.message
    assert (await world.batch_row(batch_id))["n_updates"] == 2
    await world.store.commit_update(batch_id, int(first["update_id"]))
    assert await check_invariants(world.db) == []
