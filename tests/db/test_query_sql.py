"""The SQL of the query language runs on MariaDB and selects what it says.

A small world of three batches (running with a success, a failure and a
ready job; cancelled and drained; complete and successful) is queried with
a representative set of queries of both kinds, and the ids returned are
compared with what each query means (services/frontend/query.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from services.frontend.query import parse, to_sql
from tests.world import World

EVIL = "x'); DROP TABLE batches; -- \\ %s %% \"é\""


@dataclasses.dataclass
class Scene:
    a: int  # alice, running: job 1 Success (60 s, billed), job 2 Failed (exit 1), job 3 Ready
    b: int  # bob, cancelled and drained: complete, its one job Cancelled
    c: int  # alice, complete: its one job succeeded (1 s, billed)
    a_jobs: tuple[int, int, int]


@pytest.fixture
async def scene(world: World) -> Scene:
    await world.instance()
    a, _, s = await world.batch(
        [{"attributes": [{"key": "name", "value": "step-1"}]},
         {"attributes": [{"key": "name", "value": "step-2"}, {"key": "note", "value": EVIL}]},
         {}],
        attributes={"name": "align run", "sample": "s-7", "odd": "100%_done"},
    )
    first = await world.run(a, s)
    await world.store.add_attempt_resources(
        world.epoch, [{"batch_id": a, "job_id": s, "attempt_id": first, "resource": "cpu/local/1", "quantity": 1000}]
    )
    world.clock.advance(60_000)
    assert await world.finish(a, s, first, "Success") == "completed"
    second = await world.run(a, s + 1)
    world.clock.advance(5_000)
    assert await world.finish(a, s + 1, second, "Failed") == "completed"

    b, _, _ = await world.batch([{}], user="bob", attributes={"name": "bob"})
    await world.store.cancel_job_group(b, 0, "bob", "not needed")
    assert await world.drain(b) == 1

    c, _, sc = await world.batch([{}])
    attempt = await world.run(c, sc)
    await world.store.add_attempt_resources(
        world.epoch, [{"batch_id": c, "job_id": sc, "attempt_id": attempt, "resource": "cpu/local/1", "quantity": 1000}]
    )
    world.clock.advance(1_000)
    assert await world.finish(c, sc, attempt, "Success") == "completed"
    return Scene(a, b, c, (s, s + 1, s + 2))


async def batches_matching(world: World, text: str) -> set[int]:
    sql, params = to_sql(parse(text, "batches"))
    rows = await world.db.fetchall(f"SELECT b.batch_id FROM batches b WHERE {sql}", tuple(params))
    return {int(row["batch_id"]) for row in rows}


async def jobs_matching(world: World, batch_id: int, text: str) -> set[int]:
    sql, params = to_sql(parse(text, "jobs"))
    rows = await world.db.fetchall(
        f"SELECT j.job_id FROM jobs j WHERE j.batch_id = %s AND {sql}", (batch_id, *params)
    )
    return {int(row["job_id"]) for row in rows}


BATCH_QUERIES = [
    ("", "abc"),
    ("state=open", ""),
    ("state=running", "a"),
    ("state=complete", "bc"),
    ("state=cancelled", "b"),
    ("state!=cancelled", "ac"),
    ("state=success", "c"),
    ("state!=success", "ab"),
    ("state=failure", "a"),
    ("user=alice", "ac"),
    ("user!=alice", "b"),
    ("billing_project=proj", "abc"),
    ("name=bob", "b"),
    ('name="align run"', "a"),
    ("name!=bob", "ac"),
    ("name=~lign", "a"),
    ("sample!~s-", "bc"),
    ("align", "a"),
    ("bo", "b"),
    ("_", "a"),  # a literal underscore, not LIKE's any-character
    ("%", "a"),
    ('"100%_done"', "a"),
    (f'"{EVIL.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"', ""),
    ("cost>0", "ac"),
    ("cost=0", "b"),
    ("cost<0.0001", "bc"),  # a: 60 s x 1000 mcpu x 1e-11 = 0.0006; c: 0.00001
    ("cost>=0.0006", "a"),
    ("duration>=0", "abc"),
    ("duration<0", ""),
    ("start_time>=2023-11-14", "abc"),
    ("start_time<2023-11-14T22:00:00Z", ""),
    ("end_time>2000-01-01", "bc"),
    ("end_time!=2000-01-01", "bc"),
    ("state=complete user=alice cost>0", "c"),
]


async def test_batch_queries(world: World, scene: Scene) -> None:
    # One scene for every query (a fresh database per query would cost a
    # second each); the mismatches are reported together.
    ids = {"a": scene.a, "b": scene.b, "c": scene.c}
    wrong = {}
    for text, expected in BATCH_QUERIES:
        got = await batches_matching(world, text)
        if got != {ids[x] for x in expected}:
            wrong[text] = (sorted(got), expected)
    assert wrong == {}


async def test_batch_id_comparisons(world: World, scene: Scene) -> None:
    assert await batches_matching(world, f"batch_id>{scene.a}") == {scene.b, scene.c}
    assert await batches_matching(world, f"batch_id<={scene.a}") == {scene.a}
    assert await batches_matching(world, f"batch_id!={scene.b}") == {scene.a, scene.c}


JOB_QUERIES = [
    ("", "123"),
    ("state=success", "1"),
    ("state=failed", "2"),
    ("state=ready", "3"),
    ("state=done", "12"),
    ("state=live", "3"),
    ("state!=done", "3"),
    ("exit_code>0", "2"),
    ("exit_code=0", "1"),
    ("exit_code!=0", "2"),  # no exit code yet matches no comparison
    ("name=step-1", "1"),
    ("name!=step-1", "23"),
    ("name=~step", "12"),
    ("step", "12"),
    (f'note="{EVIL.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"', "2"),
    ("note=~DROP", "2"),
    ("instance=i1", "12"),
    ("instance!=i1", "3"),
    ("duration>=60s", "1"),
    ("duration<10s", "2"),
    ("start_time>=2023-11-14", "12"),
    ("end_time<2000-01-01", ""),
    ("cost>0", "1"),
    ("cost<=0", "23"),
    ("job_group=0", "123"),
    ("job_group!=0", ""),
    ("user=alice", "123"),
    ("user=bob", ""),
    ("billing_project!=proj", ""),
    ("state=done instance=i1 exit_code=0", "1"),
]


async def test_job_queries(world: World, scene: Scene) -> None:
    jobs = {str(i + 1): job_id for i, job_id in enumerate(scene.a_jobs)}
    wrong = {}
    for text, expected in JOB_QUERIES:
        got = await jobs_matching(world, scene.a, text)
        if got != {jobs[x] for x in expected}:
            wrong[text] = (sorted(got), expected)
    assert wrong == {}


async def test_job_and_batch_id_comparisons(world: World, scene: Scene) -> None:
    first, second, third = scene.a_jobs
    assert await jobs_matching(world, scene.a, f"job_id>{first}") == {second, third}
    assert await jobs_matching(world, scene.a, f"batch_id={scene.a} job_id<={first}") == {first}
    assert await jobs_matching(world, scene.a, f"batch_id!={scene.a}") == set()


async def test_an_injection_attempt_reads_as_data(world: World, scene: Scene) -> None:
    for text in (f'user="{EVIL.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"', "'; --"):
        assert await batches_matching(world, text) == set()
    row = await world.db.fetchone("SELECT COUNT(*) AS n FROM batches")
    assert row is not None and row["n"] == 3
