"""The GCP provider through google-cloud-compute's real client and REST transport, against the loopback
Compute Engine server of tests/clouds/gcp_api.py: the bodies it sends, how it waits, where it places a
machine when quota or capacity is short, and which typed error the autoscaler gets."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import jsonschema
import pytest
from google.auth.credentials import AnonymousCredentials

from services.driver.providers.interface import InstanceRequest
from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, PermissionDenied, QuotaExceeded,
                                              TransientError)
from services.driver.providers import gcp as gcp_module
from services.driver.providers.gcp import GcpProvider
from services.driver.providers.gcp_config import GcpConfig, GcpRegion, WorkerBoot
from services.driver.providers.gcp_shapes import GIB
from services.driver.providers.worker_metadata import METADATA_URL_ENV, WorkerBootstrap
from tests.clouds.gcp_api import INSERT_SCHEMA, GcpApi, example

REPO = Path(__file__).resolve().parents[2]
TOKEN = "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


OPENED: list[GcpProvider] = []


@pytest.fixture
def api() -> Iterator[GcpApi]:
    server = GcpApi()
    server.start()
    try:
        yield server
    finally:
        while OPENED:
            OPENED.pop().close()
        server.stop()
    assert server.violations == [], "requests that do not fit the documented shapes"


def config(api: GcpApi, **changes: object) -> GcpConfig:
    base = GcpConfig(
        project=api.project, deployment="prod-1",
        regions=(GcpRegion("us-central1", ("us-central1-a", "us-central1-b"), subnetwork="corral"),
                 GcpRegion("europe-west4", ("europe-west4-a", "europe-west4-b"))),
        boot_image="projects/example-project/global/images/family/corral-worker",
        worker=WorkerBoot("enroll.example:8443", ("gw.example:9443",), CA),
        families={"highmem": "n2"}, api_endpoint=api.endpoint, call_timeout_s=10, operation_timeout_s=20)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def provider(api: GcpApi, **changes: object) -> GcpProvider:
    """A provider, closed when the test ends."""
    OPENED.append(GcpProvider(config(api, **changes), AnonymousCredentials()))
    return OPENED[-1]


def request(name: str = "standard-0a1b2c3d", **changes: object) -> InstanceRequest:
    base = InstanceRequest(name, "standard", 4000, 16 * GIB, "us-central1", TOKEN)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def inserted_zones(api: GcpApi) -> list[str]:
    return [r.path.split("/zones/")[1].split("/")[0] for r in api.calls("instances.insert")]


async def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def test_the_schema_takes_the_documented_example() -> None:
    """The check of insert bodies is no stricter than the reference's own example."""
    jsonschema.Draft202012Validator(INSERT_SCHEMA).validate(example("instances.insert.request.json"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(INSERT_SCHEMA).validate(
            {**example("instances.insert.request.json"), "machineType": "n2-standard-4"})


async def test_on_demand_machine_body(api: GcpApi) -> None:
    await provider(api).create(request(storage_bytes=100 * GIB))
    [insert] = api.calls("instances.insert")
    body = insert.body
    assert insert.path == "/compute/v1/projects/example-project/zones/us-central1-a/instances"
    assert insert.query["requestId"][0]  # a retried insert is the same insert
    assert body["name"] == "standard-0a1b2c3d"
    assert body["machineType"] == "zones/us-central1-a/machineTypes/n2-standard-4"
    assert body["scheduling"] == {"provisioningModel": "STANDARD", "automaticRestart": True,
                                  "onHostMaintenance": "MIGRATE"}
    [disk] = body["disks"]
    assert disk["boot"] and disk["autoDelete"] and disk["type"] == "PERSISTENT"
    assert disk["initializeParams"] == {
        "sourceImage": "projects/example-project/global/images/family/corral-worker",
        "diskType": "zones/us-central1-a/diskTypes/pd-balanced", "diskSizeGb": "150",
        "labels": {"corral-deployment": "prod-1", "corral-pool": "standard"}}
    assert body["labels"] == {"corral-deployment": "prod-1", "corral-pool": "standard"}
    assert body["networkInterfaces"] == [{"network": "global/networks/default",
                                          "subnetwork": "regions/us-central1/subnetworks/corral"}]
    assert "serviceAccounts" not in body  # no Google identity on a worker unless configured
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert set(items) == {"corral-worker", "startup-script"}
    boot = WorkerBootstrap.from_json(items["corral-worker"])
    assert (boot.instance_name, boot.activation_token, boot.enroll_address, boot.driver_addresses,
            boot.ca_cert_pem) == ("standard-0a1b2c3d", TOKEN, "enroll.example:8443", ("gw.example:9443",), CA)
    assert boot.worker_args[boot.worker_args.index("--region") + 1] == "us-central1"
    assert items["startup-script"].startswith("#!/bin/sh\n")
    assert items["startup-script"].endswith("exec python3 -m services.worker --cloud gcp\n")
    assert api.instances()["standard-0a1b2c3d"]["status"] == "RUNNING"


async def test_spot_machine_is_deleted_when_reclaimed_and_runs_as_its_service_account(api: GcpApi) -> None:
    gcp = provider(api, service_account="worker@example-project.iam.gserviceaccount.com", external_ip=True)
    await gcp.create(request("standard-spot", preemptible=True))
    body = api.calls("instances.insert")[0].body
    assert body["scheduling"] == {"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE",
                                  "automaticRestart": False, "onHostMaintenance": "TERMINATE"}
    assert body["serviceAccounts"] == [{"email": "worker@example-project.iam.gserviceaccount.com",
                                        "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}]
    assert body["networkInterfaces"][0]["accessConfigs"] == [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]


async def test_create_returns_once_the_operation_is_done(api: GcpApi) -> None:
    created: list[tuple[str, str, dict[str, str]]] = []
    api.on_create = lambda name, url, items: created.append((name, url, items))
    await provider(api).create(request())
    # PENDING from the insert, RUNNING and DONE from two waits: create did not return before DONE.
    assert len(api.calls("zoneOperations.wait")) == 2
    assert api.instances()["standard-0a1b2c3d"]["status"] == "RUNNING"
    await eventually(lambda: len(created) == 1)
    name, url, items = created[0]
    assert (name, url) == ("standard-0a1b2c3d", api.metadata_url("standard-0a1b2c3d"))
    assert WorkerBootstrap.from_json(items["corral-worker"]).activation_token == TOKEN


async def test_a_wait_may_hold_longer_than_a_call(api: GcpApi) -> None:
    """zoneOperations.wait answers when the operation is DONE or after about two minutes: its call is
    not cut at the deadline of an ordinary call."""
    api.wait_hold_s = 1.0
    await provider(api, call_timeout_s=0.5).create(request())
    assert api.instances()["standard-0a1b2c3d"]["status"] == "RUNNING"


async def test_an_operation_past_its_deadline_is_transient(api: GcpApi) -> None:
    api.wait_hold_s = 1.0
    with pytest.raises(TransientError):
        await provider(api, operation_timeout_s=0.5).create(request())


async def test_a_family_machine_type_or_a_named_one(api: GcpApi) -> None:
    gcp = provider(api, families={"highmem": "n2d"})
    await gcp.create(request("highmem-1", inst_coll="highmem", cores_mcpu=8000, memory_bytes=64 * GIB))
    await gcp.create(request("private-1", machine_type="c3-highcpu-4", cores_mcpu=4000))
    types = [r.body["machineType"] for r in api.calls("instances.insert")]
    assert types == ["zones/us-central1-a/machineTypes/n2d-highmem-8", "zones/us-central1-a/machineTypes/c3-highcpu-4"]


async def test_delete_waits_and_is_idempotent(api: GcpApi) -> None:
    deleted: list[str] = []
    api.on_delete = deleted.append
    gcp = provider(api)
    await gcp.create(request())
    await gcp.delete("standard-0a1b2c3d")
    assert "standard-0a1b2c3d" not in api.instances()  # the delete operation was DONE
    await gcp.delete("standard-0a1b2c3d")
    await gcp.delete("never-made")
    await gcp.delete('x") OR (name = "y')  # not a name: nothing to find, and no filter made of it
    assert len(api.calls("instances.delete")) == 1
    await eventually(lambda: deleted == ["standard-0a1b2c3d"])


async def test_delete_of_a_machine_another_driver_made(api: GcpApi) -> None:
    await provider(api).create(request(region="europe-west4"))
    other = provider(api)
    await other.delete("standard-0a1b2c3d")
    assert api.instances() == {}
    assert api.calls("instances.delete")[0].path.endswith("/zones/europe-west4-a/instances/standard-0a1b2c3d")


async def test_delete_of_a_machine_gone_meanwhile(api: GcpApi) -> None:
    """The machine vanished (reclaimed) between listing and delete: the 404 is success."""
    gcp = provider(api)
    await gcp.create(request("standard-spot", preemptible=True))
    api.preempt("standard-spot")
    await eventually(lambda: "standard-spot" not in api.instances())
    await gcp.delete("standard-spot")
    assert len(api.calls("instances.delete")) == 1


async def test_alive_reads_every_page(api: GcpApi, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gcp_module, "PAGE_SIZE", 2)
    gcp = provider(api)
    names = {f"standard-{i}" for i in range(5)}
    for name in sorted(names):
        await gcp.create(request(name, region="europe-west4" if name[-1] in "13" else "us-central1"))
    assert await gcp.alive() == names
    pages = api.calls("instances.aggregatedList")
    assert [p.query.get("pageToken", [""])[0] for p in pages] == ["", "2", "4"]


async def test_alive_lists_only_this_deployments_machines(api: GcpApi) -> None:
    ours, theirs = provider(api), provider(api, deployment="staging")
    await ours.create(request("standard-a"))
    await ours.create(request("standard-b", region="europe-west4"))
    await theirs.create(request("standard-c"))
    assert await ours.alive() == {"standard-a", "standard-b"}
    assert await theirs.alive() == {"standard-c"}
    assert ours.zone_of("standard-b") == "europe-west4-a"


async def test_a_region_without_quota_is_skipped_for_jobs_that_may_move(api: GcpApi) -> None:
    api.set_quota("us-central1", "CPUS", 2)
    gcp = provider(api)
    await gcp.create(request(any_region=True))
    assert inserted_zones(api) == ["europe-west4-a"]  # the full region was never asked
    boot = WorkerBootstrap.from_json(api.calls("instances.insert")[0].body["metadata"]["items"][0]["value"])
    assert boot.worker_args[boot.worker_args.index("--region") + 1] == "europe-west4"
    assert gcp.zone_of("standard-0a1b2c3d") == "europe-west4-a"


async def test_a_region_without_quota_refuses_jobs_that_may_not_move(api: GcpApi) -> None:
    api.set_quota("us-central1", "INSTANCES", 0)
    with pytest.raises(QuotaExceeded) as refused:
        await provider(api).create(request())
    assert refused.value.region == "us-central1" and refused.value.retry_elsewhere
    assert "INSTANCES" in str(refused.value)
    assert inserted_zones(api) == []


async def test_quota_taken_between_read_and_insert(api: GcpApi) -> None:
    api.set_quota("us-central1", "CPUS", 4)
    gcp = provider(api)
    await gcp.create(request("standard-a"))
    api.hide_usage("us-central1")  # regions.get now says there is room; the insert says there is not
    with pytest.raises(QuotaExceeded):
        await gcp.create(request("standard-b"))
    assert inserted_zones(api) == ["us-central1-a", "us-central1-a"]  # no other zone of the same region
    await gcp.create(request("standard-c", any_region=True))
    assert inserted_zones(api)[-1] == "europe-west4-a"


async def test_spot_machines_count_against_preemptible_quota_when_there_is_one(api: GcpApi) -> None:
    api.set_quota("us-central1", "CPUS", 0)
    api.set_quota("us-central1", "PREEMPTIBLE_CPUS", 8)
    gcp = provider(api)
    await gcp.create(request("standard-spot", preemptible=True))
    with pytest.raises(QuotaExceeded):
        await gcp.create(request("standard-on-demand"))


async def test_a_region_that_is_down_is_skipped(api: GcpApi) -> None:
    api.down.add("us-central1")
    with pytest.raises(CapacityExhausted):
        await provider(api).create(request())
    await provider(api).create(request(any_region=True))
    assert inserted_zones(api) == ["europe-west4-a"]


async def test_a_full_zone_sends_the_machine_to_the_next(api: GcpApi) -> None:
    api.exhaust_zone("us-central1-a")
    gcp = provider(api)
    await gcp.create(request())
    assert inserted_zones(api) == ["us-central1-a", "us-central1-b"]
    assert gcp.zone_of("standard-0a1b2c3d") == "us-central1-b"


async def test_every_zone_full(api: GcpApi) -> None:
    api.exhaust_zone("us-central1-a")
    api.exhaust_zone("us-central1-b")
    with pytest.raises(CapacityExhausted) as refused:
        await provider(api).create(request())
    assert (refused.value.region, refused.value.zone) == ("us-central1", "us-central1-b")
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in str(refused.value)
    assert api.instances() == {}


async def test_permission_denied_is_not_retried_elsewhere(api: GcpApi) -> None:
    api.deny("compute.instances.create")
    with pytest.raises(PermissionDenied) as refused:
        await provider(api).create(request(any_region=True))
    assert not refused.value.retry_elsewhere
    assert len(api.calls("instances.insert")) == 1


async def test_a_region_not_configured_is_a_configuration_error(api: GcpApi) -> None:
    with pytest.raises(InvalidRequest):
        await provider(api).create(request(region="asia-east1"))
    with pytest.raises(InvalidRequest):
        await provider(api).create(request("Not_A_Name"))
    assert api.requests == []


async def test_an_unreachable_api_is_transient(api: GcpApi) -> None:
    gcp = provider(api, api_endpoint="http://127.0.0.1:9", call_timeout_s=2)
    with pytest.raises(TransientError):
        await gcp.create(request())


async def test_the_token_is_never_logged(api: GcpApi, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    gcp = provider(api)
    await gcp.create(request("standard-a"))
    api.exhaust_zone("us-central1-a")
    api.exhaust_zone("us-central1-b")
    with pytest.raises(CapacityExhausted) as refused:
        await gcp.create(request("standard-b"))
    await gcp.delete("standard-a")
    assert "gcp: created standard-a" in caplog.text  # the provider's own lines were captured
    assert TOKEN not in caplog.text
    assert TOKEN not in str(refused.value)


async def test_metadata_server_and_preemption(api: GcpApi) -> None:
    deleted: list[str] = []
    api.on_delete = deleted.append
    gcp = provider(api)
    await gcp.create(request("standard-spot", preemptible=True))
    root = api.metadata_url("standard-spot")

    def read(path: str, headers: dict[str, str] | None = None) -> str:
        call = urllib.request.Request(f"{root}/{path}", headers={"Metadata-Flavor": "Google"} if headers is None
                                      else headers)
        with urllib.request.urlopen(call, timeout=10) as answer:
            return answer.read().decode()

    with pytest.raises(urllib.error.HTTPError) as refused:
        read("instance/preempted", headers={})
    refused.value.close()
    assert refused.value.code == 403
    assert read("instance/preempted") == "FALSE"
    assert WorkerBootstrap.from_json(read("instance/attributes/corral-worker")).activation_token == TOKEN
    watcher = asyncio.create_task(asyncio.to_thread(read, "instance/preempted?wait_for_change=true&timeout_sec=20"))
    await asyncio.sleep(0.2)
    assert not watcher.done()
    api.preempt("standard-spot")
    assert await asyncio.wait_for(watcher, 10) == "TRUE"
    await eventually(lambda: deleted == ["standard-spot"])  # its termination action is DELETE
    assert await gcp.alive() == set()


async def test_a_created_machine_starts_a_process_that_reads_its_metadata(api: GcpApi) -> None:
    """What the end-to-end test will do with a real worker: on_create starts a process given the
    machine's metadata root, and the process reads its bootstrap from there as a worker would."""
    processes: list[subprocess.Popen[str]] = []
    reader = ("import os, urllib.request\n"
              "from services.driver.providers.worker_metadata import METADATA_KEY, METADATA_URL_ENV, WorkerBootstrap\n"
              "root = os.environ[METADATA_URL_ENV]\n"
              "call = urllib.request.Request(f'{root}/instance/attributes/{METADATA_KEY}', "
              "headers={'Metadata-Flavor': 'Google'})\n"
              "boot = WorkerBootstrap.from_json(urllib.request.urlopen(call, timeout=10).read())\n"
              "print(boot.instance_name, boot.enroll_address)\n")

    def start(name: str, url: str, items: dict[str, str]) -> None:
        processes.append(subprocess.Popen([sys.executable, "-c", reader], cwd=REPO, text=True,
                                          stdout=subprocess.PIPE, env={**os.environ, METADATA_URL_ENV: url}))

    api.on_create = start
    await provider(api).create(request())
    await eventually(lambda: len(processes) == 1)
    try:
        out, _ = await asyncio.to_thread(processes[0].communicate, timeout=30)
    finally:
        if processes[0].poll() is None:
            processes[0].kill()
            processes[0].wait()
    assert processes[0].returncode == 0
    assert out.strip() == "standard-0a1b2c3d enroll.example:8443"


def test_configuration_limits(api: GcpApi) -> None:
    with pytest.raises(ValueError, match="label value"):
        config(api, deployment="Prod 1")
    with pytest.raises(ValueError, match="zones"):
        config(api, regions=(GcpRegion("us-central1", ()),))
    with pytest.raises(ValueError, match="boot_disk_gb"):
        config(api, boot_disk_gb=1)
