"""The price file shipped with corral (`prices.json` beside this module; `--price-file` names another):
what machines cost until a cloud's price catalogue is reached, and what the local provider's machines
cost. It is read and checked when the driver starts, so a wrong file stops it at once, saying where.

    {"as_of": "2026-11-01", "currency": "USD",
     "local": {"core_hour_usd": 0.04, "gib_hour_usd": 0.005},
     "gcp": {"n2": {"us-central1": {"ondemand": {"core_hour_usd": ..., "gib_hour_usd": ...},
                                    "spot": {...}}}},
     "azure": {"sizes": {"Standard_D2s_v5": {"vcpus": 2, "memory_gib": 8}},
               "prices": {"Standard_D2s_v5": {"westeurope": {"regular": 0.115, "spot": 0.023}}}}}

GCP prices are per vCPU-hour and GiB-hour of a machine series; Azure's per VM-hour of a size, shared
over its vCPUs and memory (products.split_vm_price), which is why the file lists each size's.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from services.driver.pricing.products import LOCAL, Machine, MachinePrice, split_vm_price

SHIPPED = Path(__file__).with_name("prices.json")
MAX_FILE_BYTES = 1024 * 1024
"""Larger files are refused before they are parsed."""
_GCP_MODELS = {"ondemand": False, "spot": True}
_AZURE_PRIORITIES = {"regular": False, "spot": True}


@dataclasses.dataclass(frozen=True)
class AzureSize:
    vcpus: int
    memory_gib: float


@dataclasses.dataclass(frozen=True)
class PriceFile:
    """A loaded price file."""

    as_of: str
    prices: Mapping[Machine, MachinePrice]
    """Every machine the file prices (Azure's already split per vCPU and GiB)."""
    azure_sizes: Mapping[str, AzureSize]
    """Each Azure size's vCPUs and memory, to split a catalogue's VM-hour price."""

    def price(self, machine: Machine) -> MachinePrice | None:
        return self.prices.get(machine)


def load(path: Path = SHIPPED) -> PriceFile:
    """The price file at `path`; ValueError naming the file and the entry that is wrong."""
    raw = path.read_bytes()
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes; at most {MAX_FILE_BYTES}")
    try:
        return parse(json.loads(raw))
    except ValueError as e:  # json's errors are ValueErrors too
        raise ValueError(f"{path}: {e}") from None


def parse(data: Any) -> PriceFile:
    """A PriceFile from the file's JSON; ValueError saying which entry is wrong."""
    doc = _object(data, "the file")
    unknown = set(doc) - {"as_of", "currency", "about", "local", "gcp", "azure"}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    if doc.get("currency", "USD") != "USD":
        raise ValueError(f"currency {doc.get('currency')!r}: corral bills in USD")
    prices: dict[Machine, MachinePrice] = {}
    if "local" in doc:
        prices[LOCAL] = _machine_price(doc["local"], "local")
    for series, regions in _object(doc.get("gcp", {}), "gcp").items():
        for region, models in _object(regions, f"gcp.{series}").items():
            for model, price in _object(models, f"gcp.{series}.{region}").items():
                where = f"gcp.{series}.{region}.{model}"
                if model not in _GCP_MODELS:
                    raise ValueError(f"{where}: 'ondemand' or 'spot'")
                prices[_machine("gcp", series, _GCP_MODELS[model], region, where)] = _machine_price(price, where)
    azure = _object(doc.get("azure", {}), "azure")
    sizes = {name: _azure_size(size, f"azure.sizes.{name}")
             for name, size in _object(azure.get("sizes", {}), "azure.sizes").items()}
    for name, regions in _object(azure.get("prices", {}), "azure.prices").items():
        if name not in sizes:
            raise ValueError(f"azure.prices.{name}: not in azure.sizes (its vCPUs and memory split its price)")
        for region, priorities in _object(regions, f"azure.prices.{name}").items():
            for priority, hour_usd in _object(priorities, f"azure.prices.{name}.{region}").items():
                where = f"azure.prices.{name}.{region}.{priority}"
                if priority not in _AZURE_PRIORITIES:
                    raise ValueError(f"{where}: 'regular' or 'spot'")
                machine = _machine("azure", name, _AZURE_PRIORITIES[priority], region, where)
                prices[machine] = split_vm_price(_usd(hour_usd, where), sizes[name].vcpus, sizes[name].memory_gib)
    return PriceFile(str(doc.get("as_of", "")), prices, sizes)


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: not a JSON object")
    return value


def _usd(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not 0 <= value < 1000:
        raise ValueError(f"{where}: {value!r} is not a price in USD per hour (0 to 1000)")
    return float(value)


def _machine(provider: str, name: str, spot: bool, region: str, where: str) -> Machine:
    try:
        return Machine(provider, name, spot, region)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _machine_price(value: Any, where: str) -> MachinePrice:
    price = _object(value, where)
    if set(price) != {"core_hour_usd", "gib_hour_usd"}:
        raise ValueError(f"{where}: needs exactly core_hour_usd and gib_hour_usd")
    return MachinePrice(_usd(price["core_hour_usd"], f"{where}.core_hour_usd"),
                        _usd(price["gib_hour_usd"], f"{where}.gib_hour_usd"))


def _azure_size(value: Any, where: str) -> AzureSize:
    size = _object(value, where)
    vcpus, memory_gib = size.get("vcpus"), size.get("memory_gib")
    if set(size) != {"vcpus", "memory_gib"} or isinstance(vcpus, bool) or not isinstance(vcpus, int) \
            or not 1 <= vcpus <= 1024 or isinstance(memory_gib, bool) or not isinstance(memory_gib, (int, float)) \
            or not 0 < memory_gib <= 65536:
        raise ValueError(f"{where}: needs vcpus (1 to 1024) and memory_gib (0 to 65536)")
    return AzureSize(vcpus, float(memory_gib))
