"""The leader's queue and fleet gauges (services/driver/fleet_gauges.py) against a real MariaDB: a user's
series appear while they have work Ready or running, and go once it has all ended; a standby clears them."""

from __future__ import annotations

from services.driver.fleet_gauges import FleetGauges
from services.driver.metrics import READY_JOBS, RUNNING_JOBS, WORKERS
from tests.world import World


def series(gauge) -> dict[tuple[str, ...], float]:  # type: ignore[no-untyped-def]
    return {tuple(s.labels.values()): s.value for s in gauge.collect()[0].samples}


async def test_the_gauges_follow_the_queue_and_drop_users_whose_work_ended(world: World) -> None:
    leading = [True]
    gauges = FleetGauges(world.store, lambda: leading[0])
    await world.instance("i1")
    alice, _, a_start = await world.batch([{}, {}], user="alice")
    bob, _, b_start = await world.batch([{}], user="bob")
    await world.run(alice, a_start)

    await gauges.cycle()
    assert series(READY_JOBS) == {("standard", "alice"): 1, ("standard", "bob"): 1}
    assert series(RUNNING_JOBS) == {("standard", "alice"): 1, ("standard", "bob"): 0}
    assert series(WORKERS) == {("standard", "active"): 1}

    # Bob's job runs and ends: bob has nothing queued or running, and his series go.
    bob_attempt = await world.run(bob, b_start)
    assert await world.finish(bob, b_start, bob_attempt, "Success") == "completed"
    await gauges.cycle()
    assert set(series(READY_JOBS)) == set(series(RUNNING_JOBS)) == {("standard", "alice")}

    # A standby's gauges are empty: the leader's are the ones to read.
    leading[0] = False
    await gauges.cycle()
    assert series(READY_JOBS) == series(RUNNING_JOBS) == series(WORKERS) == {}
