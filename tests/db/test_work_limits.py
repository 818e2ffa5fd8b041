"""Caps on work: jobs per batch, open jobs per user and per billing project,
children per job. A refused call raises the typed error (INVALID_ARGUMENT
for a shape, RESOURCE_EXHAUSTED for a quota), names the limit and its value
in its message, and writes nothing (every table's checksum is unchanged)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2

from services.common.errors import to_status
from services.db.database import Database, InvalidArgumentError, ResourceExhaustedError
from services.db.invariants import check_invariants
from services.db.store import JobStore
from tests.db.test_bad_input import snapshot
from tests.world import FakeClock, World, job_spec


async def refused(world: World, error: type[Exception], message: str, call: Any) -> None:
    before = await snapshot(world)
    with pytest.raises(error, match=message):
        await call
    assert await snapshot(world) == before


async def test_jobs_per_batch(world: World) -> None:
    batch_id, _, _ = await world.batch([{}] * 5)
    await refused(world, InvalidArgumentError, r"at most 8 jobs \(max_jobs_per_batch\); this one would have 9",
                  world.store.create_update(batch_id, 4, max_jobs_per_batch=8))
    # Reserved ids count, committed or not; the cap itself is allowed.
    await world.store.create_update(batch_id, 2, max_jobs_per_batch=8)
    await refused(world, InvalidArgumentError, "max_jobs_per_batch",
                  world.store.create_update(batch_id, 2, max_jobs_per_batch=8))
    await world.store.create_update(batch_id, 1, max_jobs_per_batch=8)
    # A repeat of an update that exists is answered whatever the limit now.
    update = await world.store.create_update(batch_id, 3, idempotency_token="t")
    again = await world.store.create_update(batch_id, 3, idempotency_token="t", max_jobs_per_batch=8)
    assert again["update_id"] == update["update_id"]
    # A new batch, before anything is written.
    await refused(world, InvalidArgumentError, "at most 1,000 jobs",
                  world.store.check_job_limits("alice", "proj", 1001, max_jobs_per_batch=1000))
    await world.store.check_job_limits("alice", "proj", 1000, max_jobs_per_batch=1000)


async def test_open_jobs_per_user(world: World) -> None:
    await world.instance()
    running, _, s = await world.batch([{}] * 10)
    for job_id in range(s, s + 3):
        await world.finish(running, job_id, await world.run(running, job_id), "Success")
    # Not counted: a complete batch. Counted: an open batch's reservation.
    done, _, d = await world.batch([{}])
    await world.finish(done, d, await world.run(done, d), "Success")
    empty = int((await world.store.create_batch("alice", "proj"))["batch_id"])
    await world.store.create_update(empty, 2)
    # alice: 7 + 2 open; bob's count is his own.
    await world.batch([{}] * 6, user="bob")

    await refused(world, ResourceExhaustedError,
                  r"user alice has 9 open jobs; 4 more would pass the limit \(max_open_jobs_per_user\) of 12",
                  world.store.create_update(empty, 4, max_open_jobs_per_user=12))
    await refused(world, ResourceExhaustedError, "max_open_jobs_per_user",
                  world.store.check_job_limits("alice", "proj", 4, max_open_jobs_per_user=12))
    await world.store.create_update(empty, 3, max_open_jobs_per_user=12)
    # A cancelled batch counts only its committed jobs that are not done yet:
    # nothing more can be committed to it.
    await world.store.cancel_job_group(empty, 0, "alice", "stop")
    await world.store.check_job_limits("alice", "proj", 5, max_open_jobs_per_user=12)
    await world.store.cancel_job_group(running, 0, "alice", "stop")
    assert await world.drain(running) == 7
    await world.store.check_job_limits("alice", "proj", 12, max_open_jobs_per_user=12)
    # A retry of CreateBatch (the batch exists for its token) passes.
    created = await world.store.create_batch("alice", "proj", idempotency_token="mine")
    await world.store.create_update(int(created["batch_id"]), 12)
    await world.store.check_job_limits("alice", "proj", 12, "mine", max_open_jobs_per_user=12)
    assert await check_invariants(world.db) == []


async def test_open_jobs_per_billing_project(world: World) -> None:
    await world.batch([{}] * 6, user="bob")
    batch_id, _, _ = await world.batch([{}] * 3)
    await refused(world, ResourceExhaustedError,
                  r"billing project proj has 9 open jobs; 2 more would pass the limit "
                  r"\(max_open_jobs_per_billing_project\) of 10",
                  world.store.create_update(batch_id, 2, max_open_jobs_per_billing_project=10))
    await world.store.create_update(batch_id, 1, max_open_jobs_per_billing_project=10)
    await world.store.create_billing_project("other", ["alice"])
    await world.store.check_job_limits("alice", "other", 10, max_open_jobs_per_billing_project=10)
    # Somebody who may not submit to the project learns nothing of it here
    # (create_batch refuses them).
    await world.store.check_job_limits("mallory", "proj", 10, max_open_jobs_per_billing_project=10)


async def test_children_per_job(world: World) -> None:
    batch_id, _, s = await world.batch([{}, *({"parents": [{"in_update_offset": -i}]} for i in range(1, 4))])
    update = await world.store.create_update(batch_id, 4)
    t = int(update["start_job_id"])
    bunch = [job_spec(t, parents=[{"job_id": s}]), job_spec(t + 1, parents=[{"job_id": s + 1}]),
             job_spec(t + 2, parents=[{"job_id": s}])]
    await refused(world, InvalidArgumentError,
                  f"job {s} would have 5 children; the limit \\(max_children_per_job\\) is 4",
                  world.store.insert_jobs(batch_id, update["update_id"], bunch, max_children_per_job=4))
    await world.store.insert_jobs(batch_id, update["update_id"], bunch[:2], max_children_per_job=4)
    # Within one bunch too, and for a parent in the same update.
    await refused(world, InvalidArgumentError, f"job {t} would have 2 children",
                  world.store.insert_jobs(batch_id, update["update_id"], [
                      job_spec(t + 2, parents=[{"job_id": t}]), job_spec(t + 3, parents=[{"job_id": t}])],
                      max_children_per_job=1))


async def test_reruns_are_capped_too(world: World) -> None:
    await world.instance()
    batch_id, _, s = await world.batch([{}, {"parents": [{"in_update_offset": -1}]},
                                        {"parents": [{"in_update_offset": -2}]}])
    await world.finish(batch_id, s, await world.run(batch_id, s), "Success")
    for job_id in (s + 1, s + 2):
        await world.finish(batch_id, job_id, await world.run(batch_id, job_id), "Failed")
    await refused(world, InvalidArgumentError, "max_jobs_per_batch",
                  world.store.rerun_failed_jobs(batch_id, "r", 2, max_jobs_per_batch=4))
    await refused(world, ResourceExhaustedError, "max_open_jobs_per_user",
                  world.store.rerun_failed_jobs(batch_id, "r", 2, max_open_jobs_per_user=1))
    await refused(world, InvalidArgumentError, f"job {s} would have 4 children",
                  world.store.rerun_failed_jobs(batch_id, "r", 2, max_children_per_job=3))
    status = await world.store.rerun_failed_jobs(batch_id, "r", 2, max_jobs_per_batch=5, max_open_jobs_per_user=2,
                                                 max_children_per_job=4)
    assert status["n_jobs"] == 2


async def test_bunches_and_reruns_share_one_fan_out_check_on_one_connection(one_connection: Database,
                                                                            clock: FakeClock) -> None:
    """insert_jobs and rerun_failed_jobs both ask fan_out_check (over their own tmp_new_edges, which differ in
    columns), one after the other on one connection, refusing and passing in turn: the check read from the
    routine cache sees each caller's table as it is."""
    world = await World(one_connection, JobStore(one_connection, clock), clock).setup()
    await world.instance()
    batch_id, _, s = await world.batch([{}, {"parents": [{"in_update_offset": -1}]},
                                        {"parents": [{"in_update_offset": -2}]}])
    await world.finish(batch_id, s, await world.run(batch_id, s), "Success")
    for job_id in (s + 1, s + 2):
        await world.finish(batch_id, job_id, await world.run(batch_id, job_id), "Failed")
    update = await world.store.create_update(batch_id, 3)
    t = int(update["start_job_id"])
    for _ in range(2):
        await refused(world, InvalidArgumentError, f"job {s} would have 3 children; the limit "
                                                   r"\(max_children_per_job\) is 2",
                      world.store.insert_jobs(batch_id, update["update_id"], [job_spec(t, parents=[{"job_id": s}])],
                                              max_children_per_job=2))
        await refused(world, InvalidArgumentError, f"job {s} would have 4 children",
                      world.store.rerun_failed_jobs(batch_id, "r", 2, max_children_per_job=3))
    await world.store.insert_jobs(batch_id, update["update_id"], [job_spec(t, parents=[{"job_id": s}])],
                                  max_children_per_job=3)
    status = await world.store.rerun_failed_jobs(batch_id, "r", 2, max_children_per_job=5)
    assert status["n_jobs"] == 2
    await world.store.insert_jobs(batch_id, update["update_id"], [job_spec(t + 1)], max_children_per_job=1)
    assert await check_invariants(world.db) == []


def test_a_quota_is_resource_exhausted_with_a_quota_failure() -> None:
    status = to_status(ResourceExhaustedError("user alice has 9 open jobs", rc=7))
    assert status is not None
    assert status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    failure = error_details_pb2.QuotaFailure()
    assert status.details[0].Unpack(failure)
    assert failure.violations[0].description == "user alice has 9 open jobs"
