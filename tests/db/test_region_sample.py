"""The autoscaler makes machines in the regions of the jobs at the heads of the queues, the jobs the scheduler
looks at first, on the real database.

The design's deadlock with regions (hail-is/hail#13268) came from the autoscaler and the scheduler reading the
queue differently: machines were made for one region while the scheduler waited on the jobs of another; idle,
they left, and were made again in the same region. corral's autoscaler split a pool's demand by the regions of
its first 10,000 Ready jobs, in whatever order the database read them: a batch that fitted in that sample was
split in halves, and a tie went to the earlier region even when the other's jobs came first in the queue; and
the read's order (the primary key's, on a small table) put a later job of higher priority behind earlier ones.
Now it reads the heads of the users' queues as the scheduler does (`read_ready_heads`) and splits by them
(`placement.demand_by_region`). docs/architecture.md, "Regions: the design's deadlock".
"""

from __future__ import annotations

import pytest

from services.driver.autoscaler import Autoscaler
from tests.db.cloud_stub import StubCloud
from tests.world import World


@pytest.fixture
async def one_machine_two_regions(world: World) -> World:
    """east and west beside `local`; pool standard may have one machine."""
    await world.db.execute("INSERT INTO regions (region_id, name) VALUES (1, 'east'), (2, 'west')")
    await world.db.execute("UPDATE instance_collections SET max_instances = 1, max_live_instances = 1 "
                           "WHERE name = 'standard'")
    return world


LOOKED_AT = 4
"""The scheduler's jobs_per_cycle in these tests (300 by default): the jobs of a queue beyond it are not
looked at this cycle, by the scheduler or by the autoscaler."""


async def regions_made(world: World, cycles: int = 1) -> list[str]:
    cloud = StubCloud()
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, jobs_per_cycle=LOOKED_AT)
    for _ in range(cycles):
        await scaler.cycle()
    return [request.region for request in cloud.creates]


async def test_the_machine_goes_to_the_region_whose_jobs_come_first(one_machine_two_regions: World) -> None:
    world = one_machine_two_regions
    # As many jobs in each region, west's first: a tie of the whole queue went to east, the earlier region,
    # whose jobs the scheduler would not look at until west's had run.
    await world.batch([{"regions": ["west"]}] * LOOKED_AT + [{"regions": ["east"]}] * LOOKED_AT)
    assert await regions_made(world) == ["west"]


async def test_a_higher_priority_comes_first_whatever_the_job_ids(one_machine_two_regions: World) -> None:
    world = one_machine_two_regions
    await world.batch([{"regions": ["east"]}] * 30 + [{"regions": ["west"], "priority": 1}] * LOOKED_AT)
    assert await regions_made(world) == ["west"]


async def test_an_earlier_batch_comes_first(one_machine_two_regions: World) -> None:
    world = one_machine_two_regions
    await world.batch([{"regions": ["west"]}] * LOOKED_AT)
    await world.batch([{"regions": ["east"]}] * 20)
    assert await regions_made(world) == ["west"]


async def test_each_users_head_counts(one_machine_two_regions: World) -> None:
    """Two users whose queues start in different regions, room for two machines: one each, so neither waits
    for the other's queue to drain."""
    world = one_machine_two_regions
    await world.db.execute("UPDATE instance_collections SET max_instances = 2, max_live_instances = 2, "
                           "max_new_instances_per_loop = 2 WHERE name = 'standard'")
    await world.batch([{"regions": ["east"]}] * 4, user="alice")
    await world.batch([{"regions": ["west"]}] * 4, user="bob")
    assert sorted(await regions_made(world)) == ["east", "west"]
