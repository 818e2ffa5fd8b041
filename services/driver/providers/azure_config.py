"""The Azure provider's configuration: what an operator gives (one JSON file, `load_config`), and the
choice of a VM size from a pool's cores and memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from azure.mgmt.compute import models as compute_models

from services.driver.providers.errors import InvalidRequest

_GIB = 1024 ** 3

# VM families by memory per vCPU (GiB) and the vCPU counts each offers: Fsv2 (2), Dsv5 (4), Esv5 (8).
_FAMILIES: tuple[tuple[float, str, tuple[int, ...]], ...] = (
    (2.0, "Standard_F{n}s_v2", (2, 4, 8, 16, 32, 48, 64, 72)),
    (4.0, "Standard_D{n}s_v5", (2, 4, 8, 16, 32, 48, 64, 96)),
    (8.0, "Standard_E{n}s_v5", (2, 4, 8, 16, 20, 32, 48, 64, 96)),
)


@dataclasses.dataclass(frozen=True)
class ImageReference:
    """The VM image: a marketplace image (publisher, offer, sku, version) or a resource `id` (a
    managed or gallery image with corral installed)."""

    publisher: str = ""
    """Marketplace image publisher (e.g. Canonical)."""
    offer: str = ""
    sku: str = ""
    version: str = "latest"
    id: str = ""
    """A managed or gallery image's resource id (then publisher, offer and sku are unused)."""

    def model(self) -> compute_models.ImageReference:
        if self.id:
            return compute_models.ImageReference(id=self.id)
        if not (self.publisher and self.offer and self.sku):
            raise ValueError("an image needs an id, or a publisher, offer and sku")
        return compute_models.ImageReference(publisher=self.publisher, offer=self.offer, sku=self.sku,
                                             version=self.version)


@dataclasses.dataclass(frozen=True)
class WorkerBootSettings:
    """What every worker of the deployment is told at boot (besides its name and token)."""

    enroll_address: str
    """host:port where a new worker enrolls with its token."""
    driver_addresses: tuple[str, ...]
    """The internal gateway's addresses."""
    ca_cert_pem: str
    """The deployment CA certificate."""
    worker_args: tuple[str, ...] = ()
    """Flags for `python -m services.worker` shared by every machine (--scratch-dir, --log-root-url,
    --runtime, ...); --cores-mcpu, --memory-bytes, --storage-bytes and --region come per machine."""


@dataclasses.dataclass(frozen=True)
class AzureConfig:
    """Where and how the driver makes machines in Azure."""

    subscription_id: str
    resource_group: str
    """Every corral VM, NIC and disk lives here; the driver's identity needs roles on it only."""
    locations: tuple[str, ...]
    """Regions in order of preference (e.g. ("westeurope", "northeurope"))."""
    subnet_id: str
    """The workers' subnet: /subscriptions/S/resourceGroups/G/providers/Microsoft.Network/virtualNetworks/V/subnets/N."""
    image: ImageReference
    """The workers' image: Python 3 and corral installed at `install_dir`."""
    admin_username: str
    """The VM's administrator account (SSH key only)."""
    ssh_public_key: str
    """Linux VMs need one; password authentication is disabled."""
    deployment: str
    """Value of the `corral-deployment` tag: `alive()` sees only this deployment's VMs."""
    boot: WorkerBootSettings
    """What each worker's userData carries besides its name and token."""
    vm_sizes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Exact VM size per pool (instance collection); a pool not here gets a size from `vm_size`."""
    os_disk_type: str = "Premium_LRS"
    """The OS disk's storage account type (Premium_LRS, StandardSSD_LRS, ...)."""
    os_disk_size_gb: int = 64
    """The OS disk's size; the worker's scratch space lives on it unless the image mounts another."""
    install_dir: str = "/opt/corral"
    """Where corral is installed on the image (the startup script runs the worker from there)."""
    base_url: str | None = None
    """The Resource Manager endpoint; None: the public cloud's (https://management.azure.com)."""
    connection_verify: bool | str = True
    """TLS verification of `base_url` and `retail_prices_endpoint`: True, or a CA bundle's path (a private
    endpoint, the tests)."""
    credential_scope: str = "https://management.azure.com/.default"
    """The token's audience: the public cloud's Resource Manager (a sovereign cloud has its own)."""
    poll_interval_s: float = 5.0
    """Between polls of a long-running operation when Azure sends no Retry-After."""
    operation_timeout_s: float = 600.0
    """A create or delete not finished by then fails as TransientError."""
    retry_total: int = 3
    """Retries of a throttled (429) or failed (5xx) request, inside the SDK."""
    retail_prices_endpoint: str = "https://prices.azure.com/api/retail/prices"
    """The Azure Retail Prices API, where VM sizes' prices are read (public, unauthenticated)."""

    def __post_init__(self) -> None:
        if self.base_url is not None and not self.base_url.startswith("https://"):
            # The SDK's bearer-token policy refuses to send a token over plain HTTP, and rightly.
            raise ValueError("AzureConfig.base_url must be https://")
        if not self.retail_prices_endpoint.startswith("https://"):
            raise ValueError("AzureConfig.retail_prices_endpoint must be https://")
        if not self.locations:
            raise ValueError("AzureConfig.locations is empty")
        if not self.ssh_public_key.startswith(("ssh-", "ecdsa-")):
            raise ValueError("AzureConfig.ssh_public_key must be an OpenSSH public key")
        if not re.fullmatch(r"/[A-Za-z0-9._/-]{1,200}", self.install_dir):
            raise ValueError("AzureConfig.install_dir must be an absolute path of letters, digits and ._/-")
        if not 1 <= self.os_disk_size_gb <= 4095:
            raise ValueError("AzureConfig.os_disk_size_gb must be 1..4095")


MAX_CONFIG_BYTES = 256 * 1024


def load_config(text: str | bytes) -> AzureConfig:
    """An `AzureConfig` from its JSON form: the fields by name, `image` and `boot` as objects, lists
    for tuples. Unknown or missing fields are refused by name (ValueError)."""
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(f"Azure configuration is {len(raw)} bytes; at most {MAX_CONFIG_BYTES}")
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("Azure configuration is not a JSON object")

    def build(cls: type[Any], values: Any, where: str) -> Any:
        if not isinstance(values, dict):
            raise ValueError(f"Azure configuration: {where} must be an object")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ValueError(f"Azure configuration: unknown field(s) {unknown} in {where}")
        try:
            return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
        except TypeError as error:
            raise ValueError(f"Azure configuration: {where}: {error}") from None

    fields = dict(data)
    fields["image"] = build(ImageReference, fields.get("image", {}), "image")
    fields["boot"] = build(WorkerBootSettings, fields.get("boot", {}), "boot")
    config = build(AzureConfig, fields, "the configuration")
    if not isinstance(config.vm_sizes, dict) or not all(isinstance(v, str) for v in config.vm_sizes.values()):
        raise ValueError("Azure configuration: vm_sizes must map pool names to VM sizes")
    return config


def vm_sizes() -> list[str]:
    """Every size `vm_size` may pick."""
    return [template.format(n=count) for _, template, counts in _FAMILIES for count in counts]


def vm_size(cores_mcpu: int, memory_bytes: int) -> str:
    """The smallest Fsv2/Dsv5/Esv5 size with at least the cores asked for and the memory per core (no
    memory asked: Dsv5)."""
    cores = max(1, math.ceil(cores_mcpu / 1000))
    per_core_gib = memory_bytes / _GIB / cores if memory_bytes > 0 else 4.0
    for gib, template, counts in _FAMILIES:
        if per_core_gib <= gib:
            for count in counts:
                if count >= cores:
                    return template.format(n=count)
            raise InvalidRequest(f"no {template.format(n='N')} size has {cores} vCPUs")
    raise InvalidRequest(f"{per_core_gib:.1f} GiB per vCPU is more than any configured family offers; "
                         "name an exact size for the pool")
