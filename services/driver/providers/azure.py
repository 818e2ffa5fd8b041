"""Azure virtual machines as corral workers, through the real SDKs (azure-mgmt-compute and
azure-mgmt-network, their asyncio clients).

A machine is a NIC (in the configured subnet) and a VM on it: Spot with eviction policy Delete for a
preemptible request, Regular otherwise; tagged with the deployment and pool; its `userData` is the
worker's boot contract (`WorkerBootstrap`, base64 JSON, with the one-time activation token) and its
`customData` a cloud-init shell script that starts `python3 -m services.worker --cloud azure`. The
NIC and the OS disk are created with deleteOption Delete, so an evicted VM takes them with it; a
deleted one is cleaned up explicitly as well.

Every failure leaves as one of `providers.errors`' kinds, with the location set, so the autoscaler
tries another location on a quota or capacity refusal and stops for an operator on a permission one.
The userData is never logged: it holds the activation token (the SDK logs headers, not bodies, unless
`logging_enable` is set, which this module never does).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Collection
from types import TracebackType
from typing import Any

from azure.core.credentials_async import AsyncTokenCredential
from azure.core.exceptions import (AzureError, ClientAuthenticationError, ResourceNotFoundError, ServiceRequestError,
                                   ServiceResponseError)
from azure.core.polling import AsyncLROPoller
from azure.mgmt.compute import models as compute_models
from azure.mgmt.compute.aio import ComputeManagementClient
from azure.mgmt.network import models as network_models
from azure.mgmt.network.aio import NetworkManagementClient

from services.driver.providers.interface import InstanceRequest
from services.driver.pricing.products import Machine
from services.driver.providers.azure_config import AzureConfig, vm_size, vm_sizes
from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, PermissionDenied, ProviderError,
                                              QuotaExceeded, TransientError)
from services.driver.providers.worker_metadata import WorkerBootstrap

log = logging.getLogger(__name__)

DEPLOYMENT_TAG = "corral-deployment"
POOL_TAG = "corral-pool"
MAX_CUSTOM_DATA_BYTES = 65535
"""Azure: customData is at most 64 KB before base64."""
MAX_USER_DATA_B64 = 65536
"""Azure: userData is at most 64 KB, base64 encoded."""
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,52}[a-z0-9]$")
"""VM names corral asks for: lower case (Linux computerName allows 64; room is kept for suffixes)."""

# ARM error codes (tests/clouds/azure/README.md cites the pages): what each means to the autoscaler.
_QUOTA_CODES = {"QuotaExceeded", "OperationNotAllowed"}
_CAPACITY_CODES = {"AllocationFailed", "ZonalAllocationFailed", "SkuNotAvailable", "OverconstrainedAllocationRequest",
                   "OverconstrainedZonalAllocationRequest"}
_PERMISSION_CODES = {"AuthorizationFailed", "LinkedAuthorizationFailed", "InvalidAuthenticationToken",
                     "AuthenticationFailed", "SubscriptionNotFound"}
_TRANSIENT_CODES = {"TooManyRequests", "RetryableError", "InternalServerError", "InternalExecutionError"}


def startup_script(install_dir: str) -> str:
    """The VM's customData: cloud-init runs it once at first boot. It holds no secret: the worker reads
    its token from the metadata service (userData)."""
    return ("#!/bin/sh\n"
            "# corral worker: its boot contract is in this VM's userData (the metadata service).\n"
            "set -eu\n"
            f"cd '{install_dir}'\n"
            "exec python3 -m services.worker --cloud azure >>/var/log/corral-worker.log 2>&1\n")


def provider_error(error: AzureError, location: str) -> ProviderError:
    """The typed error an Azure failure means to the autoscaler."""
    code, message = _code_and_message(error)
    text = f"{code or type(error).__name__}: {message}"[:1000]
    status = getattr(error, "status_code", None)
    if isinstance(error, ClientAuthenticationError) or code in _PERMISSION_CODES or status == 403:
        return PermissionDenied(text, region=location)
    if code in _QUOTA_CODES and (code == "QuotaExceeded" or "quota" in message.lower()):
        return QuotaExceeded(text, region=location)
    if code in _CAPACITY_CODES:
        return CapacityExhausted(text, region=location)
    if (code in _TRANSIENT_CODES or isinstance(error, (ServiceRequestError, ServiceResponseError))
            or status is None or status == 429 or status >= 500):
        return TransientError(text, region=location)
    return InvalidRequest(text, region=location)


def _code_and_message(error: AzureError) -> tuple[str, str]:
    """The ARM error code and message: from the parsed error, else the body (a failed long-running
    operation's status document has it under "error")."""
    parsed = getattr(error, "error", None)
    if parsed is not None and getattr(parsed, "code", None):
        return str(parsed.code), str(getattr(parsed, "message", "") or "")
    response = getattr(error, "response", None)
    if response is not None:
        with contextlib.suppress(Exception):
            body = response.json()
            if isinstance(body, dict) and isinstance(body.get("error"), dict):
                return str(body["error"].get("code", "")), str(body["error"].get("message", ""))
    return "", str(getattr(error, "message", "") or error)


class AzureProvider:
    """`InstanceProvider` on Azure virtual machines."""

    def __init__(self, config: AzureConfig, credential: AsyncTokenCredential | None = None):
        self._config = config
        self._owned_credential = credential is None
        if credential is None:
            # Production: the driver's managed identity (or any DefaultAzureCredential source).
            from azure.identity.aio import DefaultAzureCredential
            credential = DefaultAzureCredential()
        self._credential = credential
        options: dict[str, Any] = {"connection_verify": config.connection_verify, "retry_total": config.retry_total,
                                   "polling_interval": config.poll_interval_s, "logging_enable": False,
                                   "credential_scopes": [config.credential_scope]}
        if config.base_url:
            options["base_url"] = config.base_url
        self._compute = ComputeManagementClient(credential, config.subscription_id, **options)
        self._network = NetworkManagementClient(credential, config.subscription_id, **options)

    async def __aenter__(self) -> AzureProvider:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close both clients' sessions (and the credential this provider made)."""
        await self._compute.close()
        await self._network.close()
        if self._owned_credential:
            await self._credential.close()

    # -- InstanceProvider ----------------------------------------------------------------------------

    def machine(self, request: InstanceRequest) -> Machine:
        """Priced by its VM size: the pool's named one, or the one `vm_size` picks for its cores and memory."""
        return Machine("azure", self._size(request), request.preemptible, request.region)

    def machine_kinds(self) -> set[Machine]:
        """The machines its pools may get, for their prices: every size `vm_size` picks from and every size
        the configuration names, spot or not, in each location."""
        return {Machine("azure", size, spot, location) for size in {*vm_sizes(), *self._config.vm_sizes.values()}
                for spot in (False, True) for location in self._config.locations}

    def _size(self, request: InstanceRequest) -> str:
        return self._config.vm_sizes.get(request.inst_coll) or vm_size(request.cores_mcpu, request.memory_bytes)

    async def create(self, request: InstanceRequest) -> str:
        if not _NAME.match(request.name):
            raise InvalidRequest(f"instance name {request.name!r} is not a valid Azure VM name (a-z, 0-9, -)")
        # The asked location first; with `any_region` (jobs that may run anywhere), then every other one in
        # the configured order, as the GCP provider does.
        asked = tuple(loc for loc in self._config.locations if loc == request.region)
        if not asked and not request.any_region:
            raise InvalidRequest(f"region {request.region!r} is not one of {self._config.locations}",
                                 region=request.region)
        locations = asked + tuple(loc for loc in self._config.locations if loc != request.region) \
            if request.any_region else asked
        size = self._size(request)
        refused: ProviderError | None = None
        for location in locations:
            try:
                await self._create_in(location, request, size)
                log.info("azure: created %s (%s%s) in %s", request.name, size,
                         ", spot" if request.preemptible else "", location)
                return location
            except ProviderError as error:
                if not error.retry_elsewhere:
                    raise
                log.warning("azure: %s refused in %s: %s", request.name, location, error)
                refused = error
        assert refused is not None
        raise refused

    async def delete(self, name: str) -> None:
        """Delete the VM, then its NIC and OS disk (already gone with it when their deleteOption did
        it; a delete of what is not there succeeds)."""
        await self._delete_resources(name)

    async def alive(self) -> set[str]:
        names: set[str] = set()
        try:
            async with self._timeout(""):
                async for vm in self._compute.virtual_machines.list(self._config.resource_group):
                    if (vm.tags or {}).get(DEPLOYMENT_TAG) == self._config.deployment and vm.name:
                        names.add(vm.name)
        except AzureError as error:
            raise provider_error(error, "") from error
        return names

    async def gone(self, names: Collection[str]) -> set[str]:
        return set()  # a machine being created may not be listed yet: the reconciler's grace decides

    # -- steps ---------------------------------------------------------------------------------------

    async def _create_in(self, location: str, request: InstanceRequest, size: str) -> None:
        user_data = self._user_data(request, location)
        try:
            nic_id = await self._create_nic(location, request)
            await self._create_vm(location, request, size, nic_id, user_data)
        except BaseException:
            # A VM refused at once leaves the NIC; one failed in its operation (AllocationFailed) is
            # left Failed: remove both, so a retry elsewhere starts clean and nothing is billed.
            try:
                await asyncio.shield(self._delete_resources(request.name))
            except ProviderError as cleanup:
                log.warning("azure: could not clean up %s after a failed create: %s", request.name, cleanup)
            raise

    async def _create_nic(self, location: str, request: InstanceRequest) -> str:
        nic = network_models.NetworkInterface(
            location=location, tags=self._tags(request),
            properties=network_models.NetworkInterfacePropertiesFormat(ip_configurations=[
                network_models.NetworkInterfaceIPConfiguration(
                    name="ipconfig1", properties=network_models.NetworkInterfaceIPConfigurationPropertiesFormat(
                        subnet=network_models.Subnet(id=self._config.subnet_id),
                        private_ip_allocation_method="Dynamic"))]))
        created = await self._finish(location, self._network.network_interfaces.begin_create_or_update(
            self._config.resource_group, _nic_name(request.name), nic))
        if not created.id:
            raise TransientError(f"network interface of {request.name} has no id", region=location)
        return str(created.id)

    async def _create_vm(self, location: str, request: InstanceRequest, size: str, nic_id: str,
                         user_data: str) -> None:
        spot = request.preemptible
        config = self._config
        custom_data = startup_script(config.install_dir).encode()
        if len(custom_data) > MAX_CUSTOM_DATA_BYTES:
            raise InvalidRequest(f"startup script is {len(custom_data)} bytes; Azure takes {MAX_CUSTOM_DATA_BYTES}")
        properties = compute_models.VirtualMachineProperties(
            hardware_profile=compute_models.HardwareProfile(vm_size=size),
            priority="Spot" if spot else "Regular",
            eviction_policy="Delete" if spot else None,
            # -1: pay up to the on-demand price; evicted for capacity only, never for price.
            billing_profile=compute_models.BillingProfile(max_price=-1) if spot else None,
            storage_profile=compute_models.StorageProfile(
                image_reference=config.image.model(),
                os_disk=compute_models.OSDisk(
                    name=_disk_name(request.name), create_option="FromImage", caching="ReadWrite",
                    delete_option="Delete", disk_size_gb=config.os_disk_size_gb,
                    managed_disk=compute_models.ManagedDiskParameters(storage_account_type=config.os_disk_type))),
            os_profile=compute_models.OSProfile(
                computer_name=request.name, admin_username=config.admin_username,
                custom_data=base64.b64encode(custom_data).decode(),
                linux_configuration=compute_models.LinuxConfiguration(
                    disable_password_authentication=True,
                    ssh=compute_models.SshConfiguration(public_keys=[compute_models.SshPublicKey(
                        path=f"/home/{config.admin_username}/.ssh/authorized_keys",
                        key_data=config.ssh_public_key)]))),
            network_profile=compute_models.NetworkProfile(network_interfaces=[
                compute_models.NetworkInterfaceReference(
                    id=nic_id, properties=compute_models.NetworkInterfaceReferenceProperties(
                        primary=True, delete_option="Delete"))]),
            user_data=user_data)
        vm = compute_models.VirtualMachine(location=location, tags=self._tags(request), properties=properties)
        await self._finish(location, self._compute.virtual_machines.begin_create_or_update(
            config.resource_group, request.name, vm))

    async def _delete_resources(self, name: str) -> None:
        group = self._config.resource_group
        for begin in (lambda: self._compute.virtual_machines.begin_delete(group, name),
                      lambda: self._network.network_interfaces.begin_delete(group, _nic_name(name)),
                      lambda: self._compute.disks.begin_delete(group, _disk_name(name))):
            # A missing resource answers 204; a missing resource group 404: either way, nothing to delete.
            await self._finish("", begin(), missing_ok=True)

    async def _finish(self, location: str, begin: Awaitable[AsyncLROPoller[Any]], missing_ok: bool = False) -> Any:
        """Start a long-running operation and await its result as the SDK polls it, within the time-out."""
        try:
            async with self._timeout(location):
                poller = await begin
                return await poller.result()
        except ResourceNotFoundError as error:
            if missing_ok:
                return None
            raise provider_error(error, location) from error
        except AzureError as error:
            raise provider_error(error, location) from error

    @contextlib.asynccontextmanager
    async def _timeout(self, location: str) -> AsyncIterator[None]:
        try:
            async with asyncio.timeout(self._config.operation_timeout_s):
                yield
        except TimeoutError as error:
            raise TransientError(f"no answer from Azure in {self._config.operation_timeout_s} s",
                                 region=location) from error

    # -- what a machine carries ----------------------------------------------------------------------

    def _tags(self, request: InstanceRequest) -> dict[str, str]:
        return {DEPLOYMENT_TAG: self._config.deployment, POOL_TAG: request.inst_coll}

    def _user_data(self, request: InstanceRequest, location: str) -> str:
        boot = self._config.boot
        bootstrap = WorkerBootstrap(
            instance_name=request.name, activation_token=request.activation_token,
            enroll_address=boot.enroll_address, driver_addresses=boot.driver_addresses,
            ca_cert_pem=boot.ca_cert_pem,
            worker_args=("--cores-mcpu", str(request.cores_mcpu), "--memory-bytes", str(request.memory_bytes),
                         "--storage-bytes", str(request.storage_bytes), "--region", location, *boot.worker_args))
        try:
            encoded = base64.b64encode(bootstrap.to_json().encode()).decode()
        except ValueError as error:
            raise InvalidRequest(str(error), region=location) from None
        if len(encoded) > MAX_USER_DATA_B64:
            raise InvalidRequest(f"userData is {len(encoded)} bytes in base64; Azure takes {MAX_USER_DATA_B64}",
                                 region=location)
        return encoded


def _nic_name(name: str) -> str:
    return f"{name}-nic"


def _disk_name(name: str) -> str:
    return f"{name}-osdisk"
