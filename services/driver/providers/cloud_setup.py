"""Which machines a driver makes: the choice of provider (`--provider local|gcp|azure`), the cloud's
configuration file (`--provider-config`), and the boot data every cloud machine is given.

A cloud's file holds what an operator decides about the cloud (project or subscription, regions, image,
network; docs/operations.md); what a worker is told at boot comes from the deployment instead, and is
added here: where it enrolls (the internal gateway's enrollment listener), where the drivers are (the
internal gateway), the CA certificate, and the rest of its command line. No key travels: a machine makes
its own and enrolls with its one-time token (worker_metadata.WorkerBootstrap).

The configuration is read and checked when the driver starts (`load`), so a wrong file stops it at once,
saying which field; the provider is opened later, inside the driver's event loop (`open_provider`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from services.common.image_refs import Mirror
from services.driver.providers.interface import InstanceProvider, InstanceRequest
from services.driver.pricing.price_file import PriceFile
from services.driver.pricing.refresh import Catalog

log = logging.getLogger(__name__)

PROVIDERS = ("local", "gcp", "azure")
CLOUD_SCRATCH_DIR = "/var/lib/corral/scratch"
"""A cloud worker's scratch space (jobs' working directories, the image cache), on the machine's boot
disk unless its image mounts another disk there."""
MAX_CONFIG_BYTES = 256 * 1024
"""Larger configuration files are refused before they are parsed."""


@dataclasses.dataclass(frozen=True)
class WorkerBootArgs:
    """What every cloud worker of the deployment is told besides its name, token and size."""

    enroll_address: str
    """host:port where a machine without a certificate enrolls: the internal gateway's enrollment listener."""
    driver_addresses: tuple[str, ...]
    """Where workers reach the leading driver: the internal gateway."""
    ca_cert_pem: str
    """The deployment's CA certificate (public), to authenticate both."""
    worker_args: tuple[str, ...]
    """The rest of `python -m services.worker`'s command line shared by every machine (log root, storage
    access, runtime, registry, scratch directory)."""


def cloud_worker_args(log_root_url: str, runtime: str, storage_access_args: Sequence[str] = (),
                      own_registry: str | None = None, allowed_registries: Sequence[str] = (),
                      limits_args: Sequence[str] = (), mirrors: Sequence[Mirror] = ()) -> tuple[str, ...]:
    """The command line shared by every cloud worker: `--scratch-dir`, `--log-root-url`, how it reaches
    gs:// and az:// storage (paths of secret files on the machine's image, never their contents),
    `--runtime`, the own registry, the mirrors, the registries allowed although not public, and the
    deployment's limits on jobs (services.common.worker_limits)."""
    return ("--scratch-dir", CLOUD_SCRATCH_DIR, "--log-root-url", log_root_url, *storage_access_args, *limits_args,
            "--runtime", runtime, *(["--own-registry", own_registry] if own_registry else []),
            *(arg for mirror in mirrors for arg in ("--registry-mirror", str(mirror))),
            *(["--allowed-registries", ",".join(allowed_registries)] if allowed_registries else []))


@dataclasses.dataclass(frozen=True)
class CloudSetup:
    """A cloud provider's loaded configuration (GcpConfig or AzureConfig, boot data included)."""

    kind: str
    """gcp or azure."""
    config: Any
    """services.driver.providers.gcp_config.GcpConfig or azure_config.AzureConfig."""

    @property
    def region(self) -> str:
        """Where the autoscaler asks for machines first: the configuration's first region (GCP) or
        location (Azure); the provider falls back to the others for region-agnostic requests."""
        return self.config.regions[0].name if self.kind == "gcp" else self.config.locations[0]

    @property
    def regions(self) -> tuple[str, ...]:
        """Every region it makes machines in (GCP `regions`, Azure `locations`), in order of preference."""
        return tuple(r.name for r in self.config.regions) if self.kind == "gcp" else tuple(self.config.locations)


def check_flags(provider: str, config_file: Path | None, enroll_address: str | None,
                driver_addresses: Sequence[str], local_only: Sequence[str]) -> None:
    """ValueError, saying what is wrong, for a combination of driver flags that cannot work:
    a cloud without its configuration or without the addresses its workers need, a configuration
    without a cloud, or flags about local workers (`local_only`, the names of those given) with a cloud."""
    if provider not in PROVIDERS:
        raise ValueError(f"--provider {provider!r}: one of {', '.join(PROVIDERS)}")
    if provider == "local":
        if config_file is not None:
            raise ValueError("--provider-config is for --provider gcp or azure; the local provider takes none")
        return
    missing = [flag for flag, given in (("--provider-config", config_file is not None),
                                        ("--workers-enroll-address", bool(enroll_address)),
                                        ("--driver-addresses", bool(driver_addresses))) if not given]
    if missing:
        raise ValueError(f"--provider {provider} needs {', '.join(missing)} (its workers enroll and find the "
                         "drivers through the internal gateway's addresses)")
    if local_only:
        raise ValueError(f"{', '.join(local_only)}: about local workers; --provider {provider} starts none")


def load(provider: str, path: Path, boot: WorkerBootArgs) -> CloudSetup:
    """The cloud's configuration from its JSON file, with the deployment's boot data; ValueError
    naming the file and what is wrong in it."""
    from services.driver.providers import azure_config, gcp_config  # the cloud SDKs' models, clouds only

    if provider == "gcp":
        def worker_args(request: InstanceRequest) -> tuple[str, ...]:
            return (*gcp_config.basic_worker_args(request), *boot.worker_args)

        worker = gcp_config.WorkerBoot(boot.enroll_address, boot.driver_addresses, boot.ca_cert_pem, worker_args)
        return CloudSetup("gcp", gcp_config.load_config(path, worker))
    if provider == "azure":
        raw = path.read_bytes()
        if len(raw) > MAX_CONFIG_BYTES:
            raise ValueError(f"{path}: {len(raw)} bytes; at most {MAX_CONFIG_BYTES}")
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ValueError(f"{path}: not JSON: {e}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a JSON object")
        if "boot" in data:
            raise ValueError(f"{path}: `boot` comes from the deployment (the driver's flags), not from this file")
        data["boot"] = {"enroll_address": boot.enroll_address, "driver_addresses": list(boot.driver_addresses),
                        "ca_cert_pem": boot.ca_cert_pem, "worker_args": list(boot.worker_args)}
        try:
            return CloudSetup("azure", azure_config.load_config(json.dumps(data)))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    raise ValueError(f"--provider {provider!r} has no configuration file")


def open_provider(setup: CloudSetup) -> InstanceProvider:
    """The cloud's provider, with the driver's own credentials: Application Default Credentials on GCP
    (the machine's service account, or GOOGLE_APPLICATION_CREDENTIALS), DefaultAzureCredential on Azure
    (the managed identity). Opened inside the driver's event loop; close it with `close_provider`."""
    if setup.kind == "gcp":
        from services.driver.providers.gcp import GcpProvider
        return GcpProvider(setup.config)
    from services.driver.providers.azure import AzureProvider
    # azure-core logs every request and response (headers, the token redacted) at INFO: the driver's
    # log would be mostly that. Its warnings and errors still show.
    logging.getLogger("azure").setLevel(logging.WARNING)
    return AzureProvider(setup.config)


def open_catalog(setup: CloudSetup, prices: PriceFile) -> Catalog:
    """The cloud's price catalogue, read with the driver's own credentials on GCP (the Cloud Billing
    Catalog API); Azure's Retail Prices API is public. `prices` gives each Azure size's vCPUs and memory,
    which split its hourly price (services.driver.pricing.products)."""
    from services.driver.pricing import catalogs  # the cloud SDKs, clouds only

    if setup.kind == "gcp":
        from services.driver.pricing.catalog_gcp import gcp_catalog_settings
        return catalogs.GcpCatalog(gcp_catalog_settings(setup.config))
    from services.driver.pricing.catalog_azure import azure_retail_settings
    return catalogs.AzureCatalog(azure_retail_settings(setup.config), prices.azure_sizes)


async def close_provider(provider: Any) -> None:
    """Close a provider, whichever kind (GCP's close is blocking: its threads finish their calls)."""
    if inspect.iscoroutinefunction(provider.close):
        await provider.close()
    else:
        await asyncio.to_thread(provider.close)


class MachineDeleter:
    """Deletes the machine of a worker that deactivated itself (idle, drained, or preempted), at once: a
    local worker's process ends with it, a cloud machine does not. Each delete runs in a task of its own
    (the worker waits for its DeactivateWorker answer, not for the cloud); a failed one is logged, and the
    machine is left for the next attempt to delete it (the dead-worker detector, reconciliation)."""

    def __init__(self, provider: InstanceProvider):
        self._provider = provider
        self._tasks: set[asyncio.Task[None]] = set()

    def __call__(self, name: str) -> None:
        task = asyncio.get_running_loop().create_task(self._delete(name))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete(self, name: str) -> None:
        try:
            await self._provider.delete(name)
            log.info("deleted the machine of %s, whose worker deactivated itself", name)
        except Exception:  # noqa: BLE001 - logged; the machine is deleted again later
            log.exception("could not delete the machine of %s", name)

    async def close(self) -> None:
        """Wait for the deletes under way (before the provider closes)."""
        await asyncio.gather(*self._tasks, return_exceptions=True)
