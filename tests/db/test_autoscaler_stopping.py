"""Nothing starts a machine while the deployment stops (issue 36): a machine `corral up` started as it stopped
outlived it as a pending instance, and held its pool's cores for two minutes after the restart."""

from __future__ import annotations

from pathlib import Path

from services.driver.autoscaler import Autoscaler, Stopping
from tests.db.cloud_stub import StubCloud
from tests.world import World


async def test_no_machine_starts_while_the_stopping_file_exists_or_the_driver_stops(world: World,
                                                                                   tmp_path: Path) -> None:
    await world.batch([{"cores_mcpu": 1000}])  # Ready demand, no worker: a machine is wanted
    flag = tmp_path / "stopping"
    flag.touch()  # `corral up` began to stop
    cloud, stopping = StubCloud(), Stopping(flag)
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, stopping=stopping)
    await scaler.cycle()
    assert cloud.creates == [] and await world.db.fetchall("SELECT name FROM instances") == []

    flag.unlink()  # a new `corral up` on the same data directory
    await scaler.cycle()
    [created] = scaler.created

    stopping.begin()  # the driver's own stop (SIGTERM)
    await world.batch([{"cores_mcpu": 16000}] * 8)
    await scaler.cycle()
    assert scaler.created == [created] and [r.name for r in cloud.creates] == [created]


class StopsAfterLooking(Stopping):
    """Says nothing the first time it is asked (the cycle starts), then that the deployment stops."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def why(self) -> str | None:
        self.asked += 1
        return None if self.asked == 1 else "the deployment is stopping"


async def test_the_stop_is_asked_again_right_before_each_machine(world: World) -> None:
    # The demand a stop makes (its workers' jobs back to Ready) is read after the stop began: the look
    # before each machine, not the one at the cycle's start, is what keeps the machine from starting.
    await world.batch([{"cores_mcpu": 1000}])
    cloud, stopping = StubCloud(), StopsAfterLooking()
    await Autoscaler(world.store, cloud, lambda: world.epoch, stopping=stopping).cycle()
    assert stopping.asked == 2 and cloud.creates == []
    assert await world.db.fetchall("SELECT name FROM instances") == []
