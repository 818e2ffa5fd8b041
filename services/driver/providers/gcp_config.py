"""The GCP provider's configuration: what an operator sets (docs/operations.md, "GCP machines"), as
frozen dataclasses, and `load_config`, which reads it from a JSON file with a limit and a clear error
for every field. No SDK here.

The file holds everything but `worker` (the enrollment and gateway addresses and the CA certificate
come from the deployment, not from this file):

    {"project": "my-project", "deployment": "prod-1", "boot_image": "projects/my-project/global/images/family/corral",
     "regions": [{"name": "us-central1", "zones": ["us-central1-a", "us-central1-b"], "subnetwork": "corral"}],
     "families": {"highmem": "n2d"}, "service_account": ""}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from services.driver.providers.interface import InstanceRequest
from services.driver.providers.gcp_shapes import FAMILY, LABEL_VALUE

MAX_FILE_BYTES = 64 * 1024
MAX_REGIONS = 16
MAX_ZONES = 16


def basic_worker_args(request: InstanceRequest) -> tuple[str, ...]:
    """The worker's size and region; a deployment's builder adds its own flags (runtime, log root)."""
    return ("--cores-mcpu", str(request.cores_mcpu), "--memory-bytes", str(request.memory_bytes),
            "--storage-bytes", str(request.storage_bytes), "--region", request.region)


@dataclasses.dataclass(frozen=True)
class GcpRegion:
    name: str
    """e.g. us-central1."""
    zones: tuple[str, ...]
    """Its zones to use, in the order to try them."""
    subnetwork: str = ""
    """The name of this region's subnetwork of `GcpConfig.network` ('': an auto-mode network's)."""


@dataclasses.dataclass(frozen=True)
class WorkerBoot:
    """What every worker is told at boot, besides its name and token (WorkerBootstrap)."""

    enroll_address: str
    """host:port where a new worker enrolls (TLS, server-authenticated)."""
    driver_addresses: tuple[str, ...]
    """The internal gateway's addresses."""
    ca_cert_pem: str
    """The deployment's CA certificate (public)."""
    worker_args: Callable[[InstanceRequest], Sequence[str]] = basic_worker_args
    """The rest of the worker's command line, for a request (its `region` is the one chosen)."""


@dataclasses.dataclass(frozen=True)
class GcpConfig:
    project: str
    """The project the machines live in."""
    deployment: str
    """The `corral-deployment` label value: what alive() lists, so two deployments never see each
    other's machines."""
    regions: tuple[GcpRegion, ...]
    """The regions machines may go to, in order of preference."""
    boot_image: str
    """The boot disk's image, with corral installed: projects/P/global/images/NAME or .../family/F."""
    worker: WorkerBoot
    families: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Machine family per pool (inst_coll); pools not named here use `default_family`."""
    default_family: str = "n2"
    boot_disk_gb: int = 50
    """Boot disk size; a pool's scratch storage (InstanceRequest.storage_bytes) is added to it."""
    boot_disk_type: str = "pd-balanced"
    network: str = "global/networks/default"
    external_ip: bool = False
    """Give each machine an external address (without one, it reaches the gateway through Cloud NAT
    or a private address)."""
    service_account: str = ""
    """The email of a service account the machines run as ('': none, the machines get no Google
    credentials at all)."""
    worker_command: tuple[str, ...] = ("python3", "-m", "services.worker", "--cloud", "gcp")
    """What the startup script runs (as root, at every boot)."""
    api_endpoint: str = ""
    """The Compute Engine API's address ('': compute.googleapis.com); http://HOST:PORT for tests."""
    call_timeout_s: float = 30.0
    """Deadline of each API call."""
    operation_timeout_s: float = 300.0
    """Deadline for an insert or delete operation to be DONE."""
    max_calls: int = 8
    """API calls under way at once (each in a thread of the provider's own)."""
    billing_api_endpoint: str = ""
    """The Cloud Billing API's address, where the price catalogue is read ('': cloudbilling.googleapis.com);
    http://HOST:PORT for tests."""

    def __post_init__(self) -> None:
        if not self.regions or any(not r.zones for r in self.regions):
            raise ValueError("a GCP configuration needs regions, each with zones")
        if not self.deployment or not LABEL_VALUE.fullmatch(self.deployment):
            raise ValueError(f"deployment {self.deployment!r} is not a label value (a-z, 0-9, _ and -, <= 63)")
        if not 10 <= self.boot_disk_gb <= 65536:
            raise ValueError(f"boot_disk_gb {self.boot_disk_gb} is outside 10..65536")
        if not (0 < self.call_timeout_s <= 600 and 0 < self.operation_timeout_s <= 3600):
            raise ValueError("call_timeout_s must be in (0, 600] and operation_timeout_s in (0, 3600]")
        if not 1 <= self.max_calls <= 64:
            raise ValueError(f"max_calls {self.max_calls} is outside 1..64")


_SCALARS: dict[str, type | tuple[type, ...]] = {
    "project": str, "deployment": str, "boot_image": str, "default_family": str, "boot_disk_gb": int,
    "boot_disk_type": str, "network": str, "external_ip": bool, "service_account": str, "api_endpoint": str,
    "call_timeout_s": (int, float), "operation_timeout_s": (int, float), "max_calls": int,
    "billing_api_endpoint": str}


def load_config(path: Path, worker: WorkerBoot) -> GcpConfig:
    """A GcpConfig from a JSON file (the fields of GcpConfig but `worker`); ValueError saying which
    field is wrong."""
    raw = path.read_bytes()
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: {len(raw)} bytes; at most {MAX_FILE_BYTES}")
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    known = set(_SCALARS) | {"regions", "families", "worker_command"}
    if set(data) - known:
        raise ValueError(f"{path}: unknown fields {sorted(set(data) - known)}; known: {sorted(known)}")
    fields: dict[str, Any] = {}
    for name, kind in _SCALARS.items():
        if name in data:
            value = data[name]
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise ValueError(f"{path}: {name} must be of type {kind}")
            if isinstance(value, str) and len(value) > 1024:
                raise ValueError(f"{path}: {name} is longer than 1024 characters")
            fields[name] = value
    fields["regions"] = tuple(_region(path, r) for r in _list(path, "regions", data.get("regions"), MAX_REGIONS))
    families = data.get("families", {})
    if not isinstance(families, dict) or len(families) > 64 or not all(
            isinstance(k, str) and isinstance(v, str) and FAMILY.fullmatch(v) for k, v in families.items()):
        raise ValueError(f"{path}: families must map pool names to machine family names such as n2")
    fields["families"] = dict(families)
    if "worker_command" in data:
        fields["worker_command"] = tuple(_list(path, "worker_command", data["worker_command"], 64, str))
    missing = {"project", "deployment", "boot_image"} - set(fields)
    if missing:
        raise ValueError(f"{path}: missing {sorted(missing)}")
    try:
        return GcpConfig(worker=worker, **fields)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _list(path: Path, name: str, value: Any, most: int, item: type = object) -> list[Any]:
    if not isinstance(value, list) or not 0 < len(value) <= most or not all(isinstance(v, item) for v in value):
        raise ValueError(f"{path}: {name} must be a list of 1 to {most} items")
    return value


def _region(path: Path, value: Any) -> GcpRegion:
    if not isinstance(value, dict) or set(value) - {"name", "zones", "subnetwork"} or \
            not isinstance(value.get("name"), str) or not isinstance(value.get("subnetwork", ""), str):
        raise ValueError(f"{path}: each region is {{\"name\": ..., \"zones\": [...], \"subnetwork\": ...}}")
    zones = tuple(_list(path, f"regions[{value['name']}].zones", value.get("zones"), MAX_ZONES, str))
    if not all(z.startswith(value["name"] + "-") for z in zones):
        raise ValueError(f"{path}: the zones of {value['name']} must be in it ({list(zones)})")
    return GcpRegion(value["name"], zones, value.get("subnetwork", ""))
