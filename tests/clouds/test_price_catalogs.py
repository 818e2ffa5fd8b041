"""The price catalogues' clients against loopback servers that speak the documented APIs: Cloud Billing's
Catalog API through google-cloud-billing's real CloudCatalogClient (REST), and the Azure Retail Prices API
through aiohttp over HTTPS with a test CA. What they find, how they page, and that every way of failing is
CatalogUnavailable within the deadline."""

from __future__ import annotations

import dataclasses
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials

from services.common.tls import DevCertificateAuthority
from services.driver.pricing.catalog_azure import (API_VERSION, AzureRetailSettings, azure_prices,
                                                   azure_retail_settings)
from services.driver.pricing.catalog_errors import CatalogUnavailable
from services.driver.pricing.catalog_gcp import COMPUTE_ENGINE, GcpCatalogSettings, gcp_catalog_settings, gcp_prices
from services.driver.pricing.catalogs import AzureCatalog
from services.driver.pricing.price_file import AzureSize
from services.driver.pricing.products import Machine, MachinePrice, split_vm_price
from services.driver.providers.azure_config import AzureConfig, ImageReference, WorkerBootSettings
from services.driver.providers.gcp_config import GcpConfig, GcpRegion, WorkerBoot
from tests.clouds.azure_prices_api import AzurePricesApi
from tests.clouds.gcp_billing_api import GcpBillingApi

N2 = Machine("gcp", "n2", False, "us-central1")
N2_SPOT = Machine("gcp", "n2", True, "us-central1")
N2_BELGIUM = Machine("gcp", "n2", False, "europe-west1")
N2_SPOT_BELGIUM = Machine("gcp", "n2", True, "europe-west1")
D4 = Machine("azure", "Standard_D4s_v5", False, "westeurope")
D4_SPOT = Machine("azure", "Standard_D4s_v5", True, "westeurope")
D4_NORTH = Machine("azure", "Standard_D4s_v5", False, "northeurope")
D4_SPOT_NORTH = Machine("azure", "Standard_D4s_v5", True, "northeurope")
DSV5 = "Virtual Machines DSv5 Series"


# -- GCP ---------------------------------------------------------------------------------------------------


@pytest.fixture
def billing() -> Iterator[GcpBillingApi]:
    api = GcpBillingApi(hang_s=10.0)
    api.start()
    try:
        yield api
    finally:
        api.stop()
    assert api.violations == [], "requests that do not fit the documented method"


def gcp_settings(api: GcpBillingApi, **changes: Any) -> GcpCatalogSettings:
    return dataclasses.replace(GcpCatalogSettings(api_endpoint=api.endpoint, credentials=AnonymousCredentials(),
                                                  timeout_s=5.0), **changes)


async def test_gcp_on_demand_and_spot_n2_in_two_regions(billing: GcpBillingApi) -> None:
    wanted = [N2, N2_SPOT, N2_BELGIUM, N2_SPOT_BELGIUM, Machine("gcp", "n2d", False, "us-east1"),
              Machine("gcp", "n2", False, "asia-east1"), Machine("gcp", "e2", True, "us-central1"), D4]
    assert await gcp_prices(gcp_settings(billing), wanted) == {
        N2: MachinePrice(0.031611, 0.004237), N2_SPOT: MachinePrice(0.007653, 0.001026),
        N2_BELGIUM: MachinePrice(0.034773, 0.004661), N2_SPOT_BELGIUM: MachinePrice(0.008418, 0.001128),
        Machine("gcp", "n2d", False, "us-east1"): MachinePrice(0.027502, 0.003686)}
    # asia-east1 has no N2 SKU here, E2 no Spot SKU, and an Azure machine is not GCP's to price.


async def test_gcp_request_has_the_documented_shape(billing: GcpBillingApi) -> None:
    await gcp_prices(gcp_settings(billing), [N2])
    [call] = billing.calls()
    assert call.path == f"/v1/{COMPUTE_ENGINE}/skus"
    assert call.query["currencyCode"] == ["USD"] and call.query["pageSize"] == ["5000"]
    assert "pageToken" not in call.query
    assert "authorization" not in {k.lower() for k in call.headers}  # anonymous credentials send none


async def test_gcp_needs_both_the_core_and_the_memory_price(billing: GcpBillingApi) -> None:
    gone = "Spot Preemptible N2 Instance Ram running in Belgium"
    billing.skus = [s for s in billing.skus if s["description"] != gone]
    found = await gcp_prices(gcp_settings(billing), [N2_BELGIUM, N2_SPOT_BELGIUM])
    assert set(found) == {N2_BELGIUM}


async def test_gcp_pages_are_followed_and_bounded(billing: GcpBillingApi) -> None:
    whole = await gcp_prices(gcp_settings(billing), [N2, N2_SPOT_BELGIUM])
    paged = GcpBillingApi(page_size=4)
    paged.start()
    try:
        assert await gcp_prices(gcp_settings(paged), [N2, N2_SPOT_BELGIUM]) == whole
        calls = paged.calls()
        assert len(calls) == -(-len(paged.skus) // 4)
        assert [bool(c.query.get("pageToken")) for c in calls] == [False] + [True] * (len(calls) - 1)
        with pytest.raises(CatalogUnavailable, match="more than 2 pages"):
            await gcp_prices(gcp_settings(paged, max_pages=2), [N2])
    finally:
        paged.stop()
    assert paged.violations == []


async def test_gcp_a_changed_price_is_seen_by_the_next_call(billing: GcpBillingApi) -> None:
    assert (await gcp_prices(gcp_settings(billing), [N2]))[N2].core_hour_usd == 0.031611
    billing.set_price("N2 Instance Core running in Americas", "0.0333")
    assert (await gcp_prices(gcp_settings(billing), [N2]))[N2] == MachinePrice(0.0333, 0.004237)


@pytest.mark.parametrize("price", ["1000", "-0.5"])
async def test_gcp_an_absurd_or_negative_price_is_skipped_and_logged(
        billing: GcpBillingApi, price: str, caplog: pytest.LogCaptureFixture) -> None:
    billing.set_price("N2 Instance Core running in Americas", price)
    with caplog.at_level(logging.WARNING, "services.driver.pricing.catalog_gcp"):
        found = await gcp_prices(gcp_settings(billing), [N2, N2_SPOT])
    assert set(found) == {N2_SPOT}
    [record] = [r for r in caplog.records if "N2 Instance Core running in Americas" in r.getMessage()]
    assert "not a price" in record.getMessage()


async def test_gcp_a_price_in_another_unit_is_refused(billing: GcpBillingApi) -> None:
    [core] = [s for s in billing.skus if s["description"] == "N2 Instance Core running in Americas"]
    core["pricingInfo"][0]["pricingExpression"]["usageUnit"] = "min"
    assert set(await gcp_prices(gcp_settings(billing), [N2, N2_BELGIUM])) == {N2_BELGIUM}


@pytest.mark.parametrize("failure", ["500", "403", "hang", "huge", "malformed"])
async def test_gcp_failures_are_catalog_unavailable_within_the_deadline(billing: GcpBillingApi, failure: str) -> None:
    billing.fail(failure)
    billing.huge_skus = 2000
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable, match="GCP price catalogue") as raised:
        await gcp_prices(gcp_settings(billing, timeout_s=1.0, max_skus=1000), [N2])
    assert time.monotonic() - started < 4.0
    assert "\n" not in str(raised.value)


async def test_gcp_unreachable_is_catalog_unavailable() -> None:
    with pytest.raises(CatalogUnavailable, match="unreachable"):
        await gcp_prices(GcpCatalogSettings(api_endpoint=f"http://127.0.0.1:{_closed_port()}",
                                            credentials=AnonymousCredentials(), timeout_s=2.0), [N2])


# -- Azure -------------------------------------------------------------------------------------------------


@pytest.fixture
async def retail(tmp_path: Path) -> AsyncIterator[AzurePricesApi]:
    tls = DevCertificateAuthority(tmp_path / "ca").issue("azure-prices")
    api = await AzurePricesApi(tls.cert, tls.key, tls.ca_cert, hang_s=10.0).start()
    try:
        yield api
    finally:
        await api.close()
    assert api.violations == [], "requests that do not fit the documented API"


def azure_settings(api: AzurePricesApi, **changes: Any) -> AzureRetailSettings:
    return dataclasses.replace(AzureRetailSettings(endpoint=api.endpoint, verify=str(api.ca_file), timeout_s=5.0),
                               **changes)


async def test_azure_regular_and_spot_in_two_regions(retail: AzurePricesApi) -> None:
    wanted = [D4, D4_SPOT, D4_NORTH, D4_SPOT_NORTH, Machine("azure", "Standard_E8s_v5", True, "westeurope"), N2]
    # Linux only, Consumption only, never Low Priority; of the two regular West Europe prices the later.
    assert await azure_prices(azure_settings(retail), wanted) == {
        D4: 0.23, D4_SPOT: 0.0461, D4_NORTH: 0.208, D4_SPOT_NORTH: 0.0416}


async def test_azure_request_has_the_documented_shape(retail: AzurePricesApi) -> None:
    await azure_prices(azure_settings(retail), [D4, D4_SPOT, D4_NORTH])
    calls = retail.recorded()
    assert [c.path for c in calls] == ["/api/retail/prices"] * 2  # one query per region and size
    assert {c.query["api-version"] for c in calls} == {API_VERSION} == {"2023-01-01-preview"}
    assert [c.query["$filter"] for c in calls] == [
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and armSkuName eq 'Standard_D4s_v5' "
        "and priceType eq 'Consumption'" for region in ("northeurope", "westeurope")]


async def test_azure_next_page_links_are_followed_and_bounded(retail: AzurePricesApi) -> None:
    whole = await azure_prices(azure_settings(retail), [D4, D4_SPOT])
    retail.page_size = 1
    retail.requests.clear()
    assert await azure_prices(azure_settings(retail), [D4, D4_SPOT]) == whole
    skips = [c.query.get("$skip") for c in retail.recorded()]
    assert skips == [None, *(str(n) for n in range(1, len(skips)))] and len(skips) > 3
    with pytest.raises(CatalogUnavailable, match="more than 2 pages"):
        await azure_prices(azure_settings(retail, max_pages=2), [D4])


async def test_azure_a_changed_price_is_seen_by_the_next_call(retail: AzurePricesApi) -> None:
    assert (await azure_prices(azure_settings(retail), [D4_SPOT]))[D4_SPOT] == 0.0461
    retail.set_price("westeurope", "D4s v5 Spot", DSV5, 0.0502)
    assert (await azure_prices(azure_settings(retail), [D4_SPOT]))[D4_SPOT] == 0.0502


async def test_azure_an_absurd_price_is_skipped_and_logged(retail: AzurePricesApi,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    retail.set_price("westeurope", "D4s v5 Spot", DSV5, 1000.0)
    with caplog.at_level(logging.WARNING, "services.driver.pricing.catalog_azure"):
        assert await azure_prices(azure_settings(retail), [D4, D4_SPOT]) == {D4: 0.23}
    assert [r.getMessage() for r in caplog.records if "Standard_D4s_v5" in r.getMessage()] == [
        "Azure retail prices: item skipped: Standard_D4s_v5 'D4s v5 Spot' in westeurope: 1000.0 USD is not a price"]


@pytest.mark.parametrize("failure", ["500", "403", "hang", "huge", "elsewhere", "malformed"])
async def test_azure_failures_are_catalog_unavailable_within_the_deadline(retail: AzurePricesApi,
                                                                          failure: str) -> None:
    retail.fail(failure)
    started = time.monotonic()
    with pytest.raises(CatalogUnavailable, match="Azure retail prices") as raised:
        await azure_prices(azure_settings(retail, timeout_s=1.0, max_response_bytes=256 * 1024), [D4])
    assert time.monotonic() - started < 3.0
    assert "\n" not in str(raised.value)
    if failure == "elsewhere":
        assert len(retail.recorded()) == 1  # the other host was never asked


async def test_azure_unreachable_or_untrusted_is_catalog_unavailable(retail: AzurePricesApi) -> None:
    with pytest.raises(CatalogUnavailable, match="unreachable"):
        await azure_prices(AzureRetailSettings(endpoint=f"https://127.0.0.1:{_closed_port()}/api/retail/prices",
                                               timeout_s=2.0), [D4])
    with pytest.raises(CatalogUnavailable, match="(?i)certificate"):
        await azure_prices(azure_settings(retail, verify=True), [D4])


async def test_nothing_is_asked_for_no_machine_of_the_cloud(billing: GcpBillingApi, retail: AzurePricesApi) -> None:
    assert await gcp_prices(gcp_settings(billing), [D4]) == {}
    assert await azure_prices(azure_settings(retail), [N2]) == {}
    assert billing.calls() == [] and retail.recorded() == []


async def test_settings_come_from_the_providers_configurations(billing: GcpBillingApi,
                                                                retail: AzurePricesApi) -> None:
    gcp = GcpConfig(project="p", deployment="prod-1", regions=(GcpRegion("us-central1", ("us-central1-a",)),),
                    boot_image="projects/p/global/images/family/corral", worker=WorkerBoot("e:1", ("g:1",), "PEM"),
                    billing_api_endpoint=billing.endpoint)
    settings = gcp_catalog_settings(gcp)
    assert (settings.api_endpoint, settings.credentials) == (billing.endpoint, None)  # None: ADC
    azure = AzureConfig(subscription_id="s", resource_group="g", locations=("westeurope",), subnet_id="/x",
                        image=ImageReference(id="/i"), admin_username="corral", ssh_public_key="ssh-ed25519 AAAA",
                        deployment="prod", boot=WorkerBootSettings("e:1", ("g:1",), "PEM"),
                        connection_verify=str(retail.ca_file), retail_prices_endpoint=retail.endpoint)
    assert azure_retail_settings(azure) == AzureRetailSettings(endpoint=retail.endpoint, verify=str(retail.ca_file))
    assert await azure_prices(azure_retail_settings(azure), [D4]) == {D4: 0.23}


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_the_azure_catalogue_splits_a_sizes_price_over_its_vcpus_and_memory(retail: AzurePricesApi) -> None:
    sizes = {"Standard_D4s_v5": AzureSize(4, 16.0)}
    catalog = AzureCatalog(azure_settings(retail), sizes)
    unsized = Machine("azure", "Standard_E8s_v5", True, "westeurope")
    prices = await catalog.prices([D4, D4_SPOT, unsized])
    assert prices == {D4: split_vm_price(0.23, 4, 16.0), D4_SPOT: split_vm_price(0.0461, 4, 16.0)}
    assert prices[D4].core_hour_usd * 4 + prices[D4].gib_hour_usd * 16 == pytest.approx(0.23)
    assert all("Standard_E8s_v5" not in c.query["$filter"] for c in retail.recorded())  # not asked for
