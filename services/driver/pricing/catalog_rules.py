"""Which catalogue entries price which machine, and at what: pure functions over the catalogues' documented
JSON shapes, so the rules are tested without a network.

GCP (Cloud Billing Catalog API, a `Sku` as `services.skus.list` returns it): a machine series is priced by
two SKUs per region and usage type, one per vCPU-hour ("N2 Instance Core running in Americas", usage unit
`h`) and one per GiB-hour ("N2 Instance Ram running in Americas", usage unit `GiBy.h`). Spot VMs are billed
by the `Preemptible` usage type's SKUs ("Spot Preemptible N2 Instance Core ..."). An entry is taken when:
- `category.resourceFamily` is `Compute` and `category.usageType` is `OnDemand` or `Preemptible` (so
  commitments, `Commit1Yr`/`Commit3Yr`, are out);
- its description is, exactly, `[Spot Preemptible |Preemptible ]SERIES [AMD |Arm ][Predefined ]Instance
  Core|Ram running in PLACE`, with the prefix present exactly when the usage type is `Preemptible`. This
  leaves out custom and extended memory ("N2 Custom Instance Core"), sole tenancy, GPUs, licences and
  series priced without their name ("Compute optimized Core", C2). `category.resourceGroup` is not used:
  it differs from series to series (`N1Standard` for N1, `CPU`/`RAM` for others);
- the price is in USD, the newest `pricingInfo` (by `effectiveTime`), the tier in force from usage 0
  (the last of `tieredRates` whose `startUsageAmount` is 0), `units` + `nanos`/10^9 exactly; a unit other
  than `h` (cores) or `GiBy.h` (memory) is refused rather than converted.
The region is matched against `serviceRegions`.

Azure (Retail Prices API, one of `Items`): a VM size's hourly price, for Linux. An item is taken when
`serviceName` is `Virtual Machines`, `type` is `Consumption` (DevTest and reservations are out),
`unitOfMeasure` is `1 Hour`, `productName` does not contain "Windows", neither `skuName` nor `meterName`
contains "Low Priority", and `tierMinimumUnits` is 0. Spot is a `skuName` ending in " Spot". The price is
`retailPrice` (the documented "price without discount") in USD. When several items price one machine, the
one with the latest `effectiveStartDate` wins (a missing date counts as oldest); on equal dates, the higher
price (a price too high bills a little more, never less, than the machine costs).

Both: a price that is negative, NaN or absurd (>= 1000 USD per unit) makes the entry unusable
(`Unusable`, for the caller to log), never a price.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any

from services.driver.pricing.products import Machine, MachinePrice

ABSURD_USD = Decimal(1000)
"""A price per core-hour, GiB-hour or VM-hour at or above this is a catalogue error, not a price."""
NANOS_PER_UNIT = 1_000_000_000
GCP_USAGE_UNITS = {"core": "h", "ram": "GiBy.h"}
"""The usage unit each resource's price must be in (Cloud Billing's unit codes)."""
_GCP_DESCRIPTION = re.compile(
    r"(?P<spot>Spot Preemptible |Preemptible )?(?P<series>[A-Z][A-Z0-9]{0,7})(?: AMD| Arm)?(?: Predefined)?"
    r" Instance (?P<resource>Core|Ram) running in \S.*")
_OLDEST = datetime.datetime.min.replace(tzinfo=datetime.timezone.utc)


class Unusable(ValueError):
    """An entry that prices a machine, but whose price cannot be used (its unit, currency or value)."""


@dataclasses.dataclass(frozen=True)
class GcpSkuPrice:
    """What one Compute Engine SKU prices."""

    series: str
    """Lower case, as in machine types (n2, n2d)."""
    spot: bool
    """Billed to Spot (Preemptible usage type) VMs."""
    resource: str
    """core or ram."""
    regions: frozenset[str]
    usd_per_unit: Decimal
    """Per vCPU-hour (core) or per GiB-hour (ram)."""
    effective: datetime.datetime
    """When this price took effect (its pricingInfo's effectiveTime)."""


@dataclasses.dataclass(frozen=True)
class AzureItemPrice:
    """What one Retail Prices item prices."""

    size: str
    """The VM size (armSkuName), e.g. Standard_D4s_v5."""
    spot: bool
    region: str
    """armRegionName, e.g. westeurope."""
    usd_per_hour: Decimal
    effective: datetime.datetime


def money_usd(units: int | str, nanos: int) -> Decimal:
    """A google.type.Money amount, exactly: `units` (int64, JSON gives it as a string) plus `nanos`
    billionths, which must be within ±999,999,999 and of the sign of `units` (the type's rules)."""
    whole = int(units)
    if not -NANOS_PER_UNIT < nanos < NANOS_PER_UNIT or (whole > 0 and nanos < 0) or (whole < 0 and nanos > 0):
        raise Unusable(f"not a Money amount: units {units}, nanos {nanos}")
    return Decimal(whole) + Decimal(nanos) / NANOS_PER_UNIT


def checked_usd(value: Decimal, what: str) -> Decimal:
    """`value` if it can be a price; Unusable if negative, NaN, infinite or absurd."""
    if not value.is_finite() or value < 0 or value >= ABSURD_USD:
        raise Unusable(f"{what}: {value} USD is not a price")
    return value


def gcp_sku_price(sku: Mapping[str, Any]) -> GcpSkuPrice | None:
    """The machine price a SKU (the REST JSON shape, camelCase) gives, None if it prices no machine
    (module docstring: the rules); Unusable if it prices one but its price cannot be used."""
    category = sku.get("category") or {}
    usage = category.get("usageType")
    if category.get("resourceFamily") != "Compute" or usage not in ("OnDemand", "Preemptible"):
        return None
    description = str(sku.get("description", ""))
    match = _GCP_DESCRIPTION.fullmatch(description)
    if match is None or (match["spot"] is not None) != (usage == "Preemptible"):
        return None
    resource = match["resource"].lower()
    infos = list(sku.get("pricingInfo") or [])
    if not infos:
        raise Unusable(f"{description!r}: no pricingInfo")
    info = max(infos, key=lambda i: _instant(i.get("effectiveTime")))
    expression = info.get("pricingExpression") or {}
    unit = expression.get("usageUnit")
    if unit != GCP_USAGE_UNITS[resource]:
        raise Unusable(f"{description!r}: priced per {unit!r}, not {GCP_USAGE_UNITS[resource]!r}")
    from_zero = [t for t in expression.get("tieredRates") or [] if float(t.get("startUsageAmount", 0)) <= 0]
    if not from_zero:
        raise Unusable(f"{description!r}: no rate from usage 0")
    price = from_zero[-1].get("unitPrice") or {}
    if price.get("currencyCode", "USD") != "USD":
        raise Unusable(f"{description!r}: priced in {price.get('currencyCode')!r}, not USD")
    usd = checked_usd(money_usd(price.get("units", "0"), int(price.get("nanos", 0))), repr(description))
    return GcpSkuPrice(match["series"].lower(), usage == "Preemptible", resource,
                       frozenset(sku.get("serviceRegions") or ()), usd, _instant(info.get("effectiveTime")))


def gcp_machine_prices(skus: Iterable[GcpSkuPrice], wanted: Collection[Machine]) -> dict[Machine, MachinePrice]:
    """Each wanted GCP machine that `skus` price both the cores and the memory of."""
    best: dict[tuple[Machine, str], GcpSkuPrice] = {}
    by_kind: dict[tuple[str, bool], list[Machine]] = {}
    for machine in wanted:
        if machine.provider == "gcp":
            by_kind.setdefault((machine.name.lower(), machine.spot), []).append(machine)
    for sku in skus:
        for machine in by_kind.get((sku.series, sku.spot), ()):
            if machine.region in sku.regions:
                key = (machine, sku.resource)
                if key not in best or _newer(sku.effective, sku.usd_per_unit, best[key].effective,
                                             best[key].usd_per_unit):
                    best[key] = sku
    return {m: MachinePrice(float(best[m, "core"].usd_per_unit), float(best[m, "ram"].usd_per_unit))
            for ms in by_kind.values() for m in ms if (m, "core") in best and (m, "ram") in best}


def azure_item_price(item: Mapping[str, Any]) -> AzureItemPrice | None:
    """The machine price a Retail Prices item gives, None if it prices no Linux VM by the hour (module
    docstring: the rules); Unusable if it does but its price cannot be used."""
    sku_name, meter_name = str(item.get("skuName", "")), str(item.get("meterName", ""))
    if (item.get("serviceName") != "Virtual Machines" or item.get("type") != "Consumption"
            or item.get("unitOfMeasure") != "1 Hour" or "Windows" in str(item.get("productName", ""))
            or "Low Priority" in sku_name or "Low Priority" in meter_name
            or item.get("tierMinimumUnits", 0) not in (0, 0.0) or not item.get("armSkuName")
            or not item.get("armRegionName")):
        return None
    what = f"{item['armSkuName']} {sku_name!r} in {item['armRegionName']}"
    if item.get("currencyCode", "USD") != "USD":
        raise Unusable(f"{what}: priced in {item.get('currencyCode')!r}, not USD")
    price = item.get("retailPrice")
    if isinstance(price, bool) or not isinstance(price, (int, float)):
        raise Unusable(f"{what}: retailPrice {price!r} is not a number")
    if isinstance(price, float) and not math.isfinite(price):
        raise Unusable(f"{what}: {price} USD is not a price")
    usd = checked_usd(Decimal(repr(price)), what)
    return AzureItemPrice(str(item["armSkuName"]), sku_name.endswith(" Spot"), str(item["armRegionName"]), usd,
                          _instant(item.get("effectiveStartDate")))


def azure_machine_prices(items: Iterable[AzureItemPrice], wanted: Collection[Machine]) -> dict[Machine, float]:
    """Each wanted Azure machine's USD per VM-hour, from the items that price it."""
    machines = {(m.name.lower(), m.spot, m.region): m for m in wanted if m.provider == "azure"}
    best: dict[Machine, AzureItemPrice] = {}
    for item in items:
        machine = machines.get((item.size.lower(), item.spot, item.region))
        if machine is not None and (machine not in best or _newer(item.effective, item.usd_per_hour,
                                                                  best[machine].effective,
                                                                  best[machine].usd_per_hour)):
            best[machine] = item
    return {machine: float(item.usd_per_hour) for machine, item in best.items()}


def _newer(effective: datetime.datetime, usd: Decimal, than: datetime.datetime, than_usd: Decimal) -> bool:
    """The later price wins; on the same date, the higher."""
    return (effective, usd) > (than, than_usd)


def _instant(text: Any) -> datetime.datetime:
    """An RFC 3339 time as the catalogues write it; a missing or unreadable one is the oldest."""
    try:
        parsed = datetime.datetime.fromisoformat(str(text))
    except ValueError:
        return _OLDEST
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.timezone.utc)
