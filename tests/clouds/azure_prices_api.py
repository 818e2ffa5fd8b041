"""A loopback server that speaks the Azure Retail Prices API
(https://learn.microsoft.com/en-us/rest/api/cost-management/retail-prices/azure-retail-prices): GET
/api/retail/prices with `api-version` and an OData `$filter`, over HTTPS with a test CA, as
prices.azure.com is.

It serves a price list (`items`, those of tests/clouds/azure/retail_prices.json to start with) that a test
may change between calls (`set_price`). `$filter` is the documented form: `FIELD eq 'VALUE'` clauses
joined by `and`, FIELD one of the documented filter fields (`priceType` filters the items' `type`), values
compared case-sensitively as from api-version 2023-01-01-preview. Answers hold at most `page_size` items
and a `NextPageLink` to the rest (`$skip`), written with the port as the documented links are. Every
request is recorded (`requests`); a filter outside that form is answered 400 and kept in `violations`.

On demand (`fail`): `500`, `403`, `hang` (no answer for `hang_s` or until the server closes), `huge` (a
chunked body of `huge_bytes`, no Content-Length), `elsewhere` (a NextPageLink to another host),
`malformed` (a 200 whose body is cut short).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import re
import ssl
import urllib.parse
from pathlib import Path
from typing import Any

from aiohttp import web

DOCS = Path(__file__).parent / "azure"
PATH = "/api/retail/prices"
FILTER_FIELDS = {"armRegionName": "armRegionName", "Location": "location", "meterId": "meterId",
                 "meterName": "meterName", "productid": "productId", "skuId": "skuId", "productName": "productName",
                 "skuName": "skuName", "serviceName": "serviceName", "serviceId": "serviceId",
                 "serviceFamily": "serviceFamily", "priceType": "type", "armSkuName": "armSkuName"}
"""The documented filter fields (as the reference spells them) and the item field each one filters."""
_CLAUSE = re.compile(r"(?P<field>[A-Za-z]+) eq '(?P<value>[^']*)'")
FAILURES = ("500", "403", "hang", "huge", "elsewhere", "malformed")


def document(name: str) -> Any:
    return json.loads((DOCS / name).read_text())


@dataclasses.dataclass(frozen=True)
class Recorded:
    path: str
    query: dict[str, str]
    headers: dict[str, str]


class AzurePricesApi:
    """The server on `endpoint` (HTTPS, trusting `ca_file`)."""

    def __init__(self, tls_cert: Path, tls_key: Path, ca_file: Path, *, page_size: int = 100, hang_s: float = 30.0,
                 huge_bytes: int = 8 * 1024 * 1024):
        self.ca_file = ca_file
        self.page_size = page_size
        """Items per page (the reference: "a maximum of 100 records" per request)."""
        self.hang_s = hang_s
        self.huge_bytes = huge_bytes
        self.page = document("retail_prices.json")
        self.items: list[dict[str, Any]] = self.page.pop("Items")
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self.failure = ""
        self.endpoint = ""
        self._tls = (tls_cert, tls_key)
        self._runner: web.AppRunner | None = None
        self._closing = asyncio.Event()

    async def start(self) -> AzurePricesApi:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*self._tls)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=context)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint = f"https://127.0.0.1:{port}{PATH}"
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()

    def fail(self, kind: str) -> None:
        """Every call from now on fails as `kind` (one of FAILURES; '' to stop failing)."""
        if kind and kind not in FAILURES:
            raise ValueError(f"unknown failure {kind!r}; one of {FAILURES}")
        self.failure = kind

    def set_price(self, region: str, sku_name: str, product_name: str, usd: float) -> None:
        """The Consumption items of that meter cost `usd` per hour from now on."""
        found = [i for i in self.items if (i["armRegionName"], i["skuName"], i["productName"], i["type"]) ==
                 (region, sku_name, product_name, "Consumption")]
        assert found, "no such item"
        for item in found:
            item["retailPrice"] = item["unitPrice"] = usd

    def recorded(self) -> list[Recorded]:
        return list(self.requests)

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(Recorded(request.path, dict(request.query), dict(request.headers)))
        if request.method != "GET" or request.path != PATH:
            self.violations.append(f"{request.method} {request.path}: not the API")
            return web.json_response({"Error": {"Code": "NotFound", "Message": "Not found"}}, status=404)
        if self.failure == "hang":
            try:
                await asyncio.wait_for(self._closing.wait(), self.hang_s)
            except TimeoutError:
                pass
            return web.json_response({"Error": {"Code": "Timeout"}}, status=504)
        if self.failure in ("500", "403"):
            return web.json_response({"Error": {"Code": "Failure", "Message": f"failure {self.failure}"}},
                                     status=int(self.failure))
        if self.failure == "huge":
            response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            chunk = b" " * (64 * 1024)
            try:
                for _ in range(self.huge_bytes // len(chunk)):
                    await response.write(chunk)
            except (ConnectionResetError, RuntimeError):
                pass  # the client stopped reading, as it should
            return response
        selected = self._filtered(request.query.get("$filter", ""))
        if selected is None:
            return web.json_response({"Error": {"Code": "BadRequest", "Message": "Invalid $filter"}}, status=400)
        if self.failure == "malformed":
            return web.Response(status=200, body=b'{"BillingCurrency": "USD", "Items": [{"currencyCode": "US',
                                content_type="application/json")
        skip = int(request.query.get("$skip", "0") or 0)
        page = {**copy.deepcopy(self.page), "Items": copy.deepcopy(selected[skip:skip + self.page_size])}
        page["Count"] = len(page["Items"])
        if skip + self.page_size < len(selected) or self.failure == "elsewhere":
            query = {k: v for k, v in request.query.items() if k != "$skip"}
            query["$skip"] = str(skip + self.page_size)
            host = "prices.elsewhere.example:443" if self.failure == "elsewhere" else f"127.0.0.1:{request.url.port}"
            page["NextPageLink"] = f"https://{host}{PATH}?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"
        else:
            page["NextPageLink"] = None
        return web.json_response(page)

    def _filtered(self, text: str) -> list[dict[str, Any]] | None:
        """The items the documented filter form selects; None (and a violation) for another form."""
        wanted: dict[str, str] = {}
        for clause in text.split(" and ") if text else []:
            match = _CLAUSE.fullmatch(clause)
            if match is None or match["field"] not in FILTER_FIELDS:
                self.violations.append(f"$filter {text!r}: {clause!r} is not FIELD eq 'VALUE' with a filter field")
                return None
            wanted[FILTER_FIELDS[match["field"]]] = match["value"]
        return [i for i in self.items if all(i.get(k) == v for k, v in wanted.items())]
