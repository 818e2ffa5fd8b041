"""Which catalogue entries price which machine (services/driver/pricing/catalog_rules.py), on the documented
bodies kept for the loopback servers and on generated ones."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.driver.pricing.catalog_rules import (AzureItemPrice, GcpSkuPrice, Unusable, azure_item_price,
                                                   azure_machine_prices, gcp_machine_prices, gcp_sku_price,
                                                   money_usd)
from services.driver.pricing.products import Machine

CLOUDS = Path(__file__).resolve().parents[1] / "clouds"
SKUS = {s["description"]: s for s in json.loads((CLOUDS / "gcp" / "services.skus.list.json").read_text())["skus"]}
ITEMS = json.loads((CLOUDS / "azure" / "retail_prices.json").read_text())["Items"]
INT64 = 2 ** 63 - 1
DAY = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)


@given(st.integers(0, INT64), st.integers(0, 999_999_999), st.booleans())
def test_money_is_converted_exactly(units: int, nanos: int, negative: bool) -> None:
    sign = -1 if negative else 1
    amount = money_usd(str(sign * units), sign * nanos)
    assert amount * 1_000_000_000 == sign * (units * 1_000_000_000 + nanos)


@pytest.mark.parametrize(("units", "nanos"), [(1, -1), (-1, 1), (0, 1_000_000_000), (0, -1_000_000_000)])
def test_money_outside_the_types_rules_is_refused(units: int, nanos: int) -> None:
    with pytest.raises(Unusable):
        money_usd(units, nanos)


@pytest.mark.parametrize(("description", "expected"), [
    ("N2 Instance Core running in Americas", ("n2", False, "core", Decimal("0.031611"))),
    ("N2 Instance Ram running in Americas", ("n2", False, "ram", Decimal("0.004237"))),
    ("Spot Preemptible N2 Instance Core running in Belgium", ("n2", True, "core", Decimal("0.008418"))),
    ("N2D AMD Instance Ram running in Americas", ("n2d", False, "ram", Decimal("0.003686"))),
    ("N2 Custom Instance Core running in Americas", None),
    ("N2 Custom Extended Instance Ram running in Americas", None),
    ("Commitment v1: N2 Cpu in Americas for 1 Year", None),
    ("N2 Sole Tenancy Instance Core running in Americas", None),
    ("Balanced PD Capacity in Americas", None),
    ("Nvidia Tesla T4 GPU running in Americas", None),
])
def test_documented_skus(description: str, expected: tuple[str, bool, str, Decimal] | None) -> None:
    price = gcp_sku_price(SKUS[description])
    assert (price and (price.series, price.spot, price.resource, price.usd_per_unit)) == expected
    if price:
        assert price.regions == frozenset(SKUS[description]["serviceRegions"])


def test_a_preemptible_prefix_needs_the_preemptible_usage_type() -> None:
    mislabelled = {**SKUS["Spot Preemptible N2 Instance Core running in Belgium"],
                   "category": {**SKUS["N2 Instance Core running in Americas"]["category"]}}
    assert gcp_sku_price(mislabelled) is None


def test_the_newest_pricing_and_the_rate_from_zero_are_used() -> None:
    sku = json.loads(json.dumps(SKUS["N2 Instance Core running in Americas"]))
    old = json.loads(json.dumps(sku["pricingInfo"][0]))
    old["effectiveTime"] = "2020-01-01T00:00:00Z"
    old["pricingExpression"]["tieredRates"][0]["unitPrice"]["nanos"] = 1
    sku["pricingInfo"].insert(0, old)
    sku["pricingInfo"][1]["pricingExpression"]["tieredRates"].append(
        {"startUsageAmount": 100, "unitPrice": {"currencyCode": "USD", "units": "0", "nanos": 5}})
    price = gcp_sku_price(sku)
    assert price is not None and price.usd_per_unit == Decimal("0.031611")


@pytest.mark.parametrize(("change", "reason"), [
    ({"usageUnit": "GiBy.h"}, "priced per"), ({"tieredRates": []}, "no rate from usage 0"),
    ({"tieredRates": [{"startUsageAmount": 0, "unitPrice": {"currencyCode": "EUR", "units": "0", "nanos": 3}}]},
     "not USD"),
    ({"tieredRates": [{"startUsageAmount": 0, "unitPrice": {"currencyCode": "USD", "units": "1000"}}]},
     "not a price")])
def test_unusable_gcp_prices(change: dict[str, object], reason: str) -> None:
    sku = json.loads(json.dumps(SKUS["N2 Instance Core running in Americas"]))
    sku["pricingInfo"][0]["pricingExpression"].update(change)
    with pytest.raises(Unusable, match=reason):
        gcp_sku_price(sku)


def test_documented_azure_items() -> None:
    parsed = [azure_item_price(item) for item in ITEMS]
    taken = [(p.size, p.spot, p.region, p.usd_per_hour) for p in parsed if p is not None]
    assert taken == [("Standard_D4s_v5", False, "westeurope", Decimal("0.23")),
                     ("Standard_D4s_v5", False, "westeurope", Decimal("0.21")),
                     ("Standard_D4s_v5", True, "westeurope", Decimal("0.0461")),
                     ("Standard_D4s_v5", False, "northeurope", Decimal("0.208")),
                     ("Standard_D4s_v5", True, "northeurope", Decimal("0.0416")),
                     ("Standard_D4s_v5", False, "eastus", Decimal("0.192")),
                     ("Standard_E8s_v5", False, "westeurope", Decimal("0.576"))]
    # Windows, Low Priority, DevTestConsumption and Reservation items are not taken.


@pytest.mark.parametrize("price", [-0.01, float("nan"), float("inf"), 1000.0, "0.2", None])
def test_unusable_azure_prices(price: object) -> None:
    with pytest.raises(Unusable):
        azure_item_price({**ITEMS[0], "retailPrice": price})


def test_the_latest_azure_item_wins_then_the_higher_price() -> None:
    machine = Machine("azure", "Standard_D4s_v5", False, "westeurope")
    old, new = (AzureItemPrice("Standard_D4s_v5", False, "westeurope", Decimal(p), DAY + datetime.timedelta(days=d))
                for p, d in (("0.9", 0), ("0.2", 1)))
    assert azure_machine_prices([new, old], [machine]) == azure_machine_prices([old, new], [machine]) == {machine: 0.2}
    twin = AzureItemPrice("Standard_D4s_v5", False, "westeurope", Decimal("0.3"), new.effective)
    assert azure_machine_prices([twin, new], [machine]) == {machine: 0.3}


SERIES = st.sampled_from(["n2", "e2", "n2d"])
REGIONS = st.sampled_from(["us-central1", "europe-west1", "asia-east1"])
PRICES = st.decimals(min_value=0, max_value=999, places=6)


@given(st.lists(st.builds(GcpSkuPrice, SERIES, st.booleans(), st.sampled_from(["core", "ram"]),
                          st.frozensets(REGIONS, max_size=2), PRICES, st.just(DAY)), max_size=12),
       st.lists(st.builds(Machine, st.just("gcp"), SERIES, st.booleans(), REGIONS), max_size=6))
def test_gcp_prices_come_only_from_skus_that_price_the_machine(skus: list[GcpSkuPrice],
                                                               machines: list[Machine]) -> None:
    found = gcp_machine_prices(skus, machines)
    assert set(found) <= set(machines)
    for machine, price in found.items():
        pricing = [s for s in skus
                   if (s.series, s.spot) == (machine.name, machine.spot) and machine.region in s.regions]
        assert price.core_hour_usd in {float(s.usd_per_unit) for s in pricing if s.resource == "core"}
        assert price.gib_hour_usd in {float(s.usd_per_unit) for s in pricing if s.resource == "ram"}
    for machine in set(machines) - set(found):
        pricing = {s.resource for s in skus if (s.series, s.spot) == (machine.name, machine.spot)
                   and machine.region in s.regions}
        assert pricing != {"core", "ram"}


@given(st.lists(st.builds(AzureItemPrice, st.sampled_from(["Standard_D4s_v5", "Standard_E8s_v5"]), st.booleans(),
                          st.sampled_from(["westeurope", "eastus"]), PRICES,
                          st.integers(0, 3).map(lambda d: DAY + datetime.timedelta(days=d))), max_size=10),
       st.lists(st.builds(Machine, st.just("azure"), st.sampled_from(["Standard_D4s_v5", "Standard_E8s_v5"]),
                          st.booleans(), st.sampled_from(["westeurope", "eastus"])), max_size=6))
def test_azure_prices_come_only_from_items_that_price_the_machine(items: list[AzureItemPrice],
                                                                  machines: list[Machine]) -> None:
    found = azure_machine_prices(items, machines)
    for machine in machines:
        pricing = [i for i in items if (i.size, i.spot, i.region) == (machine.name, machine.spot, machine.region)]
        if not pricing:
            assert machine not in found
        else:
            latest = max(i.effective for i in pricing)
            assert found[machine] == float(max(i.usd_per_hour for i in pricing if i.effective == latest))
