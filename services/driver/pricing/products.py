"""What a machine costs, as corral bills it: the products an attempt is charged to, and their rates.

An attempt is billed per millisecond for its reservation: its cores (mcpu) at the machine's cpu product's
rate and its memory (MiB) at the memory product's. A product is a kind of machine in a region, e.g.
`cpu/gcp/n2-spot/us-central1`; a *resource* is a product at one version (`cpu/gcp/n2-spot/us-central1/3`),
and an attempt keeps the resources it started with, so a changed price (a new version) never reprices
past attempts (sql/procedures/set_product_rates.sql).

- GCP prices a machine series per vCPU-hour and per GiB-hour: those are the two rates.
- Azure prices a VM size per hour. Corral shares that price half over the size's vCPUs and half over its
  memory (`split_vm_price`), so that a job using its share of both pays its share of the machine.
- The local provider's machines have a nominal price (the price file's `local` entry).

No I/O here: the price file is read by `services.driver.pricing.price_file`, the clouds' catalogues by
`catalog_gcp` and `catalog_azure`.
"""

from __future__ import annotations

import dataclasses
import re

PROVIDERS = ("local", "gcp", "azure")
MS_PER_HOUR = 3_600_000
MIB_PER_GIB = 1024
MCPU_PER_CORE = 1000

_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")
"""A machine's name or region as it may appear in a product name (no '/')."""


@dataclasses.dataclass(frozen=True)
class Machine:
    """A kind of machine in a region: what one price applies to."""

    provider: str
    """local, gcp or azure."""
    name: str
    """GCP: the machine series (n2, n2d, e2, c3: the part of the machine type before its first '-');
    Azure: the VM size (Standard_D4s_v5); local: 'local'."""
    spot: bool
    """A spot (preemptible) machine: GCP's Spot provisioning model, Azure's Spot priority."""
    region: str
    """GCP region or Azure location ('local' for the local provider)."""

    def __post_init__(self) -> None:
        if self.provider not in PROVIDERS:
            raise ValueError(f"provider {self.provider!r}: one of {', '.join(PROVIDERS)}")
        for field, value in (("name", self.name), ("region", self.region)):
            if not _PART.fullmatch(value):
                raise ValueError(f"machine {field} {value!r}: letters, digits, '_', '.', '-', at most 48")

    @property
    def kind(self) -> str:
        """The product's middle part: the machine and how it is bought."""
        if self.provider == "local":
            return "local"
        model = ("spot" if self.spot else "ondemand") if self.provider == "gcp" else \
            ("spot" if self.spot else "regular")
        return f"{self.provider}/{self.name.lower()}-{model}/{self.region}"

    @property
    def cpu_product(self) -> str:
        return f"cpu/{self.kind}"

    @property
    def memory_product(self) -> str:
        return f"memory/{self.kind}"


LOCAL = Machine("local", "local", False, "local")


def gcp_series(machine_type: str) -> str:
    """The series a GCP machine type is priced by: n2 for n2-standard-8 and n2-custom-4-16384."""
    return machine_type.split("-", 1)[0]


@dataclasses.dataclass(frozen=True)
class MachinePrice:
    """A machine's price in USD, as the clouds publish it."""

    core_hour_usd: float
    """Per vCPU per hour."""
    gib_hour_usd: float
    """Per GiB of memory per hour."""

    def __post_init__(self) -> None:
        for field, value in (("core_hour_usd", self.core_hour_usd), ("gib_hour_usd", self.gib_hour_usd)):
            if not (0.0 <= value < 1000.0):  # also refuses NaN
                raise ValueError(f"{field} {value!r}: a price in USD per hour, 0 to 1000")

    def rates(self, machine: Machine) -> list[ProductRate]:
        """The two products' rates in corral's units: USD per mcpu-ms and per MiB-ms."""
        return [ProductRate(machine.cpu_product, "mcpu_ms", self.core_hour_usd / (MCPU_PER_CORE * MS_PER_HOUR)),
                ProductRate(machine.memory_product, "mib_ms", self.gib_hour_usd / (MIB_PER_GIB * MS_PER_HOUR))]


def split_vm_price(vm_hour_usd: float, vcpus: int, memory_gib: float) -> MachinePrice:
    """An Azure VM size's hourly price as a core-hour and a GiB-hour price: half over its vCPUs, half over
    its memory, so that the whole machine, fully reserved, costs its price."""
    if vcpus <= 0 or memory_gib <= 0:
        raise ValueError(f"a VM size needs vCPUs and memory (got {vcpus}, {memory_gib} GiB)")
    return MachinePrice(vm_hour_usd / 2 / vcpus, vm_hour_usd / 2 / memory_gib)


@dataclasses.dataclass(frozen=True)
class ProductRate:
    """A product's rate in corral's units (what set_product_rates takes)."""

    product: str
    unit: str
    """mcpu_ms or mib_ms."""
    rate_usd: float
