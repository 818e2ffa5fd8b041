"""The price loop (services.driver.pricing.refresh) against the loopback Cloud Billing Catalog: the price
file's prices at start, the catalogue's replacing them, a price the catalogue changes becoming a new
resource version at the next refresh, and a catalogue that fails leaving the prices in force."""

from __future__ import annotations

from google.auth.credentials import AnonymousCredentials
from prometheus_client import REGISTRY

from services.driver.pricing.catalog_gcp import GcpCatalogSettings
from services.driver.pricing.catalogs import GcpCatalog
from services.driver.pricing.price_file import parse
from services.driver.pricing.products import Machine
from services.driver.pricing.refresh import PriceRefresh, RefreshSettings
from tests.clouds.gcp_billing_api import GcpBillingApi
from tests.clouds.test_price_catalogs import billing  # noqa: F401 - a fixture
from tests.world import World

N2 = Machine("gcp", "n2", False, "us-central1")
N2_SPOT = Machine("gcp", "n2", True, "us-central1")
FILE = parse({"as_of": "2026-11-01", "gcp": {"n2": {"us-central1": {
    "ondemand": {"core_hour_usd": 0.03, "gib_hour_usd": 0.004},
    "spot": {"core_hour_usd": 0.009, "gib_hour_usd": 0.0012}}}}})
CORE_HOUR = 1000 * 3_600_000
SETTINGS = RefreshSettings(refresh_s=3600, retry_s=300)


class Seconds:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def loopback_catalog(api: GcpBillingApi) -> GcpCatalog:
    """The GCP catalogue as services.driver.providers.cloud_setup.open_catalog makes it, without credentials."""
    return GcpCatalog(GcpCatalogSettings(api_endpoint=api.endpoint, credentials=AnonymousCredentials(), timeout_s=5.0))


async def core_price(world: World, machine: Machine) -> tuple[str, float, str]:
    row = await world.db.fetchone(
        "SELECT r.name, r.rate_usd, l.source FROM latest_product_versions l JOIN resources r "
        "ON r.resource_id = l.resource_id WHERE l.product = %s", (machine.cpu_product,))
    assert row is not None
    return row["name"], round(row["rate_usd"] * CORE_HOUR, 9), row["source"]


async def test_the_file_then_the_catalogue_then_a_changed_price_is_a_new_version(world: World,
                                                                                 billing: GcpBillingApi) -> None:
    clock = Seconds()
    loop = PriceRefresh(world.store, FILE, loopback_catalog(billing), {N2, N2_SPOT}, lambda: world.epoch, SETTINGS,
                        clock_s=clock)
    await loop.sync_file()  # what every driver does at start
    assert await core_price(world, N2) == (f"{N2.cpu_product}/1", 0.03, "file")
    await loop.cycle()  # leading: the catalogue's prices replace the file's
    assert await core_price(world, N2) == (f"{N2.cpu_product}/2", 0.031611, "gcp-catalog")
    assert await core_price(world, N2_SPOT) == (f"{N2_SPOT.cpu_product}/2", 0.007653, "gcp-catalog")
    assert loop.refreshed == 1

    billing.set_price("N2 Instance Core running in Americas", "0.0401")
    clock.now_s += SETTINGS.refresh_s - 1
    await loop.cycle()  # not due yet
    assert (await core_price(world, N2))[1] == 0.031611
    clock.now_s += 1
    await loop.cycle()
    assert await core_price(world, N2) == (f"{N2.cpu_product}/3", 0.0401, "gcp-catalog")
    assert (await core_price(world, N2_SPOT))[0] == f"{N2_SPOT.cpu_product}/2"  # unchanged: no new version
    # A restart: the file never replaces a catalogue's price.
    await loop.sync_file()
    assert (await core_price(world, N2))[0] == f"{N2.cpu_product}/3"


async def test_a_catalogue_that_fails_leaves_the_prices_and_is_tried_again_later(world: World,
                                                                                 billing: GcpBillingApi) -> None:
    clock = Seconds()
    loop = PriceRefresh(world.store, FILE, loopback_catalog(billing), {N2}, lambda: world.epoch, SETTINGS,
                        clock_s=clock)
    failures = REGISTRY.get_sample_value("corral_driver_price_refresh_failures_total",
                                         {"source": "gcp-catalog"}) or 0.0
    billing.fail("500")
    await loop.cycle()
    assert await core_price(world, N2) == (f"{N2.cpu_product}/1", 0.03, "file")
    assert REGISTRY.get_sample_value("corral_driver_price_refresh_failures_total",
                                     {"source": "gcp-catalog"}) == failures + 1
    billing.fail("")
    clock.now_s += SETTINGS.retry_s - 1
    await loop.cycle()
    assert loop.refreshed == 0
    clock.now_s += 1
    await loop.cycle()
    assert loop.refreshed == 1 and (await core_price(world, N2))[2] == "gcp-catalog"


async def test_a_standby_reads_no_catalogue(world: World, billing: GcpBillingApi) -> None:
    loop = PriceRefresh(world.store, FILE, loopback_catalog(billing), {N2}, lambda: None, SETTINGS)
    await loop.cycle()
    assert billing.calls() == [] and loop.refreshed == 0
