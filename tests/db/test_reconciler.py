"""The reconciler (services.driver.reconciler): a machine the cloud runs with no live instance is deleted
after its grace period; a live instance whose machine is gone is deactivated and its jobs run again."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client import REGISTRY

from services.common.processes import PidFiles
from services.db.invariants import check_invariants
from services.driver.providers.interface import InstanceRequest
from services.driver.providers.local import LocalProvider
from services.driver.reconciler import InstanceReconciler, ReconcileSettings
from tests.db.cloud_stub import StubCloud
from tests.world import World

GRACE = ReconcileSettings(period_s=1, vanished_grace_s=120, orphan_grace_s=300)


def reconciled(action: str) -> float:
    return REGISTRY.get_sample_value("corral_driver_instances_reconciled_total", {"action": action}) or 0.0


def machine(name: str) -> InstanceRequest:
    return InstanceRequest(name, "standard", 2000, 0, "local", "t")


async def test_an_orphan_is_deleted_only_after_its_grace_period(world: World) -> None:
    cloud = StubCloud()
    await world.instance("known")  # active: its machine is not an orphan
    await world.instance("ended")
    await world.store.deactivate_instance(world.epoch, "ended", "missed heartbeats")  # its delete failed
    for name in ["known", "ended", "stranger"]:
        cloud.machines[name] = machine(name)
    reconciler = InstanceReconciler(world.store, cloud, lambda: world.epoch, GRACE, clock_ms=world.clock)
    before = reconciled("orphan_deleted")
    await reconciler.cycle()
    world.clock.advance(299_000)
    await reconciler.cycle()
    assert cloud.deletes == []
    world.clock.advance(1_000)
    await reconciler.cycle()
    assert sorted(cloud.deletes) == ["ended", "stranger"] and set(cloud.machines) == {"known"}
    assert reconciled("orphan_deleted") == before + 2
    assert await world.store.instance_state("known") == "active"


async def test_an_orphans_grace_starts_again_with_a_new_leader(world: World) -> None:
    cloud = StubCloud()
    cloud.machines["stranger"] = machine("stranger")
    epoch: list[int | None] = [world.epoch]
    reconciler = InstanceReconciler(world.store, cloud, lambda: epoch[0], GRACE, clock_ms=world.clock)
    await reconciler.cycle()
    world.clock.advance(200_000)
    epoch[0] = None  # deposed: a standby does nothing and forgets
    await reconciler.cycle()
    world.clock.advance(200_000)
    assert cloud.deletes == []
    epoch[0] = world.epoch
    await reconciler.cycle()  # 400 s after it was first seen, but this leader sees it for the first time
    assert cloud.deletes == []
    world.clock.advance(300_000)
    await reconciler.cycle()
    assert cloud.deletes == ["stranger"]


async def test_a_vanished_instance_is_deactivated_and_its_job_runs_again(world: World) -> None:
    cloud = StubCloud()
    await world.instance("i1", cores_mcpu=4000)
    await world.instance("spot", cores_mcpu=4000)
    await world.db.execute("UPDATE instances SET preemptible = TRUE WHERE name = 'spot'")
    cloud.machines["spot"] = machine("spot")
    batch_id, _, job_id = await world.batch([{}, {}])
    first = await world.run(batch_id, job_id)
    spot_attempt = await world.run(batch_id, job_id + 1, instance="spot")
    reconciler = InstanceReconciler(world.store, cloud, lambda: world.epoch, GRACE, clock_ms=world.clock)
    before = reconciled("vanished_deactivated")
    await reconciler.cycle()
    world.clock.advance(119_000)
    await reconciler.cycle()
    assert reconciler.deactivated == []  # young: its machine may still be being created
    world.clock.advance(1_000)
    await reconciler.cycle()
    assert reconciler.deactivated == ["i1"] and reconciled("vanished_deactivated") == before + 1
    assert await world.store.instance_state("i1") == "inactive" and await world.store.instance_state("spot") == "active"
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["attempt_id"]) == ("Ready", first)
    attempt = await world.db.fetchone("SELECT reason FROM attempts WHERE batch_id = %s AND job_id = %s AND "
                                      "attempt_id = %s", (batch_id, job_id, first))
    assert attempt is not None and attempt["reason"] == "worker_lost"
    await world.instance("i2")
    second = await world.run(batch_id, job_id, instance="i2")
    assert second != first and (await world.job(batch_id, job_id))["n_attempts"] == 2
    # A spot machine gone is a preemption.
    del cloud.machines["spot"]
    await reconciler.cycle()
    attempt = await world.db.fetchone("SELECT reason FROM attempts WHERE batch_id = %s AND job_id = %s AND "
                                      "attempt_id = %s", (batch_id, job_id + 1, spot_attempt))
    assert attempt is not None and attempt["reason"] == "preempted"
    assert await check_invariants(world.db) == []


async def test_a_vanished_instances_grace_starts_again_with_a_new_leader(world: World) -> None:
    """A new leader cannot tell how long ago its predecessor began creating a machine the cloud does not list
    yet: it gives a whole grace from when it began to lead, as it does an orphan; a machine it knows ended
    does not wait."""
    cloud = StubCloud()
    await world.instance("unlisted")
    await world.instance("ended")
    cloud.ended.add("ended")
    world.clock.advance(10**6)  # both far older than the grace
    elected_ms = world.clock()
    reconciler = InstanceReconciler(world.store, cloud, lambda: world.epoch, GRACE, clock_ms=world.clock,
                                    watching_since_ms=lambda: elected_ms)
    await reconciler.cycle()
    assert reconciler.deactivated == ["ended"]
    world.clock.advance(119_000)
    await reconciler.cycle()
    assert reconciler.deactivated == ["ended"]
    world.clock.advance(1_000)
    await reconciler.cycle()
    assert reconciler.deactivated == ["ended", "unlisted"]


async def test_a_standby_does_nothing(world: World) -> None:
    cloud = StubCloud()
    await world.instance("i1")
    cloud.machines["stranger"] = machine("stranger")
    reconciler = InstanceReconciler(world.store, cloud, lambda: None,
                                    ReconcileSettings(vanished_grace_s=0, orphan_grace_s=0), clock_ms=world.clock)
    world.clock.advance(10**6)
    await reconciler.cycle()
    assert cloud.deletes == [] and await world.store.instance_state("i1") == "active"


async def test_the_local_provider_lists_workers_another_driver_started(tmp_path: Path) -> None:
    """After a failover the new leader's local provider has started nothing itself: the workers its
    predecessor recorded in the shared pid files are alive all the same, not vanished."""
    pids = PidFiles(tmp_path / "pids")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    old = LocalProvider(lambda request: sleeper, tmp_path / "logs", pid_files=pids)
    new = LocalProvider(lambda request: sleeper, tmp_path / "logs", pid_files=pids)
    try:
        await old.create(machine("w1"))
        assert await new.alive() == {"w1"}
        await new.delete("w1")  # stopped by its pid file
        assert await new.alive() == set() and await old.alive() == set()
    finally:
        await old.close()


async def test_an_instance_whose_machine_has_ended_is_deactivated_at_once(world: World) -> None:
    """Issue 36: a restarted `corral up` waited for its predecessor's instances to miss their heartbeats or
    never activate. An instance whose machine the provider knows has ended (a local worker process that is
    gone) ends at once, young or not; one merely not listed yet (being created) still waits for its grace."""
    cloud = StubCloud()
    await world.instance("ended", cores_mcpu=4000)
    await world.store.create_instance(world.epoch, "booting", "standard", 4000, "tok-booting")
    cloud.ended.add("ended")
    batch_id, _, job_id = await world.batch([{}])
    first = await world.run(batch_id, job_id, instance="ended")
    woken: list[str] = []
    reconciler = InstanceReconciler(world.store, cloud, lambda: world.epoch, GRACE, clock_ms=world.clock,
                                    on_deactivated=lambda: woken.append("scheduler and autoscaler"))
    await reconciler.cycle()
    assert reconciler.deactivated == ["ended"] and woken == ["scheduler and autoscaler"]
    row = await world.db.fetchone("SELECT state, deactivation_reason FROM instances WHERE name = 'ended'")
    assert row == {"state": "inactive", "deactivation_reason": "its machine has ended"}
    assert await world.store.instance_state("booting") == "pending"
    job = await world.job(batch_id, job_id)
    assert (job["state"], job["attempt_id"]) == ("Ready", first)
    attempt = await world.db.fetchone("SELECT reason FROM attempts WHERE batch_id = %s AND job_id = %s AND "
                                      "attempt_id = %s", (batch_id, job_id, first))
    assert attempt is not None and attempt["reason"] == "worker_lost"
    await reconciler.cycle()
    assert woken == ["scheduler and autoscaler"]  # nothing more ended: nobody woken
    assert await check_invariants(world.db) == []


async def test_the_local_provider_knows_which_of_its_workers_have_ended(tmp_path: Path) -> None:
    """The workers of an earlier `corral up` (ended with it) are gone; a running worker, and one this data
    directory's drivers never started (being created, or another data directory's), are not known gone."""
    pids = PidFiles(tmp_path / "pids")
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    earlier = LocalProvider(lambda request: sleeper, tmp_path / "logs", pid_files=pids)
    await earlier.create(machine("w1"))
    await earlier.close()  # as `corral up` stops, or its next start ends what a killed one left
    restarted = LocalProvider(lambda request: sleeper, tmp_path / "logs", pid_files=pids)
    try:
        await restarted.create(machine("w2"))
        assert await restarted.alive() == {"w2"}
        assert await restarted.gone(["w1", "w2", "stranger"]) == {"w1"}
        standby = LocalProvider(lambda request: sleeper, tmp_path / "logs", pid_files=pids)
        assert await standby.gone(["w1", "w2"]) == {"w1"}  # w2 runs: its pid file says so
    finally:
        await restarted.close()
