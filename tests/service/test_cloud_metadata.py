"""A cloud worker's reads of its metadata server, against a loopback server speaking the documented
endpoints (tests/fake_metadata.py): the boot data on GCP and Azure, and the preemption watchers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest

from services.driver.providers.worker_metadata import WorkerBootstrap
from services.worker.cloud import MetadataError, UnusableBootstrap, read_bootstrap
from services.worker.preemption import AzurePreemptionWatcher, GcpPreemptionWatcher, azure_vm_name
from tests import fake_metadata

pytestmark = pytest.mark.timeout(60)

BOOT = WorkerBootstrap("pool-1a2b", "a-token", "127.0.0.1:1", ("127.0.0.1:2",), "-----BEGIN CERTIFICATE-----\n",
                       ("--cores-mcpu", "2000"))


@pytest.fixture
def metadata() -> Iterator[fake_metadata.FakeMetadata]:
    with fake_metadata.serving() as state:
        yield state


async def eventually(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def test_the_boot_data_is_read_on_either_cloud(metadata: fake_metadata.FakeMetadata) -> None:
    metadata.bootstrap_json = BOOT.to_json()
    assert await read_bootstrap("gcp", metadata.gcp_root) == BOOT
    assert await read_bootstrap("azure", metadata.azure_root) == BOOT  # base64 of userData


async def test_a_metadata_server_not_ready_yet_is_asked_again(metadata: fake_metadata.FakeMetadata) -> None:
    metadata.bootstrap_json = BOOT.to_json()
    metadata.failures = 3
    assert await read_bootstrap("gcp", metadata.gcp_root, patience_s=30) == BOOT
    assert len(metadata.requests) == 4


async def test_unusable_or_missing_boot_data_is_an_error(metadata: fake_metadata.FakeMetadata) -> None:
    metadata.bootstrap_json = '{"instance_name": "x"}'
    with pytest.raises(UnusableBootstrap):
        await read_bootstrap("gcp", metadata.gcp_root)
    assert len(metadata.requests) == 1  # not asked again: it will not get better
    metadata.bootstrap_json = ""  # no item at all: 404 until patience runs out
    with pytest.raises(MetadataError):
        await read_bootstrap("gcp", metadata.gcp_root, patience_s=0.5)


async def test_gcp_preemption_is_heard_as_it_happens(metadata: fake_metadata.FakeMetadata) -> None:
    heard: list[float] = []
    watcher = asyncio.create_task(GcpPreemptionWatcher(metadata.gcp_root, lambda: heard.append(time.monotonic()),
                                                       wait_s=30).run())
    await eventually(lambda: sum("preempted" in r for r in metadata.requests) == 2)
    await asyncio.sleep(0.3)
    assert not heard and not watcher.done()  # held by the long poll, not polling
    assert sum("preempted" in r for r in metadata.requests) == 2  # a read, then one long poll
    preempted_at = time.monotonic()
    metadata.preempt()
    await asyncio.wait_for(watcher, 5)
    assert len(heard) == 1 and heard[0] - preempted_at < 1.0
    assert "wait_for_change=true" in metadata.requests[-1]


async def test_a_machine_preempted_before_the_watcher_started_is_heard(
        metadata: fake_metadata.FakeMetadata) -> None:
    metadata.preempt()
    heard: list[bool] = []
    await asyncio.wait_for(GcpPreemptionWatcher(metadata.gcp_root, lambda: heard.append(True), wait_s=30).run(), 5)
    assert heard == [True]


async def test_gcp_watcher_survives_a_failing_metadata_server(metadata: fake_metadata.FakeMetadata) -> None:
    heard: list[bool] = []
    metadata.failures = 2
    watcher = asyncio.create_task(GcpPreemptionWatcher(metadata.gcp_root, lambda: heard.append(True),
                                                       wait_s=30, retry_s=0.05).run())
    await eventually(lambda: len(metadata.requests) >= 3)
    metadata.preempt()
    await asyncio.wait_for(watcher, 5)
    assert heard == [True]


async def test_azure_preempt_event_for_this_vm_is_heard_and_acknowledged(
        metadata: fake_metadata.FakeMetadata) -> None:
    metadata.vm_name = "corral-vm-7"
    assert await azure_vm_name(metadata.azure_root, "fallback") == "corral-vm-7"
    heard: list[bool] = []
    watcher = asyncio.create_task(AzurePreemptionWatcher(metadata.azure_root, "corral-vm-7",
                                                         lambda: heard.append(True), period_s=0.05).run())
    # Events that are not this VM's eviction change nothing.
    metadata.events = [
        {"EventId": "e-reboot", "EventType": "Reboot", "ResourceType": "VirtualMachine",
         "Resources": ["corral-vm-7"], "EventStatus": "Scheduled", "NotBefore": "", "Description": "",
         "EventSource": "Platform", "DurationInSeconds": -1},
        {"EventId": "e-other", "EventType": "Preempt", "ResourceType": "VirtualMachine",
         "Resources": ["another-vm"], "EventStatus": "Scheduled", "NotBefore": "", "Description": "",
         "EventSource": "Platform", "DurationInSeconds": -1},
    ]
    await eventually(lambda: sum("scheduledevents" in r for r in metadata.requests) >= 3)
    assert not heard and not watcher.done()
    metadata.events.append({"EventId": "e-mine", "EventType": "Preempt", "ResourceType": "VirtualMachine",
                            "Resources": ["corral-vm-7"], "EventStatus": "Scheduled", "NotBefore": "",
                            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1})
    await asyncio.wait_for(watcher, 5)
    assert heard == [True]
    assert metadata.acknowledged == ["e-mine"]
    assert all("api-version=2020-07-01" in r for r in metadata.requests if "scheduledevents" in r)
