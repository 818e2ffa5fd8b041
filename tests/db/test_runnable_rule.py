"""The one source of "this job group is cancelled, itself or through an ancestor": the view
job_groups_cancelled_self_or_ancestor (migration 0024), which the procedures ask in their copies of the
may-this-job-run rule (tests/unit/test_runnable_rule.py holds those to one text). It must stay a merged
view: materialized, every lookup would build every cancelled group of every batch first."""

from __future__ import annotations

from tests.world import World

VIEW = "job_groups_cancelled_self_or_ancestor"


async def test_a_group_is_cancelled_by_itself_or_an_ancestor(world: World) -> None:
    # Groups with Ready jobs (a finished group is not cancelled: cancel_job_group records nothing).
    batch_id, _, _ = await world.batch([{"job_group_id": g} for g in (1, 2, 3)],
                                       groups=[{"job_group_id": 1, "parent_id": 0}, {"job_group_id": 2, "parent_id": 1},
                                               {"job_group_id": 3, "parent_id": 0}])
    other, _, _ = await world.batch([{"job_group_id": 1}], groups=[{"job_group_id": 1, "parent_id": 0}])

    async def rows() -> set[tuple[int, int, int]]:
        return {(r["batch_id"], r["job_group_id"], r["cancelled_group_id"])
                for r in await world.db.fetchall(f"SELECT * FROM {VIEW}")}

    assert await rows() == set()
    await world.store.cancel_job_group(batch_id, 1, "alice", "test")
    assert await rows() == {(batch_id, 1, 1), (batch_id, 2, 1)}
    await world.store.cancel_job_group(other, 0, "alice", "test")  # a batch is its group 0
    assert await rows() == {(batch_id, 1, 1), (batch_id, 2, 1), (other, 0, 0), (other, 1, 0)}


async def test_the_view_is_merged_into_the_statements_that_ask_it(world: World) -> None:
    [row] = await world.db.fetchall("SELECT algorithm FROM information_schema.views "
                                    "WHERE table_schema = DATABASE() AND table_name = %s", (VIEW,))
    assert row["algorithm"] == "MERGE"
    # As the cancellers and schedule_jobs ask it: the view's two tables are read in the statement's own
    # plan (a semi-join or a dependent subquery), never a derived table built first.
    for sql in (f"SELECT j.job_id FROM jobs j WHERE j.batch_id = 1 AND j.job_group_id IN "
                f"(SELECT x.job_group_id FROM {VIEW} x WHERE x.batch_id = 1)",
                f"SELECT j.job_id FROM jobs j WHERE EXISTS "
                f"(SELECT 1 FROM {VIEW} x WHERE x.batch_id = j.batch_id AND x.job_group_id = j.job_group_id)"):
        plan = await world.db.fetchall("EXPLAIN " + sql)
        assert {r["table"] for r in plan} >= {"a", "c"}, plan
        assert "DERIVED" not in {r["select_type"] for r in plan}, plan
