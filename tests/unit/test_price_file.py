"""The products an attempt is billed to and the price file (services.driver.pricing.products, price_file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.driver.pricing import price_file
from services.driver.pricing.products import LOCAL, Machine, MachinePrice, gcp_series, split_vm_price
from services.driver.providers.azure_config import vm_sizes


def test_products_name_the_machine_how_it_is_bought_and_its_region() -> None:
    assert (LOCAL.cpu_product, LOCAL.memory_product) == ("cpu/local", "memory/local")
    spot = Machine("gcp", gcp_series("n2-custom-4-16384"), True, "us-central1")
    assert (spot.cpu_product, spot.memory_product) == ("cpu/gcp/n2-spot/us-central1", "memory/gcp/n2-spot/us-central1")
    assert Machine("azure", "Standard_D4s_v5", False, "westeurope").cpu_product == \
        "cpu/azure/standard_d4s_v5-regular/westeurope"
    for bad in ("", "a/b", "x" * 49):
        with pytest.raises(ValueError):
            Machine("gcp", bad, False, "us-central1")
    with pytest.raises(ValueError):
        Machine("aws", "m5", False, "us-east-1")


@given(st.floats(0, 999), st.integers(1, 416), st.floats(0.5, 12_000))
def test_a_fully_reserved_azure_vm_costs_its_price(hour_usd: float, vcpus: int, memory_gib: float) -> None:
    price = split_vm_price(hour_usd, vcpus, memory_gib)
    assert price.core_hour_usd * vcpus + price.gib_hour_usd * memory_gib == pytest.approx(hour_usd, abs=1e-9)


def test_rates_are_in_corrals_units() -> None:
    [cpu, memory] = MachinePrice(0.036, 0.0036).rates(LOCAL)
    assert (cpu.unit, memory.unit) == ("mcpu_ms", "mib_ms")
    assert cpu.rate_usd * 1000 * 3_600_000 == pytest.approx(0.036)
    assert memory.rate_usd * 1024 * 3_600_000 == pytest.approx(0.0036)


def test_the_shipped_file_prices_the_local_machines_as_the_migration_did_and_every_default_azure_size() -> None:
    shipped = price_file.load()
    [cpu, memory] = shipped.prices[LOCAL].rates(LOCAL)
    assert cpu.rate_usd == 0.04 / (1000 * 3_600_000) and memory.rate_usd == 0.005 / (1024 * 3_600_000)
    for location in ("westeurope", "northeurope"):
        for size in vm_sizes():
            for spot in (False, True):
                assert Machine("azure", size, spot, location) in shipped.prices
    for region in ("us-central1", "europe-west4"):
        assert Machine("gcp", "n2", True, region) in shipped.prices


@pytest.mark.parametrize("change, where", [
    ({"currency": "EUR"}, "currency"),
    ({"gcp": {"n2": {"us-central1": {"preemptible": {"core_hour_usd": 1, "gib_hour_usd": 1}}}}}, "gcp.n2.us-central1"),
    ({"gcp": {"n2": {"us-central1": {"spot": {"core_hour_usd": -1, "gib_hour_usd": 1}}}}}, "core_hour_usd"),
    ({"gcp": {"n2": {"us-central1": {"spot": {"core_hour_usd": float("nan"), "gib_hour_usd": 1}}}}}, "core_hour"),
    ({"gcp": {"n/2": {"us-central1": {"spot": {"core_hour_usd": 1, "gib_hour_usd": 1}}}}}, "gcp.n/2"),
    ({"azure": {"sizes": {}, "prices": {"Standard_D2s_v5": {}}}}, "azure.prices.Standard_D2s_v5"),
    ({"azure": {"sizes": {"S": {"vcpus": 0, "memory_gib": 1}}}}, "azure.sizes.S"),
    ({"local": {"core_hour_usd": 1}}, "local"),
    ({"extra": 1}, "unknown"),
])
def test_a_wrong_entry_is_refused_saying_where(change: dict[str, object], where: str) -> None:
    with pytest.raises(ValueError, match=where.replace(".", r"\.")):
        price_file.parse({"as_of": "x", **change})


def test_a_file_too_large_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    big = tmp_path / "prices.json"
    big.write_text(json.dumps({"about": "x" * price_file.MAX_FILE_BYTES}))
    with pytest.raises(ValueError, match="at most"):
        price_file.load(big)
