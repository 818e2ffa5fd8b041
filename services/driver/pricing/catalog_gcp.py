"""GCP's current machine prices, from the Cloud Billing Catalog API (`services.skus.list` of the Compute
Engine service) through google-cloud-billing's CloudCatalogClient, REST transport.

Which SKUs price which machine is `catalog_rules` (pure). Here: the pages, read in one thread of the call's
own with the call's deadline shared out over the pages (the SDK blocks), at most `max_pages` of them and
`max_skus` SKUs; anything that means "no prices now" is CatalogUnavailable. Only the machines whose cores
and memory were both found come back: the caller keeps its old prices for the rest.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor

import google.auth.exceptions
import requests
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.auth.credentials import Credentials
from google.cloud import billing_v1
from google.protobuf import json_format

from services.driver.pricing.catalog_errors import CatalogUnavailable
from services.driver.pricing.catalog_rules import GcpSkuPrice, Unusable, gcp_machine_prices, gcp_sku_price
from services.driver.pricing.products import Machine, MachinePrice
from services.driver.providers.gcp_config import GcpConfig

log = logging.getLogger(__name__)

COMPUTE_ENGINE = "services/6F81-5844-456A"
"""The Compute Engine service's name in the catalogue (the reference's own example of `parent`)."""
WHERE = "GCP price catalogue"
_USAGE_TYPES = ("OnDemand", "Preemptible")


@dataclasses.dataclass(frozen=True)
class GcpCatalogSettings:
    """Where and how the Cloud Billing catalogue is read."""

    api_endpoint: str = ""
    """The Cloud Billing API's address ('': cloudbilling.googleapis.com); http://HOST:PORT for tests."""
    credentials: Credentials | None = None
    """None: Application Default Credentials (the driver's service account)."""
    timeout_s: float = 120.0
    """Deadline of a whole call, every page included."""
    max_pages: int = 40
    """A call needing more pages than this fails (Compute Engine has some tens of thousands of SKUs, a few
    pages of `page_size`)."""
    page_size: int = 5000
    """SKUs per page asked for (5000 is the API's default and largest)."""
    max_skus: int = 200_000
    """A call that is sent more SKUs than this fails (a page far larger than asked for)."""

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= 3600 and 1 <= self.max_pages <= 1000 and 1 <= self.page_size <= 5000
                and self.max_skus >= 1):
            raise ValueError("GcpCatalogSettings: timeout_s in (0, 3600], max_pages in 1..1000, "
                             "page_size in 1..5000, max_skus >= 1")


def gcp_catalog_settings(config: GcpConfig) -> GcpCatalogSettings:
    """The catalogue as the GCP provider's configuration places it (credentials: ADC)."""
    return GcpCatalogSettings(api_endpoint=config.billing_api_endpoint)


async def gcp_prices(settings: GcpCatalogSettings, machines: Collection[Machine]) -> dict[Machine, MachinePrice]:
    """The current price of each GCP machine in `machines` whose core and memory SKUs the catalogue has;
    CatalogUnavailable if it cannot be read within `settings.timeout_s`."""
    wanted = [m for m in machines if m.provider == "gcp"]
    if not wanted:
        return {}
    regions = frozenset(m.region for m in wanted)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gcp-catalog")
    try:
        # The thread's own deadline ends its last request; this one returns on time even if a server
        # trickles bytes (the SDK's timeout is per socket read).
        async with asyncio.timeout(settings.timeout_s + 1.0):
            skus = await asyncio.get_running_loop().run_in_executor(executor, _read, settings, regions)
    except TimeoutError:
        raise CatalogUnavailable(f"{WHERE}: no answer within {settings.timeout_s:g} s") from None
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
    return gcp_machine_prices(skus, wanted)


def _read(settings: GcpCatalogSettings, regions: frozenset[str]) -> list[GcpSkuPrice]:
    """The SKUs that price machines in `regions`, every page read (blocking)."""
    deadline = time.monotonic() + settings.timeout_s
    try:
        options = ClientOptions(api_endpoint=settings.api_endpoint) if settings.api_endpoint else None
        client = billing_v1.CloudCatalogClient(credentials=settings.credentials, transport="rest",
                                               client_options=options)
        try:
            return _pages(client, settings, regions, deadline)
        finally:
            client.transport.close()
    except api_exceptions.GoogleAPICallError as e:
        raise CatalogUnavailable(f"{WHERE}: HTTP {e.code}: {_line(e.message)}") from e
    except (google.auth.exceptions.RefreshError, google.auth.exceptions.DefaultCredentialsError) as e:
        raise CatalogUnavailable(f"{WHERE}: credentials: {type(e).__name__}") from e
    except (requests.RequestException, google.auth.exceptions.TransportError) as e:
        raise CatalogUnavailable(f"{WHERE}: unreachable: {type(e).__name__}: {_line(str(e))}") from e
    except (json_format.ParseError, ValueError) as e:
        raise CatalogUnavailable(f"{WHERE}: malformed answer: {_line(str(e))}") from e


def _pages(client: billing_v1.CloudCatalogClient, settings: GcpCatalogSettings, regions: frozenset[str],
           deadline: float) -> list[GcpSkuPrice]:
    found: list[GcpSkuPrice] = []
    refused: set[str] = set()
    token, pages, read = "", 0, 0
    while True:
        if pages == settings.max_pages:
            raise CatalogUnavailable(f"{WHERE}: more than {settings.max_pages} pages")
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0:
            raise CatalogUnavailable(f"{WHERE}: not read within {settings.timeout_s:g} s ({pages} pages)")
        request = billing_v1.ListSkusRequest(parent=COMPUTE_ENGINE, currency_code="USD",
                                             page_size=settings.page_size, page_token=token)
        page = client.list_skus(request=request, retry=None, timeout=remaining_s)
        pages += 1
        read += len(page.skus)
        if read > settings.max_skus:
            raise CatalogUnavailable(f"{WHERE}: more than {settings.max_skus} SKUs")
        for sku in page.skus:
            # The cheap tests on the message first: most of Compute Engine's SKUs are disks, networks,
            # licences and other regions.
            category = sku.category
            if category.resource_family != "Compute" or category.usage_type not in _USAGE_TYPES or \
                    regions.isdisjoint(sku.service_regions):
                continue
            try:
                price = gcp_sku_price(billing_v1.Sku.to_dict(sku, preserving_proto_field_name=False))
            except Unusable as e:
                refused.add(str(e))
                continue
            if price is not None:
                found.append(price)
        token = page.next_page_token
        if not token:
            break
    for reason in sorted(refused):
        log.warning("%s: SKU skipped: %s", WHERE, reason)
    return found


def _line(text: str) -> str:
    """The first line of an error's text, short (a log line and an error message, not a body)."""
    stripped = (text or "").strip()
    return stripped.splitlines()[0][:200] if stripped else ""
