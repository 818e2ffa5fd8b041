"""The GCP instance provider: Compute Engine VMs that run a corral worker, through google-cloud-compute's
REST transport.

`create` picks a zone: the request's region first (then, for a request whose jobs may run anywhere,
the other configured regions in order), skipping a region whose quotas (regions.get) cannot take the
machine and a zone that answers ZONE_RESOURCE_POOL_EXHAUSTED; it returns once the insert operation is
DONE. The machine learns what it needs from its metadata: `corral-worker` (a WorkerBootstrap: a
one-time token and the CA, never a key) and `startup-script` (which starts the worker). Every machine
carries the labels `corral-deployment` and `corral-pool`; `alive` lists by the first.

The SDK is blocking: each call runs in a thread with a deadline. Operations are awaited with
zoneOperations.wait, not ExtendedOperation.result(): the SDK builds the client that result() polls
with the default endpoint, not the one configured here (instances transport's
`_zone_operations_client`), so result() would poll compute.googleapis.com whatever `api_endpoint` says.
The metadata holds the activation token: no Instance object or metadata value is ever logged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import shlex
import time
import uuid
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.cloud import compute_v1

from services.driver.providers.interface import InstanceRequest
from services.driver.pricing.products import Machine, gcp_series
from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, ProviderError, QuotaExceeded,
                                              TransientError)
from services.driver.providers.gcp_config import GcpConfig, GcpRegion
from services.driver.providers.gcp_shapes import (GIB, MachineType, RegionQuota, check_instance_name, classify,
                                                  label_value, machine_type, named_machine_type, quota_shortfall)
from services.driver.providers.worker_metadata import METADATA_KEY, WorkerBootstrap

log = logging.getLogger(__name__)

DEPLOYMENT_LABEL = "corral-deployment"
POOL_LABEL = "corral-pool"
WAIT_HOLD_S = 120.0
"""How long zoneOperations.wait may hold a call before answering (about two minutes, says its reference)."""
PAGE_SIZE = 500
"""Instances per page of an aggregated list (Compute Engine's maximum)."""
MAX_LISTED = 10_000
"""alive() refuses to read more machines than this (a filter gone wrong, not a deployment)."""


class GcpProvider:
    """Compute Engine machines behind services.driver.providers.interface.InstanceProvider."""

    def __init__(self, config: GcpConfig, credentials: Credentials | None = None):
        """`credentials`: None reads Application Default Credentials (the driver's service account)."""
        self._config = config
        options = ClientOptions(api_endpoint=config.api_endpoint) if config.api_endpoint else None
        clients: dict[str, Any] = {"credentials": credentials, "transport": "rest", "client_options": options}
        self._instances = compute_v1.InstancesClient(**clients)
        self._operations = compute_v1.ZoneOperationsClient(**clients)
        self._regions = compute_v1.RegionsClient(**clients)
        self._zones: dict[str, str] = {}
        """Each known machine's zone (created or listed here), so delete needs no search."""
        self._executor = ThreadPoolExecutor(max_workers=config.max_calls, thread_name_prefix="gcp-api")

    def close(self) -> None:
        """Closes the clients' HTTP sessions and the provider's threads."""
        self._executor.shutdown(wait=True, cancel_futures=True)
        for client in (self._instances, self._operations, self._regions):
            client.transport.close()

    def zone_of(self, name: str) -> str | None:
        """Where a machine this provider created or listed is."""
        return self._zones.get(name)

    def machine(self, request: InstanceRequest) -> Machine:
        """Priced by its series (n2 for n2-standard-8): the pool's family, or a named machine type's."""
        series = gcp_series(request.machine_type) if request.machine_type else \
            self._config.families.get(request.inst_coll, self._config.default_family)
        return Machine("gcp", series, request.preemptible, request.region)

    def machine_kinds(self) -> set[Machine]:
        """The machines its pools may get, for their prices: each configured family, spot or not, in each
        region."""
        families = {self._config.default_family, *self._config.families.values()}
        return {Machine("gcp", family, spot, region.name) for family in families for spot in (False, True)
                for region in self._config.regions}

    async def create(self, request: InstanceRequest) -> str:
        check_instance_name(request.name)
        if request.machine_type:
            machine = named_machine_type(request.machine_type, request.cores_mcpu)
            family = machine.name.split("-")[0]  # whose CPU quota it takes (C3_CPUS for c3-highcpu-4)
        else:
            family = self._config.families.get(request.inst_coll, self._config.default_family)
            machine = machine_type(family, request.cores_mcpu, request.memory_bytes)
        refusals: list[ProviderError] = []
        for region in self._regions_for(request):
            described = await self._call(self._regions.get, region=region.name, project=self._config.project,
                                         where=(region.name, ""))
            if _named(described.status) == "DOWN":
                log.info("gcp: %s: region %s is down", request.name, region.name)
                refusals.append(CapacityExhausted(f"{region.name} is DOWN", region=region.name))
                continue
            quotas = [RegionQuota(q.metric, q.limit, q.usage) for q in described.quotas]
            shortfall = quota_shortfall(quotas, machine, family, request.preemptible)
            if shortfall:
                log.info("gcp: %s does not fit in %s: %s", request.name, region.name, shortfall)
                refusals.append(QuotaExceeded(f"{region.name}: {shortfall}", region=region.name))
                continue
            for zone in region.zones:
                try:
                    await self._insert(request, region, zone, machine)
                    self._zones[request.name] = zone
                    return region.name
                except CapacityExhausted as e:
                    log.info("gcp: %s: zone %s is out of %s: %s", request.name, zone, machine.name, e)
                    refusals.append(e)
                except QuotaExceeded as e:  # its quota was taken since regions.get
                    log.info("gcp: %s: %s's quota refused it: %s", request.name, region.name, e)
                    refusals.append(e)
                    break
        raise _refusal(request, refusals)

    def _regions_for(self, request: InstanceRequest) -> list[GcpRegion]:
        asked = [r for r in self._config.regions if r.name == request.region]
        if not asked and not request.any_region:
            raise InvalidRequest(f"region {request.region!r} is not one of this deployment's GCP regions",
                                 region=request.region)
        return asked + [r for r in self._config.regions if r.name != request.region] if request.any_region \
            else asked

    async def _insert(self, request: InstanceRequest, region: GcpRegion, zone: str, machine: MachineType) -> None:
        placed = dataclasses.replace(request, region=region.name)
        log.info("gcp: creating %s (%s, %s) in %s", request.name, machine.name,
                 "spot" if request.preemptible else "on-demand", zone)
        insert = compute_v1.InsertInstanceRequest(
            project=self._config.project, zone=zone, instance_resource=self._instance(placed, region, zone, machine),
            # The same id for the same machine in the same zone: an insert retried after a lost answer
            # is the same insert.
            request_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self._config.project}/{zone}/{request.name}")))
        operation = await self._call(self._instances.insert_unary, request=insert, where=(region.name, zone))
        await self._wait(operation, region.name, zone)
        log.info("gcp: created %s in %s", request.name, zone)

    def _instance(self, request: InstanceRequest, region: GcpRegion, zone: str,
                  machine: MachineType) -> compute_v1.Instance:
        config = self._config
        labels = {DEPLOYMENT_LABEL: config.deployment, POOL_LABEL: label_value(request.inst_coll)}
        bootstrap = WorkerBootstrap(request.name, request.activation_token, config.worker.enroll_address,
                                    tuple(config.worker.driver_addresses), config.worker.ca_cert_pem,
                                    tuple(config.worker.worker_args(request)))
        script = ("#!/bin/sh\n# Starts corral's worker; it reads its settings from the metadata item "
                  f"{METADATA_KEY}.\nexec {shlex.join(config.worker_command)}\n")
        if request.preemptible:
            # Spot: reclaimed machines are deleted, not kept stopped (a stopped one still costs its disk).
            scheduling = compute_v1.Scheduling(provisioning_model="SPOT", instance_termination_action="DELETE",
                                               automatic_restart=False, on_host_maintenance="TERMINATE")
        else:
            scheduling = compute_v1.Scheduling(provisioning_model="STANDARD", automatic_restart=True,
                                               on_host_maintenance="MIGRATE")
        interface = compute_v1.NetworkInterface(network=config.network)
        if region.subnetwork:
            interface.subnetwork = f"regions/{region.name}/subnetworks/{region.subnetwork}"
        if config.external_ip:
            interface.access_configs = [compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")]
        instance = compute_v1.Instance(
            name=request.name,
            machine_type=f"zones/{zone}/machineTypes/{machine.name}",
            labels=labels,
            disks=[compute_v1.AttachedDisk(
                boot=True, auto_delete=True, type_="PERSISTENT",
                initialize_params=compute_v1.AttachedDiskInitializeParams(
                    source_image=config.boot_image, disk_type=f"zones/{zone}/diskTypes/{config.boot_disk_type}",
                    disk_size_gb=config.boot_disk_gb + math.ceil(request.storage_bytes / GIB), labels=labels))],
            network_interfaces=[interface],
            metadata=compute_v1.Metadata(items=[compute_v1.Items(key=METADATA_KEY, value=bootstrap.to_json()),
                                                compute_v1.Items(key="startup-script", value=script)]),
            scheduling=scheduling)
        if config.service_account:
            instance.service_accounts = [compute_v1.ServiceAccount(
                email=config.service_account, scopes=["https://www.googleapis.com/auth/cloud-platform"])]
        return instance

    async def delete(self, name: str) -> None:
        try:
            check_instance_name(name)
        except InvalidRequest:
            return  # no VM can have that name (and it is never put in a list filter)
        zone = self._zones.get(name) or await self._find(name)
        if zone is None:
            return
        try:
            operation = await self._call(self._instances.delete_unary, project=self._config.project, zone=zone,
                                         instance=name, where=("", zone), missing_is_gone=True)
            await self._wait(operation, "", zone)
        except _Gone:
            pass
        self._zones.pop(name, None)
        log.info("gcp: deleted %s in %s", name, zone)

    async def _find(self, name: str) -> str | None:
        """The zone of a machine of this deployment this provider has not seen (made by another driver)."""
        found = await self._list(f'(name = "{name}") (labels.{DEPLOYMENT_LABEL} = "{self._config.deployment}")')
        return found.get(name)

    async def alive(self) -> set[str]:
        found = await self._list(f'labels.{DEPLOYMENT_LABEL} = "{self._config.deployment}"')
        self._zones = {**{n: z for n, z in self._zones.items() if n in found}, **found}
        return set(found)

    async def gone(self, names: Collection[str]) -> set[str]:
        return set()  # a machine being created may not be listed yet: the reconciler's grace decides

    async def _list(self, filter_: str) -> dict[str, str]:
        """Name → zone of the deployment's machines that `filter_` selects, across every zone."""
        def read() -> dict[str, str]:
            found: dict[str, str] = {}
            listing = compute_v1.AggregatedListInstancesRequest(project=self._config.project, filter=filter_,
                                                                max_results=PAGE_SIZE)
            pages = self._instances.aggregated_list(request=listing, timeout=self._config.call_timeout_s)
            for _scope, scoped in pages:
                for instance in scoped.instances:
                    found[instance.name] = instance.zone.rsplit("/", 1)[-1]
                if len(found) > MAX_LISTED:
                    raise InvalidRequest(f"more than {MAX_LISTED} machines carry {filter_}")
            return found
        return await self._run(read, ("", ""))

    async def _wait(self, operation: compute_v1.Operation, region: str, zone: str) -> None:
        """Until `operation` is DONE (zoneOperations.wait answers when it is, or after a while); raises
        the typed error of a failed one."""
        deadline = time.monotonic() + self._config.operation_timeout_s
        while _named(operation.status) != "DONE":
            if time.monotonic() > deadline:
                raise TransientError(f"operation {operation.name} not done after "
                                     f"{self._config.operation_timeout_s:g} s", region=region, zone=zone)
            # wait holds the call until DONE or about two minutes: its deadline is longer than a call's.
            hold_s = max(1.0, min(deadline - time.monotonic(), WAIT_HOLD_S + self._config.call_timeout_s))
            operation = await self._call(self._operations.wait, project=self._config.project, zone=zone,
                                         operation=operation.name, where=(region, zone), timeout=hold_s)
        errors = list(operation.error.errors)
        if errors:
            status = operation.http_error_status_code
            if status == 404:
                raise _Gone()
            message = "; ".join(f"{e.code}: {e.message}" for e in errors)
            raise classify(status, [e.code for e in errors], f"{operation.operation_type} {operation.target_link}"
                           f" failed: {message}", region=region, zone=zone)

    async def _call(self, method: Callable[..., Any], *, where: tuple[str, str], missing_is_gone: bool = False,
                    **kwargs: Any) -> Any:
        """`method(**kwargs)`, an SDK call, with the call deadline (unless `timeout` is given)."""
        kwargs.setdefault("timeout", self._config.call_timeout_s)
        return await self._run(functools.partial(method, **kwargs), where, missing_is_gone)

    async def _run(self, work: Callable[[], Any], where: tuple[str, str], missing_is_gone: bool = False) -> Any:
        """`work()` in one of this provider's threads (the SDK blocks, and a wait holds its thread for
        minutes: the driver's default executor is left alone), its failures as typed errors."""
        region, zone = where
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        except api_exceptions.GoogleAPICallError as e:
            if missing_is_gone and isinstance(e, api_exceptions.NotFound):
                raise _Gone() from e
            raise classify(int(e.code or 0), _reasons(e), str(e.message), region=region, zone=zone) from e
        except (google.auth.exceptions.RefreshError, google.auth.exceptions.DefaultCredentialsError) as e:
            raise classify(401, [], f"credentials: {e}", region=region, zone=zone) from e
        except (requests.RequestException, google.auth.exceptions.TransportError, api_exceptions.RetryError) as e:
            raise TransientError(f"Compute Engine unreachable: {type(e).__name__}: {e}", region=region,
                                 zone=zone) from e


def _named(value: Any) -> str:
    """An enum field's name: the SDK gives some as enums (Operation.status), others as strings
    (Region.status)."""
    return str(getattr(value, "name", value))


class _Gone(Exception):
    """The machine is not there (a 404): for delete, done."""


def _reasons(error: api_exceptions.GoogleAPICallError) -> list[str]:
    reasons = [e.get("reason", "") for e in error.errors if isinstance(e, dict)]
    return [r for r in reasons + [error.reason or ""] if r]


def _refusal(request: InstanceRequest, refusals: list[ProviderError]) -> ProviderError:
    """One error for every place that refused: capacity if any zone was full (trying later may work),
    else quota."""
    summary = f"no room for {request.name}: " + "; ".join(str(r) for r in refusals)
    full = [r for r in refusals if isinstance(r, CapacityExhausted)]
    if full:
        return CapacityExhausted(summary, region=full[-1].region or request.region, zone=full[-1].zone)
    first = refusals[0] if refusals else None
    return QuotaExceeded(summary, region=first.region if first else request.region)
