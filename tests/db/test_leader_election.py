"""LeaderElection (services/driver/leader.py) against a real MariaDB: a standby
takes over once the leader's lease runs out, a clean shutdown hands over at
once, and a leader steps down by itself when its renewal is refused or when
it cannot renew within the lease. Short leases keep the tests short; nothing
here asserts how fast anything happened, only that it does within generous
bounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import pytest

from services.db.database import DatabaseConfig, StaleEpochError
from services.driver.leader import LeaderElection, LeaseSettings
from tests.world import World

SHORT = LeaseSettings(lease_s=1.0, renew_s=0.1)


async def eventually(predicate: Callable[[], object], timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"{what} not reached in {timeout_s} s"
        await asyncio.sleep(0.02)


class Campaign:
    """One driver's election running as a task, with a record of its callbacks."""

    def __init__(self, db_config: DatabaseConfig, name: str, events: list[tuple[str, str, int | None]],
                 settings: LeaseSettings = SHORT, monotonic: Callable[[], float] = time.monotonic):
        self.name = name
        self.election = LeaderElection(db_config, name, settings, monotonic=monotonic)
        self._events = events
        self.task: asyncio.Task[None] | None = None

    def start(self) -> Campaign:
        async def elected(epoch: int) -> None:
            self._events.append((self.name, "elected", epoch))

        async def deposed() -> None:
            self._events.append((self.name, "deposed", None))

        async def database_back() -> None:
            self._events.append((self.name, "database back", None))

        self.task = asyncio.create_task(self.election.run(elected, deposed, database_back))
        return self

    async def crash(self) -> None:
        """As if the process died: the campaign stops and gives nothing up."""
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


@pytest.fixture
async def campaigns(db_config: DatabaseConfig) -> AsyncIterator[Callable[..., Campaign]]:
    started: list[Campaign] = []
    events: list[tuple[str, str, int | None]] = []

    def start(name: str, **kwargs: object) -> Campaign:
        campaign = Campaign(db_config, name, events, **kwargs).start()  # type: ignore[arg-type]
        started.append(campaign)
        return campaign

    start.events = events  # type: ignore[attr-defined]
    try:
        yield start
    finally:
        for campaign in started:
            await campaign.election.resign()


async def test_one_leader_and_a_standby_takes_over_with_a_new_epoch_when_its_lease_runs_out(
        world: World, campaigns: Callable[..., Campaign]) -> None:
    first = campaigns("driver-a")
    await eventually(lambda: first.election.is_leader, what="a leader")
    second = campaigns("driver-b")
    await eventually(lambda: second.election.state.leader == "driver-a", what="the standby names the leader")
    assert not second.election.is_leader
    old_epoch = first.election.state.epoch
    assert old_epoch == world.epoch + 1

    # The leader's process dies: nothing is given up, the lease runs out by the database's clock.
    await first.crash()
    await eventually(lambda: second.election.is_leader, what="the standby leads")
    assert second.election.state.epoch == old_epoch + 1
    with pytest.raises(StaleEpochError):  # the dead leader's epoch writes nothing
        await world.store.create_instance(old_epoch, "i9", "standard", 1000, "t")
    await world.store.create_instance(old_epoch + 1, "i9", "standard", 1000, "t")
    assert campaigns.events == [("driver-a", "elected", old_epoch),  # type: ignore[attr-defined]
                                ("driver-b", "elected", old_epoch + 1)]


async def test_resigning_hands_over_at_once(world: World, campaigns: Callable[..., Campaign]) -> None:
    long_lease = LeaseSettings(lease_s=600.0, renew_s=0.1)
    first = campaigns("driver-a", settings=long_lease)
    await eventually(lambda: first.election.is_leader, what="a leader")
    second = campaigns("driver-b", settings=long_lease)
    await eventually(lambda: second.election.state.leader == "driver-a", what="the standby names the leader")
    await first.election.resign()
    assert not first.election.is_leader
    # Well within the 600 s lease: the lease was given up, not left to run out.
    await eventually(lambda: second.election.is_leader, what="the standby leads")


async def test_a_leader_deposed_by_force_steps_down_when_its_renewal_is_refused(
        world: World, campaigns: Callable[..., Campaign]) -> None:
    leader = campaigns("driver-a", settings=LeaseSettings(lease_s=600.0, renew_s=0.1))
    await eventually(lambda: leader.election.is_leader, what="a leader")
    epoch = leader.election.state.epoch
    forced = await world.store.elect_leader("operator")  # a newer epoch, by the administrator's hand
    await eventually(lambda: not leader.election.is_leader, what="the leader steps down")
    assert leader.election.step_downs[0].startswith("the renewal was refused: stale leader epoch")
    # The loops are told after the step-down has asked who leads now (a read): not at the same instant.
    await eventually(lambda: ("driver-a", "deposed", None) in campaigns.events,  # type: ignore[attr-defined]
                     what="the loops told it was deposed")
    # The forced epoch holds no lease: the driver campaigns again and leads under the next epoch.
    await eventually(lambda: leader.election.is_leader, what="leading again")
    assert (epoch, forced, leader.election.state.epoch) == (world.epoch + 1, world.epoch + 2, world.epoch + 3)


async def test_a_leader_that_cannot_renew_within_the_lease_stops_acting_on_its_own(
        world: World, campaigns: Callable[..., Campaign]) -> None:
    """The process is paused for longer than the lease (its monotonic clock jumps ahead, as after
    SIGSTOP/SIGCONT): the epoch its loops read is None at once, before the election's next look,
    which then steps down; the lease it last proved is still running by the database's clock, so it
    waits for it to run out like any standby, and leads again under a new epoch."""
    paused_s = 0.0

    def monotonic() -> float:
        return time.monotonic() + paused_s

    leader = campaigns("driver-a", settings=LeaseSettings(lease_s=3.0, renew_s=0.5), monotonic=monotonic)
    await eventually(lambda: leader.election.is_leader, what="a leader")
    epoch = leader.election.state.epoch
    paused_s = 3.0
    assert leader.election.state.epoch is None and leader.election.state.leader == ""
    await eventually(lambda: leader.election.step_downs, what="the leader steps down")
    assert leader.election.step_downs == ["could not renew the lease within 3 s"]
    await eventually(lambda: leader.election.is_leader, what="leading again")
    assert leader.election.state.epoch == epoch + 1  # type: ignore[operator]
    events = campaigns.events  # type: ignore[attr-defined]
    assert events == [("driver-a", "elected", epoch), ("driver-a", "deposed", None), ("driver-a", "elected", epoch + 1)]


def test_the_lease_must_outlast_two_renewals() -> None:
    LeaseSettings(lease_s=10.0, renew_s=5.0)
    for lease_s, renew_s in ((10.0, 6.0), (1.0, 0.0), (0.0, 0.0), (10.0, -1.0)):
        with pytest.raises(ValueError):
            LeaseSettings(lease_s=lease_s, renew_s=renew_s)
