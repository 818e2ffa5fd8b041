"""Watching the cloud for the notice that it is about to reclaim this (spot) machine.

A preempted worker must say so at once, so its attempts end as preempted (not failed) and run again
elsewhere, rather than the driver finding a dead worker a heartbeat timeout later. On the notice the
watcher calls the agent's `preempted()` (what SIGUSR1 does): the worker drains with PREEMPTION_NOTICE
on its session and deactivates saying so.

- GCP: `{root}/instance/preempted` says FALSE until the machine is preempted, then TRUE; with
  `wait_for_change=true` the metadata server holds the request until the value changes (or its
  `timeout_sec` passes), so the notice arrives the moment it is given
  (https://cloud.google.com/compute/docs/instances/spot#detect-preemption,
  https://cloud.google.com/compute/docs/metadata/querying-metadata#waitforchange). The value's ETag is
  sent back as `last_etag`, so a change between two requests is not missed.
- Azure: Scheduled Events, `{root}/scheduledevents?api-version=2020-07-01`, lists upcoming events; an
  event of type `Preempt` whose `Resources` name this VM is its eviction notice (about 30 s ahead). The
  worker acknowledges it (POST `{"StartRequests": [{"EventId": ...}]}`) once its drain has started, which
  tells Azure it need not wait (https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events).
  Scheduled Events are polled, every `period_s` (the document says once a second is fine).

A watcher never dies of a failed request: it logs, backs off and asks again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httpx

from services.worker.cloud import HEADERS, MetadataError, read_text

log = logging.getLogger(__name__)

GCP_WAIT_S = 300
"""How long one GCP long poll may be held open by the metadata server (`timeout_sec`)."""
AZURE_API_VERSION = "2020-07-01"


class GcpPreemptionWatcher:
    """Long-polls `{root}/instance/preempted` until it says TRUE, then calls `on_preempted` once."""

    def __init__(self, root: str, on_preempted: Callable[[], None], wait_s: int = GCP_WAIT_S,
                 retry_s: float = 1.0):
        self._root = root
        self._on_preempted = on_preempted
        self._wait_s = wait_s
        self._retry_s = retry_s

    async def run(self) -> None:
        url = f"{self._root}/instance/preempted"
        etag = ""
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                # The first read returns at once (the machine may be preempted already: a wait for a change
                # would then never end); the next ones wait for a change from the ETag it gave.
                params = {"wait_for_change": "true", "timeout_sec": str(self._wait_s), "last_etag": etag} \
                    if etag else {}
                try:
                    response = await client.get(url, params=params, headers=HEADERS["gcp"],
                                                timeout=self._wait_s + 10)
                    if response.status_code != 200:
                        raise MetadataError(f"{url}: HTTP {response.status_code}")
                    if response.text.strip().upper() == "TRUE":
                        log.warning("the cloud preempts this machine (GCP instance/preempted is TRUE)")
                        self._on_preempted()
                        return
                    etag = response.headers.get("etag", "")
                except (httpx.HTTPError, MetadataError) as e:
                    log.warning("watching for preemption: %s; asking again in %g s", e, self._retry_s)
                    await asyncio.sleep(self._retry_s)


class AzurePreemptionWatcher:
    """Polls Scheduled Events until a Preempt event names this VM; calls `on_preempted`, then acknowledges
    the event."""

    def __init__(self, root: str, vm_name: str, on_preempted: Callable[[], None], period_s: float = 1.0):
        self._root = root
        self._vm_name = vm_name
        self._on_preempted = on_preempted
        self._period_s = period_s

    def _preempt_event(self, text: str) -> str | None:
        """The id of a Preempt event for this VM in a Scheduled Events document, if there is one."""
        try:
            document = json.loads(text)
        except ValueError as e:
            raise MetadataError(f"scheduled events are not JSON: {e}") from None
        events = document.get("Events") if isinstance(document, dict) else None
        for event in events if isinstance(events, list) else []:
            if not isinstance(event, dict) or event.get("EventType") != "Preempt":
                continue
            resources = event.get("Resources")
            if isinstance(resources, list) and self._vm_name in resources and isinstance(event.get("EventId"), str):
                return str(event["EventId"])
        return None

    async def run(self) -> None:
        url = f"{self._root}/scheduledevents"
        params = {"api-version": AZURE_API_VERSION}
        async with httpx.AsyncClient(trust_env=False) as client:
            while True:
                try:
                    event_id = self._preempt_event(await read_text(client, "azure", url, params=params))
                    if event_id is not None:
                        log.warning("the cloud preempts this machine (Azure Scheduled Event %s)", event_id)
                        self._on_preempted()
                        await self._acknowledge(client, url, params, event_id)
                        return
                except (httpx.HTTPError, MetadataError) as e:
                    log.warning("watching for preemption: %s", e)
                await asyncio.sleep(self._period_s)

    async def _acknowledge(self, client: httpx.AsyncClient, url: str, params: dict[str, str], event_id: str) -> None:
        """Tell Azure the VM is ready for the event (best effort: the eviction comes anyway)."""
        try:
            response = await client.post(url, params=params, headers=HEADERS["azure"], timeout=10,
                                         json={"StartRequests": [{"EventId": event_id}]})
            if response.status_code != 200:
                log.warning("acknowledging scheduled event %s: HTTP %d", event_id, response.status_code)
        except httpx.HTTPError as e:
            log.warning("acknowledging scheduled event %s: %s", event_id, e)


async def azure_vm_name(root: str, fallback: str) -> str:
    """This VM's name as Scheduled Events name it (`{root}/instance/compute/name`), or `fallback` if the
    metadata server does not say."""
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            name = await read_text(client, "azure", f"{root}/instance/compute/name",
                                   params={"api-version": "2021-01-01", "format": "text"})
    except (httpx.HTTPError, MetadataError) as e:
        log.warning("this VM's name is not known (%s); taking it to be %s", e, fallback)
        return fallback
    return name.strip() or fallback
