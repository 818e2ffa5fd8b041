"""What the control plane's downtime may cost workers (issue 10): no worker
is declared dead for heartbeats it could not deliver (billing:
test_downtime_billing.py).

The dead-worker detector runs against the real database with the test's
clock; the election moment it counts deadlines from is what
LeaderElection.state.watching_since_ms says (an election, or the database
answering again), here set by the test."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.driver.dead_workers import DeadWorkerDetector
from services.driver.providers.local import LocalProvider
from tests.world import World

MIN_MS = 60_000
TIMEOUT_S = 30


def detector(world: World, tmp_path: Path, since: dict[str, int], live: set[str] | None = None) -> DeadWorkerDetector:
    """The detector of a leader elected (or back from a database outage) at since['ms']."""
    return DeadWorkerDetector(world.store, LocalProvider(lambda r: ["true"], tmp_path / "logs"),
                              lambda: live or set(), lambda: world.epoch, heartbeat_timeout_s=TIMEOUT_S,
                              clock_ms=world.clock, watching_since_ms=lambda: since["ms"])


async def heartbeat(world: World, instance: str, attempts: Sequence[dict[str, Any]] = ()) -> None:
    await world.store.heartbeat_rollup(world.epoch, instance, [{**a, "rollup_time_ms": world.clock()} for a in attempts])


async def test_after_an_election_every_worker_gets_a_full_deadline(world: World, tmp_path: Path) -> None:
    await world.instance("i1")
    await world.instance("i2")
    await heartbeat(world, "i1")
    await heartbeat(world, "i2")
    # No leader for 45 minutes (or the database was down): nobody could record a heartbeat.
    world.clock.advance(45 * MIN_MS)
    world.epoch = int((await world.store.acquire_leader_lease("driver-b", 10_000))["epoch"])
    since = {"ms": world.clock()}
    dead = detector(world, tmp_path, since)

    # Before the fix, this first cycle declared both dead: their last heartbeats were 45 minutes old.
    await dead.cycle()
    world.clock.advance(TIMEOUT_S * 1000 - 1)
    await dead.cycle()
    assert dead.deactivated == []
    # i1 reports in within its deadline; i2 never does and is declared dead a full deadline after the election.
    await heartbeat(world, "i1")
    world.clock.advance(1)
    await dead.cycle()
    assert dead.deactivated == ["i2"]
    rows = await world.db.fetchall("SELECT name, state, deactivation_reason FROM instances ORDER BY name")
    assert [(r["name"], r["state"], r["deactivation_reason"]) for r in rows] == [
        ("i1", "active", None), ("i2", "inactive", "missed heartbeats")]


async def test_after_a_database_outage_the_deadline_runs_from_its_end(world: World, tmp_path: Path) -> None:
    await world.instance("i1")
    await heartbeat(world, "i1")
    since = {"ms": world.clock()}  # elected now
    dead = detector(world, tmp_path, since)
    world.clock.advance(20_000)
    # The database is gone for a minute while this driver keeps its lease... then answers again.
    world.clock.advance(MIN_MS)
    since["ms"] = world.clock()
    await dead.cycle()
    world.clock.advance(TIMEOUT_S * 1000 - 1)
    await dead.cycle()
    assert dead.deactivated == []
    world.clock.advance(1)
    await dead.cycle()
    assert dead.deactivated == ["i1"]  # and then it is declared dead like any silent worker


async def test_a_worker_that_never_activated_gets_a_full_activation_deadline_too(world: World, tmp_path: Path) -> None:
    await world.store.create_instance(world.epoch, "p1", "standard", 1000, "tok")
    world.clock.advance(10 * MIN_MS)  # far past the 120 s activation deadline, but nobody was leading
    since = {"ms": world.clock()}
    dead = detector(world, tmp_path, since)
    await dead.cycle()
    assert dead.deactivated == []
    world.clock.advance(120_000)
    await dead.cycle()
    assert dead.deactivated == ["p1"]
