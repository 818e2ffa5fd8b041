"""Azure's current VM prices, from the Azure Retail Prices API (public, unauthenticated; no SDK exists for
it, so aiohttp).

One query per region and VM size: `serviceName eq 'Virtual Machines' and armRegionName eq R and armSkuName
eq S and priceType eq 'Consumption'` at api-version 2023-01-01-preview (the reference documents `eq` and
`and` only, so sizes are not joined with `or`; a whole region's VM prices are thousands of items, tens of
pages). Each query's pages are followed through `NextPageLink`, only to the endpoint's own scheme, host and
port; at most `max_pages` per query and `max_response_bytes` per page, the whole call within `timeout_s`.
Which items price which machine is `catalog_rules` (pure). The answer is USD per VM-hour: the caller
splits it over vCPUs and memory (`products.split_vm_price`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import ssl
import urllib.parse
from collections.abc import Collection
from typing import Any

import aiohttp

from services.driver.pricing.catalog_errors import CatalogUnavailable
from services.driver.pricing.catalog_rules import AzureItemPrice, Unusable, azure_item_price, azure_machine_prices
from services.driver.pricing.products import Machine
from services.driver.providers.azure_config import AzureConfig

log = logging.getLogger(__name__)

API_VERSION = "2023-01-01-preview"
PUBLIC_ENDPOINT = "https://prices.azure.com/api/retail/prices"
WHERE = "Azure retail prices"
_CHUNK_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class AzureRetailSettings:
    """Where and how the Retail Prices API is read."""

    endpoint: str = PUBLIC_ENDPOINT
    """The API's URL (https)."""
    verify: bool | str = True
    """TLS verification: True (the system's CAs) or a CA bundle's path (the tests' CA)."""
    timeout_s: float = 60.0
    """Deadline of a whole call, every query and page included."""
    max_pages: int = 10
    """Pages one query may take (one size in one region is a handful of items, one page)."""
    max_response_bytes: int = 4 * 1024 * 1024
    """A page larger than this fails the call (a page is at most a few hundred KB)."""

    def __post_init__(self) -> None:
        if urllib.parse.urlsplit(self.endpoint).scheme != "https":
            raise ValueError(f"AzureRetailSettings.endpoint {self.endpoint!r} must be https://")
        if not (0 < self.timeout_s <= 3600 and 1 <= self.max_pages <= 1000 and self.max_response_bytes >= 1024):
            raise ValueError("AzureRetailSettings: timeout_s in (0, 3600], max_pages in 1..1000, "
                             "max_response_bytes >= 1024")


def azure_retail_settings(config: AzureConfig) -> AzureRetailSettings:
    """The Retail Prices API as the Azure provider's configuration places it, verified as ARM is."""
    return AzureRetailSettings(endpoint=config.retail_prices_endpoint, verify=config.connection_verify)


async def azure_prices(settings: AzureRetailSettings, machines: Collection[Machine]) -> dict[Machine, float]:
    """The current USD per VM-hour of each Azure machine in `machines` the API prices; CatalogUnavailable
    if it cannot be read within `settings.timeout_s`."""
    wanted = [m for m in machines if m.provider == "azure"]
    if not wanted:
        return {}
    context = ssl.create_default_context(cafile=settings.verify if isinstance(settings.verify, str) else None)
    if settings.verify is False:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    items: list[AzureItemPrice] = []
    refused: set[str] = set()
    try:
        async with asyncio.timeout(settings.timeout_s), aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=settings.timeout_s),
                connector=aiohttp.TCPConnector(ssl=context)) as session:
            for region, size in sorted({(m.region, m.name) for m in wanted}):
                for raw in await _query(session, settings, region, size):
                    try:
                        price = azure_item_price(raw)
                    except Unusable as e:
                        refused.add(str(e))
                        continue
                    if price is not None:
                        items.append(price)
    except TimeoutError:
        raise CatalogUnavailable(f"{WHERE}: no answer within {settings.timeout_s:g} s") from None
    except aiohttp.ClientError as e:
        raise CatalogUnavailable(f"{WHERE}: unreachable: {type(e).__name__}: {_line(str(e))}") from e
    for reason in sorted(refused):
        log.warning("%s: item skipped: %s", WHERE, reason)
    return azure_machine_prices(items, wanted)


def price_filter(region: str, size: str) -> str:
    """The OData filter of one size's hourly prices in one region."""
    for value in (region, size):
        if "'" in value:  # Machine's names cannot hold one; a quote would end the literal
            raise ValueError(f"{value!r} cannot be put in a filter")
    return (f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and armSkuName eq '{size}' "
            "and priceType eq 'Consumption'")


async def _query(session: aiohttp.ClientSession, settings: AzureRetailSettings, region: str,
                 size: str) -> list[Any]:
    """Every item of one query, page after page."""
    items: list[Any] = []
    url = settings.endpoint
    params: dict[str, str] | None = {"api-version": API_VERSION, "$filter": price_filter(region, size)}
    for _ in range(settings.max_pages):
        page = await _page(session, settings, url, params)
        items.extend(page["Items"])
        link = page.get("NextPageLink")
        if not link:
            return items
        if not isinstance(link, str) or not _same_origin(link, settings.endpoint):
            raise CatalogUnavailable(f"{WHERE}: a NextPageLink away from {_origin(settings.endpoint)[1]}")
        url, params = link, None  # the link carries the query and its place in it
    raise CatalogUnavailable(f"{WHERE}: more than {settings.max_pages} pages for {size} in {region}")


async def _page(session: aiohttp.ClientSession, settings: AzureRetailSettings, url: str,
                params: dict[str, str] | None) -> dict[str, Any]:
    async with session.get(url, params=params, allow_redirects=False) as response:
        if response.status != 200:
            raise CatalogUnavailable(f"{WHERE}: HTTP {response.status} {_line(response.reason or '')}")
        declared = response.content_length
        if declared is not None and declared > settings.max_response_bytes:
            raise CatalogUnavailable(f"{WHERE}: a page of {declared} bytes, more than {settings.max_response_bytes}")
        body = bytearray()
        async for chunk in response.content.iter_chunked(_CHUNK_BYTES):
            body += chunk
            if len(body) > settings.max_response_bytes:
                raise CatalogUnavailable(f"{WHERE}: a page of more than {settings.max_response_bytes} bytes")
    try:
        page = json.loads(body)
    except ValueError as e:  # also a body that is not UTF-8
        raise CatalogUnavailable(f"{WHERE}: malformed page: {_line(str(e))}") from None
    if not isinstance(page, dict) or not isinstance(page.get("Items"), list) or \
            not all(isinstance(item, dict) for item in page["Items"]):
        raise CatalogUnavailable(f"{WHERE}: malformed page: no list of Items")
    return page


def _origin(url: str) -> tuple[str, str, int]:
    parts = urllib.parse.urlsplit(url)
    port = parts.port or {"https": 443, "http": 80}.get(parts.scheme, 0)
    return parts.scheme, (parts.hostname or "").lower(), port


def _same_origin(link: str, endpoint: str) -> bool:
    """The documented links name the port (https://prices.azure.com:443/...) where the endpoint may not."""
    try:
        return _origin(link) == _origin(endpoint)
    except ValueError:  # a port that is not a number
        return False


def _line(text: str) -> str:
    stripped = text.strip()
    return stripped.splitlines()[0][:200] if stripped else ""
