"""The Azure provider through the real azure-mgmt-compute and azure-mgmt-network asyncio clients (their
aiohttp transport, bearer-token policy, retry and long-running-operation polling) against a loopback
server that speaks the Resource Manager REST API over HTTPS (tests/clouds/azure_api.py)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import jsonschema
import pytest
from azure.core.credentials import AccessToken
from azure.core.exceptions import ServiceRequestError
from azure.mgmt.compute.aio import ComputeManagementClient

from services.common.tls import DevCertificateAuthority
from services.driver.providers.interface import InstanceRequest
from services.driver.providers.azure import AzureProvider
from services.driver.providers.azure_config import AzureConfig, ImageReference, WorkerBootSettings, load_config, vm_size
from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, PermissionDenied, QuotaExceeded,
                                              TransientError)
from services.driver.providers.worker_metadata import METADATA_URL_ENV, WorkerBootstrap
from tests.clouds.azure_api import DOCS, AzureApiServer

SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
GROUP = "corral-workers"
TOKEN = "arm-test-token-not-a-secret"
SUBNET = (f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Network/virtualNetworks/"
          "corral/subnets/workers")
API_VERSIONS = {"Microsoft.Compute/virtualMachines": "2026-04-01", "Microsoft.Compute/disks": "2026-03-02",
                "Microsoft.Network/networkInterfaces": "2026-03-01"}
"""What azure-mgmt-compute 39 / azure-mgmt-network 33 send: a new SDK that changes them must be looked at."""


class FixedCredential:
    """An AsyncTokenCredential with one token (the production provider uses DefaultAzureCredential)."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        self.scopes.append(scopes)
        return AccessToken(TOKEN, int(time.time()) + 3600)

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> FixedCredential:
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass


class Machines:
    """A recording `on_create`/`on_delete` hook (the end-to-end tests start a real worker here)."""

    def __init__(self) -> None:
        self.created: dict[str, tuple[str, str, str]] = {}
        self.deleted: list[str] = []

    def on_create(self, name: str, metadata_url: str, user_data: str, custom_data: str) -> None:
        self.created[name] = (metadata_url, user_data, custom_data)

    def on_delete(self, name: str) -> None:
        self.deleted.append(name)


@pytest.fixture
def machines() -> Machines:
    return Machines()


@pytest.fixture
async def server(tmp_path: Path, machines: Machines) -> AsyncIterator[AzureApiServer]:
    tls = DevCertificateAuthority(tmp_path / "ca").issue("azure-api")
    api = await AzureApiServer(tls.cert, tls.key, tls.ca_cert, SUBSCRIPTION, TOKEN, polls=2,
                               on_create=machines.on_create, on_delete=machines.on_delete,
                               resource_groups={GROUP}).start()
    try:
        yield api
    finally:
        await api.close()
    assert api.invalid == [], "requests that do not match the documented shapes"


def config(server: AzureApiServer, **changes: Any) -> AzureConfig:
    values: dict[str, Any] = dict(
        subscription_id=SUBSCRIPTION, resource_group=GROUP, locations=("westeurope", "northeurope"),
        subnet_id=SUBNET, image=ImageReference("Canonical", "ubuntu-24_04-lts", "server"),
        admin_username="corral", ssh_public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly",
        deployment="prod", boot=WorkerBootSettings("enroll.corral.internal:5443", ("gw.corral.internal:5443",),
                                                   "-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n",
                                                   ("--scratch-dir", "/mnt/corral")),
        vm_sizes={"highmem": "Standard_E16s_v5"}, base_url=server.base_url,
        connection_verify=str(server.ca_file), poll_interval_s=0.01, operation_timeout_s=20.0, retry_total=1)
    values.update(changes)
    return AzureConfig(**values)


@pytest.fixture
async def credential() -> FixedCredential:
    return FixedCredential()


@pytest.fixture
async def provider(server: AzureApiServer, credential: FixedCredential) -> AsyncIterator[AzureProvider]:
    async with AzureProvider(config(server), credential) as made:
        yield made


def request(name: str, *, preemptible: bool = False, region: str = "westeurope", pool: str = "standard",
            token: str = "activation-token-0123456789abcdef", any_region: bool = False) -> InstanceRequest:
    return InstanceRequest(name, pool, 4000, 16 * 1024 ** 3, region, token, preemptible, 100 * 1024 ** 3,
                           any_region=any_region)


def vm_puts(server: AzureApiServer) -> list[dict[str, Any]]:
    return [r.body for r in server.recorded("PUT", "/virtualMachines/")]


def api_versions_sent(server: AzureApiServer) -> dict[str, set[str]]:
    sent: dict[str, set[str]] = {}
    for r in server.requests:
        for kind in API_VERSIONS:
            if f"/providers/{kind}".lower() in r.path.lower():
                sent.setdefault(kind, set()).add(r.query["api-version"])
    return sent


async def test_regular_vm_is_created_with_its_nic_and_boot_contract(
        server: AzureApiServer, provider: AzureProvider, machines: Machines, credential: FixedCredential) -> None:
    await provider.create(request("standard-0001"))

    vm = server.vms["standard-0001"]
    assert vm["properties"]["provisioningState"] == "Succeeded", "the operation was awaited to its end"
    [body] = vm_puts(server)
    jsonschema.validate(body, json.loads((DOCS / "vm_create_request.schema.json").read_text()))
    properties = body["properties"]
    assert body["location"] == "westeurope"
    assert body["tags"] == {"corral-deployment": "prod", "corral-pool": "standard"}
    assert properties["hardwareProfile"] == {"vmSize": "Standard_D4s_v5"}
    assert properties["priority"] == "Regular"
    assert "evictionPolicy" not in properties and "billingProfile" not in properties
    assert properties["storageProfile"] == {
        "imageReference": {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"},
        "osDisk": {"name": "standard-0001-osdisk", "createOption": "FromImage", "caching": "ReadWrite",
                   "deleteOption": "Delete", "diskSizeGB": 64, "managedDisk": {"storageAccountType": "Premium_LRS"}}}
    os_profile = properties["osProfile"]
    assert os_profile["computerName"] == "standard-0001" and os_profile["adminUsername"] == "corral"
    assert "adminPassword" not in os_profile
    assert os_profile["linuxConfiguration"] == {
        "disablePasswordAuthentication": True,
        "ssh": {"publicKeys": [{"path": "/home/corral/.ssh/authorized_keys",
                                "keyData": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly"}]}}
    script = base64.b64decode(os_profile["customData"]).decode()
    assert script.startswith("#!/bin/sh\n") and "python3 -m services.worker --cloud azure" in script
    assert "activation-token" not in script, "the startup script carries no secret"
    boot = WorkerBootstrap.from_json(base64.b64decode(properties["userData"]))
    assert boot.instance_name == "standard-0001" and boot.activation_token == "activation-token-0123456789abcdef"
    assert boot.enroll_address == "enroll.corral.internal:5443"
    assert boot.driver_addresses == ("gw.corral.internal:5443",)
    assert boot.worker_args == ("--cores-mcpu", "4000", "--memory-bytes", str(16 * 1024 ** 3), "--storage-bytes",
                                str(100 * 1024 ** 3), "--region", "westeurope", "--scratch-dir", "/mnt/corral")
    nic_id = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Network/networkInterfaces/" \
             "standard-0001-nic"
    assert properties["networkProfile"] == {
        "networkInterfaces": [{"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]}

    [nic_put] = [r.body for r in server.recorded("PUT", "/networkInterfaces/")]
    jsonschema.validate(nic_put, json.loads((DOCS / "nic_create_request.schema.json").read_text()))
    assert nic_put["properties"]["ipConfigurations"][0]["properties"]["subnet"] == {"id": SUBNET}
    assert nic_put["tags"] == body["tags"]
    assert server.nics["standard-0001-nic"]["properties"]["provisioningState"] == "Succeeded"
    # The NIC first, then the VM on it; each operation polled InProgress → Succeeded, as the SDK does.
    order = [(r.method, r.path.rsplit("/", 2)[-2]) for r in server.requests if r.method == "PUT"]
    assert order == [("PUT", "networkInterfaces"), ("PUT", "virtualMachines")]
    assert len(server.recorded("GET", "/locations/westeurope/operations/")) == 2 * (server.polls + 1)
    assert api_versions_sent(server) == {"Microsoft.Compute/virtualMachines": {"2026-04-01"},
                                         "Microsoft.Network/networkInterfaces": {"2026-03-01"}}
    assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in server.requests)
    assert credential.scopes and all(s == ("https://management.azure.com/.default",) for s in credential.scopes)

    # The machine's metadata service answers the worker with its boot contract, as IMDS does.
    metadata_url, user_data, custom_data = machines.created["standard-0001"]
    assert metadata_url == server.metadata_url("standard-0001")
    assert WorkerBootstrap.from_json(user_data) == boot and custom_data == script


async def test_spot_vm_has_spot_priority_eviction_delete_and_no_price_cap(
        server: AzureApiServer, provider: AzureProvider) -> None:
    await provider.create(request("standard-0002", preemptible=True))

    [body] = vm_puts(server)
    assert body["properties"]["priority"] == "Spot"
    assert body["properties"]["evictionPolicy"] == "Delete"
    assert body["properties"]["billingProfile"] == {"maxPrice": -1}


async def test_a_pools_exact_size_wins_and_sizes_follow_memory_per_core(
        server: AzureApiServer, provider: AzureProvider) -> None:
    await provider.create(request("highmem-0001", pool="highmem"))
    assert vm_puts(server)[0]["properties"]["hardwareProfile"]["vmSize"] == "Standard_E16s_v5"
    assert vm_size(4000, 8 * 1024 ** 3) == "Standard_F4s_v2"
    assert vm_size(4000, 16 * 1024 ** 3) == "Standard_D4s_v5"
    assert vm_size(3000, 24 * 1024 ** 3) == "Standard_E4s_v5"
    assert vm_size(8000, 0) == "Standard_D8s_v5"
    with pytest.raises(InvalidRequest):
        vm_size(4000, 64 * 1024 ** 3)


async def test_delete_removes_vm_nic_and_disk_and_is_idempotent(
        server: AzureApiServer, provider: AzureProvider, machines: Machines) -> None:
    await provider.create(request("standard-0003"))
    assert set(server.disks) == {"standard-0003-osdisk"} and set(server.nics) == {"standard-0003-nic"}

    await provider.delete("standard-0003")
    assert server.vms == {} and server.nics == {} and server.disks == {}
    assert machines.deleted == ["standard-0003"]
    deletes = [r.path.rsplit("/", 2)[-2:] for r in server.requests if r.method == "DELETE"]
    assert deletes == [["virtualMachines", "standard-0003"], ["networkInterfaces", "standard-0003-nic"],
                       ["disks", "standard-0003-osdisk"]]
    assert api_versions_sent(server)["Microsoft.Compute/disks"] == {"2026-03-02"}

    await provider.delete("standard-0003")  # nothing there: every delete answers 204
    await provider.delete("never-created")


async def test_a_missing_resource_group_is_gone_for_delete_and_a_configuration_error_for_create(
        server: AzureApiServer, credential: FixedCredential) -> None:
    async with AzureProvider(config(server, resource_group="deleted-group"), credential) as elsewhere:
        await elsewhere.delete("standard-0018")  # 404: nothing left to delete
        with pytest.raises(InvalidRequest, match="ResourceGroupNotFound"):
            await elsewhere.create(request("standard-0018"))


async def test_production_credential_is_made_and_closed_by_the_provider(server: AzureApiServer) -> None:
    async with AzureProvider(config(server)) as production:
        assert type(production._credential).__name__ == "DefaultAzureCredential"


async def test_delete_cleans_up_a_nic_and_disk_left_without_their_delete_option(
        server: AzureApiServer, provider: AzureProvider) -> None:
    await provider.create(request("standard-0004"))
    vm = server.vms["standard-0004"]["properties"]
    vm["storageProfile"]["osDisk"]["deleteOption"] = "Detach"
    vm["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] = "Detach"

    await provider.delete("standard-0004")
    assert server.vms == {} and server.nics == {} and server.disks == {}


async def test_alive_lists_only_this_deployments_vms_across_pages(
        server: AzureApiServer, provider: AzureProvider, credential: FixedCredential) -> None:
    for i in range(3):
        await provider.create(request(f"standard-000{i}"))
    async with AzureProvider(config(server, deployment="other"), credential) as other:
        await other.create(request("other-0001"))
        assert await other.alive() == {"other-0001"}

    assert await provider.alive() == {"standard-0000", "standard-0001", "standard-0002"}
    assert any("$skiptoken" in r.query for r in server.recorded("GET", "/virtualMachines$")), "nextLink followed"


async def test_quota_in_one_location_is_typed_and_the_next_location_is_used(
        server: AzureApiServer, provider: AzureProvider) -> None:
    server.fail("westeurope", "quota")
    with pytest.raises(QuotaExceeded) as refused:
        await provider.create(request("standard-0005", region="westeurope"))
    assert refused.value.region == "westeurope" and "quota" in str(refused.value)
    assert server.vms == {} and server.nics == {}, "the NIC made for the refused VM is deleted"

    await provider.create(request("standard-0006", any_region=True))
    assert server.vms["standard-0006"]["location"] == "northeurope"
    assert [b["location"] for b in vm_puts(server)] == ["westeurope", "westeurope", "northeurope"]


async def test_quota_everywhere_raises_the_last_locations_refusal(
        server: AzureApiServer, provider: AzureProvider) -> None:
    server.fail("westeurope", "quota-code")
    server.fail("northeurope", "sku")
    with pytest.raises(CapacityExhausted) as refused:
        await provider.create(request("standard-0007", any_region=True))
    assert refused.value.region == "northeurope"
    assert server.vms == {} and server.nics == {}


async def test_allocation_failure_in_the_operation_is_capacity_and_the_failed_vm_is_removed(
        server: AzureApiServer, provider: AzureProvider, machines: Machines) -> None:
    server.fail("westeurope", "allocation")
    with pytest.raises(CapacityExhausted) as refused:
        await provider.create(request("standard-0008"))
    assert refused.value.region == "westeurope" and "AllocationFailed" in str(refused.value)
    assert server.vms == {} and server.nics == {} and server.disks == {}
    assert machines.created == {}


async def test_authorization_failure_is_permission_denied_and_not_tried_elsewhere(
        server: AzureApiServer, provider: AzureProvider) -> None:
    server.fail("westeurope", "authorization")
    with pytest.raises(PermissionDenied) as refused:
        await provider.create(request("standard-0009", any_region=True))
    assert refused.value.region == "westeurope" and "AuthorizationFailed" in str(refused.value)
    assert [b["location"] for b in vm_puts(server)] == ["westeurope"]
    assert server.nics == {}


async def test_a_wrong_token_is_permission_denied(server: AzureApiServer) -> None:
    class WrongCredential(FixedCredential):
        async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            return AccessToken("someone-elses", int(time.time()) + 3600)

    async with AzureProvider(config(server), WrongCredential()) as wrong:
        with pytest.raises(PermissionDenied):
            await wrong.alive()


async def test_throttling_is_retried_by_the_sdk(server: AzureApiServer, provider: AzureProvider) -> None:
    server.fail("westeurope", "throttle", times=1)
    await provider.create(request("standard-0010"))
    assert len(vm_puts(server)) == 2 and "standard-0010" in server.vms

    server.fail("westeurope", "throttle")
    with pytest.raises(TransientError):
        await provider.create(request("standard-0011"))


async def test_a_region_outside_the_configuration_is_refused(provider: AzureProvider) -> None:
    with pytest.raises(InvalidRequest):
        await provider.create(request("standard-0012", region="local"))
    with pytest.raises(InvalidRequest):
        await provider.create(request("Not_A_Name"))


async def test_plain_http_is_refused_by_the_bearer_token_policy(
        server: AzureApiServer, credential: FixedCredential) -> None:
    """The SDK sends a token only over TLS: that is why the loopback server speaks HTTPS with a test CA
    (`connection_verify`) rather than the check being turned off."""
    async with ComputeManagementClient(credential, SUBSCRIPTION, base_url=server.imds_url, retry_total=0) as plain:
        with pytest.raises(ServiceRequestError, match="non-TLS"):
            [vm async for vm in plain.virtual_machines.list(GROUP)]
    assert credential.scopes == []
    with pytest.raises(ValueError, match="https"):
        config(server, base_url=server.imds_url)


async def test_an_untrusted_certificate_is_refused(server: AzureApiServer, credential: FixedCredential) -> None:
    async with AzureProvider(config(server, connection_verify=True), credential) as untrusting:
        with pytest.raises(TransientError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await untrusting.alive()


async def test_the_token_and_user_data_never_reach_the_logs(
        server: AzureApiServer, provider: AzureProvider, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "activation-token-that-must-stay-secret"
    server.fail("westeurope", "allocation")
    await provider.create(request("standard-0013", any_region=True, token=secret, preemptible=True))
    await provider.delete("standard-0013")

    [body] = [b for b in vm_puts(server) if b["location"] == "northeurope"]
    user_data = body["properties"]["userData"]
    assert secret in base64.b64decode(user_data).decode()
    assert caplog.records, "the SDK and the provider did log"
    text = caplog.text + "".join(str(r.args) for r in caplog.records)
    for leaked in (secret, user_data, TOKEN):
        assert leaked not in text


async def test_imds_serves_user_data_and_a_preempt_event_then_evicts(
        server: AzureApiServer, provider: AzureProvider, machines: Machines) -> None:
    await provider.create(request("standard-0017"))
    with pytest.raises(ValueError, match="not a Spot VM"):
        server.preempt("standard-0017")

    await provider.create(request("standard-0014", preemptible=True))
    root = server.metadata_url("standard-0014")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{root}/instance/compute/userData?api-version=2021-01-01&format=text") as response:
            assert response.status == 400, "Metadata: true is required"
        async with http.get(f"{root}/instance/compute/userData?api-version=2021-01-01&format=text",
                            headers={"Metadata": "true"}) as response:
            boot = WorkerBootstrap.from_json(base64.b64decode(await response.text()))
        assert boot.instance_name == "standard-0014"
        events_url = f"{root}/scheduledevents?api-version=2020-07-01"
        async with http.get(events_url, headers={"Metadata": "true"}) as response:
            assert await response.json() == {"DocumentIncarnation": 0, "Events": []}

        event_id = server.preempt("standard-0014", notice_s=30)
        async with http.get(events_url, headers={"Metadata": "true"}) as response:
            document = await response.json()
        assert document["DocumentIncarnation"] == 1
        [event] = document["Events"]
        assert event["EventId"] == event_id and event["EventType"] == "Preempt"
        assert event["Resources"] == ["standard-0014"] and event["EventStatus"] == "Scheduled"
        assert set(event) == set(json.loads((DOCS / "imds_scheduled_events.json").read_text())["Events"][0])

        # The worker approves the event: the eviction happens at once (eviction policy Delete).
        async with http.post(events_url, headers={"Metadata": "true"},
                             json={"StartRequests": [{"EventId": event_id}]}) as response:
            assert response.status == 200
    for _ in range(100):
        if "standard-0014" not in server.vms:
            break
        await asyncio.sleep(0.01)
    assert set(server.vms) == {"standard-0017"} and set(server.nics) == {"standard-0017-nic"}
    assert set(server.disks) == {"standard-0017-osdisk"}, "the evicted VM's NIC and disk went with it"
    assert machines.deleted == ["standard-0014"]
    assert await provider.alive() == {"standard-0017"}
    await provider.delete("standard-0014")  # the driver's delete after a preemption still succeeds


async def test_documented_examples_fit_the_schemas_the_server_checks() -> None:
    for kind in ("vm", "nic"):
        schema = json.loads((DOCS / f"{kind}_create_request.schema.json").read_text())
        jsonschema.validate(json.loads((DOCS / f"{kind}_create_request.json").read_text()), schema)


def shape(value: Any) -> Any:
    """A JSON value's structure: the keys of every object, the first item of every list."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


async def test_server_responses_have_the_documented_shape(
        server: AzureApiServer, provider: AzureProvider) -> None:
    await provider.create(request("standard-0015", preemptible=True))
    documented = json.loads((DOCS / "vm_create_response.json").read_text())
    assert shape(server.vms["standard-0015"]) == shape(documented)
    nic = json.loads((DOCS / "nic_create_response.json").read_text())
    assert shape(server.nics["standard-0015-nic"]) == shape(nic)


def test_configuration_loads_from_json_and_refuses_what_it_does_not_know() -> None:
    text = json.dumps({
        "subscription_id": SUBSCRIPTION, "resource_group": GROUP, "locations": ["westeurope", "northeurope"],
        "subnet_id": SUBNET, "image": {"id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/"
                                             "galleries/corral/images/worker/versions/1.0.0"},
        "admin_username": "corral", "ssh_public_key": "ssh-ed25519 AAAA", "deployment": "prod",
        "boot": {"enroll_address": "e:1", "driver_addresses": ["d:1"], "ca_cert_pem": "PEM",
                 "worker_args": ["--runtime", "oci"]},
        "vm_sizes": {"highmem": "Standard_E16s_v5"}})
    loaded = load_config(text)
    assert loaded.locations == ("westeurope", "northeurope") and loaded.boot.worker_args == ("--runtime", "oci")
    assert loaded.image.model().as_dict() == {"id": json.loads(text)["image"]["id"]}
    assert loaded.base_url is None and loaded.connection_verify is True
    assert loaded.retail_prices_endpoint == "https://prices.azure.com/api/retail/prices"
    assert load_config(text.replace('"deployment"', '"retail_prices_endpoint": "https://127.0.0.1:9/p", "deployment"')
                       ).retail_prices_endpoint == "https://127.0.0.1:9/p"
    with pytest.raises(ValueError, match="retail_prices_endpoint"):
        load_config(text.replace('"deployment"', '"retail_prices_endpoint": "http://127.0.0.1:9/p", "deployment"'))
    with pytest.raises(ValueError, match="unknown field.*zone"):
        load_config(text.replace('"deployment"', '"zone": "1", "deployment"'))
    with pytest.raises(ValueError, match="boot"):
        load_config(text.replace('"enroll_address": "e:1", ', ""))
    with pytest.raises(ValueError, match="ssh_public_key"):
        load_config(text.replace("ssh-ed25519 AAAA", "password"))
    with pytest.raises(ValueError, match="install_dir"):
        load_config(text.replace('"deployment"', '"install_dir": "/opt/x\'; rm -rf /", "deployment"'))
    with pytest.raises(ValueError, match="at most"):
        load_config(" " * (300 * 1024))


# A stand-in for the worker's side (written separately): what a process on the VM does with IMDS.
_MACHINE = r"""
import base64, json, os, sys, time, urllib.request
from services.driver.providers.worker_metadata import METADATA_URL_ENV, WorkerBootstrap
root = os.environ[METADATA_URL_ENV]
def imds(path, body=None):
    request = urllib.request.Request(root + path, data=body, headers={"Metadata": "true"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read()
boot = WorkerBootstrap.from_json(base64.b64decode(imds("/instance/compute/userData?api-version=2021-01-01&format=text")))
print("booted", boot.instance_name, flush=True)
for _ in range(500):
    events = json.loads(imds("/scheduledevents?api-version=2020-07-01"))["Events"]
    preempt = [e for e in events if e["EventType"] == "Preempt"]
    if preempt:
        imds("/scheduledevents?api-version=2020-07-01",
             json.dumps({"StartRequests": [{"EventId": preempt[0]["EventId"]}]}).encode())
        print("preempted", flush=True)
        sys.exit(0)
    time.sleep(0.02)
sys.exit(1)
"""


async def test_a_process_on_the_vm_boots_from_imds_and_sees_its_preemption(
        tmp_path: Path, server: AzureApiServer, provider: AzureProvider) -> None:
    processes: dict[str, asyncio.subprocess.Process] = {}

    async def start(name: str, metadata_url: str, user_data: str, custom_data: str) -> None:
        processes[name] = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _MACHINE, stdout=asyncio.subprocess.PIPE, cwd=Path(__file__).parents[2],
            env={**os.environ, METADATA_URL_ENV: metadata_url})

    server.on_create = start
    try:
        await provider.create(request("standard-0016", preemptible=True))
        for _ in range(200):
            if "standard-0016" in processes:
                break
            await asyncio.sleep(0.01)
        machine = processes["standard-0016"]
        assert machine.stdout is not None
        assert await asyncio.wait_for(machine.stdout.readline(), 20) == b"booted standard-0016\n"

        server.preempt("standard-0016", notice_s=30)
        assert await asyncio.wait_for(machine.stdout.readline(), 20) == b"preempted\n"
        assert await asyncio.wait_for(machine.wait(), 20) == 0
        for _ in range(200):
            if not server.vms:
                break
            await asyncio.sleep(0.01)
        assert await provider.alive() == set(), "evicted well before its 30 s notice: the VM approved it"
        assert server.nics == {} and server.disks == {}
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.kill()
                await process.wait()
