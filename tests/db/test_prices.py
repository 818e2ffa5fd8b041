"""Prices by product and version (migration 0023, set_product_rates, place_instance): a changed price is a
new resource version and bills only the attempts that start after it; an attempt is billed to its
instance's products; the price file never replaces a catalogue's price; the reservation estimate reads the
dearest active product."""

from __future__ import annotations

import pytest

from services.db.database import InvalidArgumentError, StaleEpochError
from services.db.invariants import check_invariants
from tests.world import World

CORE_HOUR = 1000 * 3_600_000  # mcpu-ms per core-hour
GIB_HOUR = 1024 * 3_600_000  # MiB-ms per GiB-hour
N2_SPOT = "cpu/gcp/n2-spot/us-central1", "memory/gcp/n2-spot/us-central1"


def rates(core_hour_usd: float, gib_hour_usd: float, products: tuple[str, str] = N2_SPOT) -> list[dict[str, object]]:
    return [{"product": products[0], "unit": "mcpu_ms", "rate_usd": core_hour_usd / CORE_HOUR},
            {"product": products[1], "unit": "mib_ms", "rate_usd": gib_hour_usd / GIB_HOUR}]


async def latest(world: World, product: str) -> dict[str, object]:
    row = await world.db.fetchone(
        "SELECT r.name, r.version, r.rate_usd, l.source, l.active FROM latest_product_versions l "
        "JOIN resources r ON r.resource_id = l.resource_id WHERE l.product = %s", (product,))
    assert row is not None
    return row


async def attempt_resources(world: World, batch_id: int, job_id: int, attempt: str) -> dict[str, int]:
    rows = await world.db.fetchall(
        "SELECT r.name, ar.quantity FROM attempt_resources ar JOIN resources r ON r.resource_id = ar.resource_id "
        "WHERE ar.batch_id = %s AND ar.job_id = %s AND ar.attempt_id = %s", (batch_id, job_id, attempt))
    return {r["name"]: int(r["quantity"]) for r in rows}


async def priced_spot_and_local(world: World) -> tuple[int, int]:
    """Priced N2 spot products, an instance billed to them (spot-1) and a local one (local-1), and a batch of
    three jobs of 2 cores and 3 GiB; returns the batch id and its first job id."""
    await world.store.set_product_rates(rates(0.03, 0.004), "file")
    await world.store.create_instance(world.epoch, "spot-1", "standard", 8000, "tok", region="us-central1",
                                      products=N2_SPOT)
    await world.store.activate_instance(world.epoch, "spot-1", "tok")
    await world.instance("local-1", cores_mcpu=8000)
    batch_id, _, start = await world.batch([{"cores_mcpu": 2000, "memory_bytes": 3 << 30}] * 3)
    return batch_id, start


async def test_the_migration_makes_the_local_prices_version_1_of_their_products(world: World) -> None:
    for product in ("cpu/local", "memory/local", "storage/local"):
        row = await latest(world, product)
        assert (row["name"], row["version"], row["source"], row["active"]) == (f"{product}/1", 1, "migration", 1)


async def test_a_new_product_is_version_1_an_equal_price_changes_nothing_a_new_price_is_version_2(
        world: World) -> None:
    changed = await world.store.set_product_rates(rates(0.03, 0.004), "file")
    assert [c["resource_name"] for c in changed] == [f"{N2_SPOT[0]}/1", f"{N2_SPOT[1]}/1"]
    assert all(c["previous_rate_usd"] is None for c in changed)
    assert await world.store.set_product_rates(rates(0.03, 0.004), "file") == []
    world.clock.advance(1000)
    changed = await world.store.set_product_rates(rates(0.03, 0.005), "gcp-catalog")
    assert [c["resource_name"] for c in changed] == [f"{N2_SPOT[1]}/2"]
    row = await latest(world, N2_SPOT[1])
    assert (row["version"], row["source"]) == (2, "gcp-catalog")
    assert row["rate_usd"] == pytest.approx(0.005 / GIB_HOUR)
    old = await world.db.fetchone("SELECT rate_usd FROM resources WHERE name = %s", (f"{N2_SPOT[1]}/1",))
    assert old is not None and old["rate_usd"] == pytest.approx(0.004 / GIB_HOUR)  # never updated in place


async def test_the_price_file_never_replaces_a_catalogue_price_but_corrects_its_own(world: World) -> None:
    await world.store.set_product_rates(rates(0.03, 0.004), "file")
    await world.store.set_product_rates(rates(0.02, 0.004), "file")  # a newer shipped file
    assert (await latest(world, N2_SPOT[0]))["version"] == 2
    await world.store.set_product_rates(rates(0.01, 0.004), "gcp-catalog")
    assert await world.store.set_product_rates(rates(0.03, 0.004), "file") == []  # a restart with the file
    row = await latest(world, N2_SPOT[0])
    assert (row["version"], row["source"]) == (3, "gcp-catalog")


async def test_active_products_are_the_deployments_and_price_the_reservations(world: World) -> None:
    await world.store.set_product_rates(rates(36.0, 3.6), "file", active_products=list(N2_SPOT))
    assert not (await latest(world, "cpu/local"))["active"]
    assert (await latest(world, N2_SPOT[0]))["active"]
    row = await world.db.fetchone("SELECT cpu_rate_usd, memory_rate_usd FROM reservation_rates")
    assert row is not None
    assert (row["cpu_rate_usd"], row["memory_rate_usd"]) == (pytest.approx(36.0 / CORE_HOUR),
                                                             pytest.approx(3.6 / GIB_HOUR))
    # Back to the local products: the estimate follows.
    await world.store.set_product_rates([], "file", active_products=["cpu/local", "memory/local"])
    row = await world.db.fetchone("SELECT cpu_rate_usd FROM reservation_rates")
    assert row is not None and row["cpu_rate_usd"] == pytest.approx(0.04 / CORE_HOUR)


@pytest.mark.parametrize("bad", [
    {"product": "cpu", "unit": "mcpu_ms", "rate_usd": 1e-11},  # no kind
    {"product": "cpu/x//y", "unit": "mcpu_ms", "rate_usd": 1e-11},
    {"product": "cpu/x/", "unit": "mcpu_ms", "rate_usd": 1e-11},
    {"product": "cpu/" + "x" * 120, "unit": "mcpu_ms", "rate_usd": 1e-11},
    {"product": "cpu/x", "unit": "core_hour", "rate_usd": 1e-11},
    {"product": "cpu/x", "unit": "mcpu_ms", "rate_usd": -1e-11},
    {"product": "cpu/x", "unit": "mcpu_ms", "rate_usd": 2.0},
    {"product": "cpu/x", "unit": "mcpu_ms"},
])
async def test_a_bad_rate_refuses_the_whole_call(world: World, bad: dict[str, object]) -> None:
    with pytest.raises(InvalidArgumentError):
        await world.store.set_product_rates([*rates(0.03, 0.004), bad], "file")
    assert await world.db.fetchone("SELECT 1 FROM latest_product_versions WHERE product = %s", (N2_SPOT[0],)) is None


async def test_too_many_rates_are_refused(world: World) -> None:
    many = [{"product": f"cpu/x/{i}", "unit": "mcpu_ms", "rate_usd": 1e-11} for i in range(1001)]
    with pytest.raises(InvalidArgumentError):
        await world.store.set_product_rates(many, "file")


async def test_an_attempt_is_billed_to_its_instances_products_at_the_price_in_force_as_it_starts(
        world: World) -> None:
    batch_id, start = await priced_spot_and_local(world)
    first = await world.run(batch_id, start, instance="spot-1", instance_products=True)
    on_local = await world.run(batch_id, start + 1, instance="local-1", instance_products=True)
    world.clock.advance(60_000)
    await world.store.set_product_rates(rates(0.06, 0.004), "gcp-catalog")  # the price doubles
    second = await world.run(batch_id, start + 2, instance="spot-1", instance_products=True)
    assert await attempt_resources(world, batch_id, start, first) == {f"{N2_SPOT[0]}/1": 2000,
                                                                       f"{N2_SPOT[1]}/1": 3072}
    assert await attempt_resources(world, batch_id, start + 1, on_local) == {"cpu/local/1": 2000,
                                                                            "memory/local/1": 3072}
    assert await attempt_resources(world, batch_id, start + 2, second) == {f"{N2_SPOT[0]}/2": 2000,
                                                                            f"{N2_SPOT[1]}/1": 3072}
    # The first attempt, billed after the change, still costs the old price.
    world.clock.advance(3_600_000)
    for job_id, attempt in ((start, first), (start + 2, second)):
        await world.finish(batch_id, job_id, attempt, "Success", instance="spot-1")
    cost = {int(r["job_id"]): float(r["cost"]) for r in await world.db.fetchall(
        "SELECT a.job_id, SUM(a.`usage` * r.rate_usd) AS cost FROM aggregated_job_resources a "
        "JOIN resources r ON r.resource_id = a.resource_id WHERE a.batch_id = %s GROUP BY a.job_id", (batch_id,))}
    memory_usd = 3 * 0.004
    assert cost[start] == pytest.approx((3_660_000 / 3_600_000) * (2 * 0.03 + memory_usd))
    assert cost[start + 2] == pytest.approx(2 * 0.06 + memory_usd)
    await check_invariants(world.db)


async def test_an_unpriced_instance_product_records_no_resource_and_a_named_resource_wins(world: World) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 8000, "tok", products=N2_SPOT)
    await world.store.activate_instance(world.epoch, "i1", "tok")
    await world.instance("local-1")
    batch_id, _, start = await world.batch([{}, {}, {}])
    unpriced = await world.run(batch_id, start, instance_products=True)
    assert await attempt_resources(world, batch_id, start, unpriced) == {}
    not_asked = await world.run(batch_id, start + 2, instance="local-1")  # without instance_products: none
    assert await attempt_resources(world, batch_id, start + 2, not_asked) == {}
    attempt = world.attempt_id()
    await world.store.schedule_jobs(world.epoch, "i1", [{"batch_id": batch_id, "job_id": start + 1,
                                                         "attempt_id": attempt}])
    await world.store.mark_jobs_started(world.epoch, "i1", [
        {"batch_id": batch_id, "job_id": start + 1, "attempt_id": attempt, "start_time_ms": world.clock(),
         "cpu_resource": "cpu/local/1"}])
    assert set(await attempt_resources(world, batch_id, start + 1, attempt)) == {"cpu/local/1"}


async def test_one_call_bills_each_attempt_to_its_own_instances_products(world: World) -> None:
    """The driver records several workers' starts in one MJS call: each row names its instance, whose
    products bill it, and a row naming an instance its attempt is not on is not_found."""
    batch_id, start = await priced_spot_and_local(world)
    refs = []
    for n, instance in enumerate(("spot-1", "local-1", "local-1")):
        ref = {"batch_id": batch_id, "job_id": start + n, "attempt_id": world.attempt_id()}
        await world.store.schedule_jobs(world.epoch, instance, [ref])
        refs.append(ref)
    status = await world.store.mark_jobs_started(world.epoch, None, [
        {**refs[0], "start_time_ms": world.clock(), "instance_name": "spot-1"},
        {**refs[1], "start_time_ms": world.clock(), "instance_name": "local-1"},
        {**refs[2], "start_time_ms": world.clock(), "instance_name": "spot-1"}], instance_products=True)
    assert [o["outcome"] for o in status["outcomes"]] == ["started", "started", "not_found"]
    assert await attempt_resources(world, batch_id, start, refs[0]["attempt_id"]) == {
        f"{N2_SPOT[0]}/1": 2000, f"{N2_SPOT[1]}/1": 3072}
    assert await attempt_resources(world, batch_id, start + 1, refs[1]["attempt_id"]) == {
        "cpu/local/1": 2000, "memory/local/1": 3072}
    assert await attempt_resources(world, batch_id, start + 2, refs[2]["attempt_id"]) == {}
    assert await check_invariants(world.db) == []


async def test_place_instance_records_where_the_cloud_put_the_machine(world: World) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 8000, "tok", region="us-central1",
                                      products=N2_SPOT)
    moved = ("cpu/gcp/n2-spot/europe-west4", "memory/gcp/n2-spot/europe-west4")
    await world.store.place_instance(world.epoch, "i1", "europe-west4", "n2-standard-8", moved)
    row = await world.db.fetchone("SELECT region, machine_type, cpu_product, memory_product FROM instances")
    assert row == {"region": "europe-west4", "machine_type": "n2-standard-8", "cpu_product": moved[0],
                   "memory_product": moved[1]}
    with pytest.raises(StaleEpochError):
        await world.store.place_instance(world.epoch - 1, "i1", "us-central1", None, N2_SPOT)
    await world.store.deactivate_instance(world.epoch, "i1", "test")
    await world.store.place_instance(world.epoch, "i1", "us-central1", None, N2_SPOT)  # ended: left as it is
    row = await world.db.fetchone("SELECT region FROM instances")
    assert row is not None and row["region"] == "europe-west4"
