"""The digest of the image each attempt ran in (migration 0025): MJS records the worker's report once,
and keeps only a digest that is one (`sha256:` and 64 lowercase hex digits), so what `corral job` shows
as having run is never a worker's garbage."""

from __future__ import annotations

import pytest

from services.db.invariants import check_invariants
from tests.db.test_attempt_outcomes import attempt_row, schedule
from tests.db.test_retries import report
from tests.world import World

DIGEST = "sha256:" + "0123456789abcdef" * 4
OTHER = "sha256:" + "f" * 64


async def start(world: World, batch_id: int, job_id: int, attempt: str, instance: str = "i1",
                **reported: object) -> str:
    status = await world.store.mark_jobs_started(world.epoch, instance, [
        {"batch_id": batch_id, "job_id": job_id, "attempt_id": attempt, "start_time_ms": world.clock(),
         "isolation": "OCI container (runc)", **reported}])
    [outcome] = status["outcomes"]
    return str(outcome["outcome"])


async def test_a_start_records_the_digest_once(world: World) -> None:
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    assert await start(world, batch_id, job_id, attempt, image_digest=DIGEST) == "started"
    # A repeated start (the worker sent it again) changes nothing, whatever it says.
    assert await start(world, batch_id, job_id, attempt, image_digest=OTHER) == "already_started"
    assert (await attempt_row(world, batch_id, job_id, attempt))["image_digest"] == DIGEST
    assert await check_invariants(world.db) == []


async def test_each_attempt_keeps_the_digest_it_ran(world: World) -> None:
    """A retried job's attempts may run different images (a tag moved between them): each keeps its own."""
    await world.instance("i1")
    await world.instance("i2")
    batch_id, _, job_id = await world.batch([{}])
    first = await schedule(world, batch_id, job_id, "i1")
    await start(world, batch_id, job_id, first, "i1", image_digest=DIGEST)
    assert await report(world, batch_id, job_id, first, "Error", "system_error") == "retried"
    second = await schedule(world, batch_id, job_id, "i2")  # a system error retries away from i1
    await start(world, batch_id, job_id, second, "i2", image_digest=OTHER)
    assert [(await attempt_row(world, batch_id, job_id, a))["image_digest"] for a in (first, second)] == [DIGEST,
                                                                                                          OTHER]


@pytest.mark.parametrize("digest", [
    "",  # the process runtime pulls no image
    None,
    "sha256:" + "0123456789ABCDEF" * 4,  # upper case: not how a registry writes it
    "sha256:" + "0" * 63,
    "sha256:" + "0" * 65,
    "sha512:" + "0" * 128,
    "SHA256:" + "0" * 64,
    " " + DIGEST,
    DIGEST + "\n",
    "sha256:" + "0" * 64 + "x" * 10_000,
    "'; DROP TABLE attempts; --",
], ids=repr)
async def test_what_is_not_a_digest_is_recorded_as_none_and_the_start_still_counts(
        world: World, digest: str | None) -> None:
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    assert await start(world, batch_id, job_id, attempt, image_digest=digest) == "started"
    row = await attempt_row(world, batch_id, job_id, attempt)
    assert (row["image_digest"], row["start_time_ms"]) == (None, world.clock())


async def test_a_start_without_a_digest_records_none(world: World) -> None:
    """What a worker from before the field sends."""
    await world.instance()
    batch_id, _, job_id = await world.batch([{}])
    attempt = await schedule(world, batch_id, job_id)
    assert await start(world, batch_id, job_id, attempt) == "started"
    assert (await attempt_row(world, batch_id, job_id, attempt))["image_digest"] is None
