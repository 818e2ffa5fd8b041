"""How the autoscaler reacts when a cloud refuses a machine: the refused instance ends at once, a region out
of quota is avoided while demand that may run anywhere moves on, and a permission error pauses the pool."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from services.db.database import ProcedureError
from services.db.invariants import check_invariants
from services.driver.autoscaler import Autoscaler
from services.driver.providers.errors import PermissionDenied, QuotaExceeded, TransientError
from services.policy.placement import Backoff, BackoffSettings
from tests.db.cloud_stub import StubCloud
from tests.world import World


class Seconds:
    """The autoscaler's back-off clock, moved by the test."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


BACKOFF = BackoffSettings(region=Backoff(60, 600), transient=Backoff(10, 100), configuration=Backoff(300, 3000))


@pytest.fixture
async def two_regions(world: World) -> list[str]:
    # As a deployment in two cloud regions lists them (docs/operations.md): 'local' is the local provider's.
    await world.db.execute("DELETE FROM regions")
    await world.db.execute("INSERT INTO regions (region_id, name) VALUES (0, 'east'), (1, 'west')")
    return ["east", "west"]


def autoscaler(world: World, cloud: StubCloud, clock: Seconds) -> Autoscaler:
    return Autoscaler(world.store, cloud, lambda: world.epoch, region="east", backoff=BACKOFF,
                      clock_s=clock)


def refusals(kind: str, region: str) -> float:
    return REGISTRY.get_sample_value("corral_driver_provider_refusals_total",
                                     {"pool": "standard", "region": region, "kind": kind}) or 0.0


async def instances(world: World) -> dict[str, dict]:
    rows = await world.db.fetchall("SELECT name, region, state, deactivation_reason FROM instances")
    return {r["name"]: r for r in rows}


async def test_quota_exhausted_in_one_region_moves_anywhere_jobs_to_another(world: World,
                                                                         two_regions: list[str]) -> None:
    batch_id, _, job_id = await world.batch([{"cores_mcpu": 1000}])  # may run in any region
    cloud, clock = StubCloud(), Seconds()
    cloud.refuse_in["east"] = QuotaExceeded("CPUS quota exceeded in east", region="east")
    scaler = autoscaler(world, cloud, clock)
    before = refusals("quota_exceeded", "east")
    await scaler.cycle()
    [refused] = cloud.creates
    assert refused.region == "east" and scaler.created == []
    row = (await instances(world))[refused.name]
    # Ended at once: it holds no capacity, and its token activates nothing.
    assert row["state"] == "inactive" and "quota_exceeded" in row["deactivation_reason"]
    with pytest.raises(ProcedureError):
        await world.store.activate_instance(world.epoch, refused.name, refused.activation_token)
    assert refusals("quota_exceeded", "east") == before + 1

    await scaler.cycle()  # the loop runs again at once after a refusal (it notified itself)
    assert [c.region for c in cloud.creates] == ["east", "west"]
    [created] = scaler.created
    assert (await instances(world))[created]["region"] == "west"
    # The job runs there.
    await world.store.activate_instance(world.epoch, created, cloud.machines[created].activation_token)
    await world.run(batch_id, job_id, instance=created)
    assert await world.state(batch_id, job_id) == "Running"
    assert await check_invariants(world.db) == []


async def test_jobs_that_may_run_only_in_the_refused_region_wait_until_its_backoff_ends(
        world: World, two_regions: list[str]) -> None:
    await world.batch([{"cores_mcpu": 1000, "regions": ["east"]}])
    cloud, clock = StubCloud(), Seconds()
    cloud.refuse_in["east"] = QuotaExceeded("no quota", region="east")
    scaler = autoscaler(world, cloud, clock)
    await scaler.cycle()
    clock.now_s += 59
    await scaler.cycle()
    assert [c.region for c in cloud.creates] == ["east"]  # not west: the job may not run there
    clock.now_s += 1
    await scaler.cycle()  # 60 s: east is tried again, refused again, and now avoided for 120 s
    clock.now_s += 119
    await scaler.cycle()
    assert [c.region for c in cloud.creates] == ["east", "east"]
    del cloud.refuse_in["east"]
    clock.now_s += 1
    await scaler.cycle()
    assert [c.region for c in cloud.creates] == ["east"] * 3 and len(scaler.created) == 1


async def test_permission_denied_pauses_the_pool_with_a_growing_backoff(world: World) -> None:
    await world.batch([{"cores_mcpu": 1000}])
    cloud, clock = StubCloud(), Seconds()
    cloud.refuse_all = PermissionDenied("compute.instances.create denied", region="local")
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, backoff=BACKOFF, clock_s=clock)
    await scaler.cycle()
    assert len(cloud.creates) == 1
    for _ in range(5):  # no retry every cycle
        clock.now_s += 50
        await scaler.cycle()
    assert len(cloud.creates) == 1
    clock.now_s += 50  # 300 s
    await scaler.cycle()
    assert len(cloud.creates) == 2
    clock.now_s += 599
    await scaler.cycle()
    assert len(cloud.creates) == 2  # the second wait is twice the first
    cloud.refuse_all = None
    clock.now_s += 1
    await scaler.cycle()
    assert len(cloud.creates) == 3 and len(scaler.created) == 1
    rows = await instances(world)
    assert sorted(r["state"] for r in rows.values()) == ["inactive", "inactive", "pending"]
    assert all("permission_denied" in r["deactivation_reason"] for r in rows.values() if r["state"] == "inactive")


async def test_a_transient_error_backs_off_briefly(world: World) -> None:
    await world.batch([{"cores_mcpu": 1000}])
    cloud, clock = StubCloud(), Seconds()
    cloud.refuse_all = TransientError("503 backend error")
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, backoff=BACKOFF, clock_s=clock)
    await scaler.cycle()
    clock.now_s += 9
    await scaler.cycle()
    assert len(cloud.creates) == 1
    cloud.refuse_all = None
    clock.now_s += 1
    await scaler.cycle()
    assert len(cloud.creates) == 2 and len(scaler.created) == 1


async def test_a_machine_only_for_jobs_that_may_run_anywhere_lets_the_provider_move_it(
        world: World, two_regions: list[str]) -> None:
    await world.batch([{"cores_mcpu": 1000}, {"cores_mcpu": 3000, "regions": ["west"]}])
    cloud = StubCloud()
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, region="east", any_region=True,
                        backoff=BACKOFF, clock_s=Seconds())
    await scaler.cycle()  # two 2-core machines ('standard' makes at most two a cycle): the most demand first
    assert [(c.region, c.any_region) for c in cloud.creates] == [("west", False), ("east", True)]


async def test_a_machine_the_cloud_put_in_another_region_is_recorded_and_billed_there(
        world: World, two_regions: list[str]) -> None:
    west = ("cpu/gcp/n2-ondemand/west", "memory/gcp/n2-ondemand/west")
    await world.store.set_product_rates([
        {"product": f"{kind}/gcp/n2-ondemand/{region}", "unit": unit, "rate_usd": 1e-11}
        for region in two_regions for kind, unit in (("cpu", "mcpu_ms"), ("memory", "mib_ms"))], "file")
    await world.batch([{"cores_mcpu": 1000}])  # may run in any region
    cloud, clock = StubCloud(), Seconds()
    cloud.gcp_prices, cloud.place_in["east"] = True, "west"
    scaler = autoscaler(world, cloud, clock)
    await scaler.cycle()
    [created] = scaler.created
    assert cloud.creates[0].region == "east"
    row = await world.db.fetchone("SELECT region, cpu_product, memory_product FROM instances WHERE name = %s",
                                  (created,))
    assert row == {"region": "west", "cpu_product": west[0], "memory_product": west[1]}
    assert await check_invariants(world.db) == []


async def test_a_machine_without_a_price_is_not_created_and_its_pool_waits(world: World,
                                                                             two_regions: list[str]) -> None:
    await world.batch([{"cores_mcpu": 1000}])
    cloud, clock = StubCloud(), Seconds()
    cloud.gcp_prices = True  # and no gcp product has a price
    scaler = autoscaler(world, cloud, clock)
    before = refusals("invalid_request", "east")
    await scaler.cycle()
    assert cloud.creates == [] and scaler.created == []
    [row] = (await instances(world)).values()
    assert row["state"] == "inactive" and "no price for cpu/gcp/n2-ondemand/east" in row["deactivation_reason"]
    assert refusals("invalid_request", "east") == before + 1
    clock.now_s += BACKOFF.configuration.initial_s - 1
    await scaler.cycle()
    assert len(await instances(world)) == 1  # the pool waits, as for any configuration error


async def test_the_clouds_regions_are_added_and_a_region_it_lacks_gets_no_machine(world: World) -> None:
    assert await world.store.add_regions(["us-central1", "europe-west4", "us-central1"]) == 2
    rows = await world.db.fetchall("SELECT name, preference FROM regions ORDER BY region_id")
    assert [(r["name"], r["preference"]) for r in rows] == [("local", None), ("europe-west4", 1),
                                                             ("us-central1", 0)]
    assert await world.store.add_regions(["europe-west4"]) == 0
    rows = await world.db.fetchall("SELECT region_id, name FROM regions ORDER BY region_id")
    assert [(r["region_id"], r["name"]) for r in rows] == [(0, "local"), (1, "europe-west4"), (2, "us-central1")]
    # The names' order is the cloud's preference; a region it was not given this time has none.
    rows = await world.db.fetchall("SELECT name, preference FROM regions ORDER BY region_id")
    assert [(r["name"], r["preference"]) for r in rows] == [("local", None), ("europe-west4", 0),
                                                             ("us-central1", None)]
    for bad in (["Bad Name"], [f"r{i}" for i in range(64)]):
        with pytest.raises(ProcedureError):
            await world.store.add_regions(bad)
    # Jobs bound to `local`, which the cloud does not have: no machine is asked for there.
    await world.batch([{"cores_mcpu": 1000, "regions": ["local"]}])
    cloud, clock = StubCloud(), Seconds()
    scaler = Autoscaler(world.store, cloud, lambda: world.epoch, region="us-central1", backoff=BACKOFF,
                        clock_s=clock, provider_regions=["us-central1", "europe-west4"])
    await scaler.cycle()
    assert [c.region for c in cloud.creates] == []


async def test_regions_beyond_the_63_bits_jobs_can_name_are_refused_whole(world: World) -> None:
    await world.store.add_regions([f"r{i}" for i in range(62)])  # with `local`: 63, every bit
    with pytest.raises(ProcedureError):
        await world.store.add_regions(["r62", "r0"])
    row = await world.db.fetchone("SELECT COUNT(*) AS n FROM regions")
    assert row is not None and row["n"] == 63
