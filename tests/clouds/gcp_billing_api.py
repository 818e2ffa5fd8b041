"""A loopback server that speaks the Cloud Billing Catalog API's `services.skus.list`
(GET /v1/services/{service}/skus, https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list),
for google-cloud-billing's CloudCatalogClient over REST.

It serves a price list (`skus`, the SKUs of tests/clouds/gcp/services.skus.list.json to start with) that a
test may change between calls (`set_price`), in pages of `pageSize` SKUs (at most `page_size`, so a small
one makes the client follow `nextPageToken`). Every request is recorded (`requests`); a query parameter
the method does not document is answered 400, as the API does, and kept in `violations`.

On demand (`fail`): `500` (an internal error), `403` (PERMISSION_DENIED, the documented error body),
`hang` (no answer until `hang_s` has passed or the server stops), `huge` (a page of `huge_skus` SKUs,
whatever was asked), `malformed` (a 200 whose body is not JSON).
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import re
import threading
import urllib.parse
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).parent / "gcp"
PARAMETERS = {"currencyCode", "pageSize", "pageToken", "startTime", "endTime"}
"""The method's documented query parameters (its reference page's "Query parameters")."""
SYSTEM_PARAMETERS = {"$alt", "alt", "fields", "key", "prettyPrint", "quotaUser", "$.xgafv", "callback",
                     "access_token", "upload_protocol", "uploadType"}
"""Standard parameters every method takes (https://cloud.google.com/apis/docs/system-parameters)."""
ROUTE = re.compile(r"/v1/services/(?P<service>[^/]+)/skus")
DEFAULT_PAGE_SIZE = 5000
"""The reference: "Requested page size. Defaults to 5000."."""
FAILURES = ("500", "403", "hang", "huge", "malformed")


def example(name: str) -> Any:
    return json.loads((EXAMPLES / name).read_text())


@dataclasses.dataclass(frozen=True)
class Recorded:
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]


class GcpBillingApi:
    """The server; `start()` binds 127.0.0.1 on a free port, `stop()` ends it."""

    def __init__(self, service: str = "6F81-5844-456A", page_size: int = DEFAULT_PAGE_SIZE, hang_s: float = 30.0,
                 huge_skus: int = 20_000):
        self.service = service
        self.page_size = page_size
        """The most SKUs a page holds (the API's own limit is 5000)."""
        self.hang_s = hang_s
        self.huge_skus = huge_skus
        self.skus: list[dict[str, Any]] = example("services.skus.list.json")["skus"]
        self.requests: list[Recorded] = []
        self.violations: list[str] = []
        self._failure = ""
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Starts serving; returns the endpoint (http://127.0.0.1:PORT)."""
        api = self

        class Handler(_Handler):
            server_api = api

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, args=(0.05,), name="gcp-billing", daemon=True).start()
        return self.endpoint

    @property
    def endpoint(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def fail(self, kind: str) -> None:
        """Every call from now on fails as `kind` (one of FAILURES; '' to stop failing)."""
        if kind and kind not in FAILURES:
            raise ValueError(f"unknown failure {kind!r}; one of {FAILURES}")
        with self._lock:
            self._failure = kind

    def set_price(self, description: str, usd: str) -> None:
        """The SKU described so costs `usd` (a decimal string) per unit from now on."""
        amount = Decimal(usd)
        units = int(amount)
        nanos = int((amount - units) * 1_000_000_000)
        with self._lock:
            [sku] = [s for s in self.skus if s["description"] == description]
            rate = sku["pricingInfo"][0]["pricingExpression"]["tieredRates"][0]["unitPrice"]
            rate.update(units=str(units), nanos=nanos)

    def calls(self) -> list[Recorded]:
        with self._lock:
            return list(self.requests)

    def answer(self, service: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        """The status and body of one skus.list call."""
        with self._lock:
            failure = self._failure
            skus = copy.deepcopy(self.skus)
        if failure == "hang":
            self._stopping.wait(self.hang_s)
            return 503, {"error": {"code": 503, "message": "The service is currently unavailable.",
                                   "status": "UNAVAILABLE"}}
        if failure == "500":
            return 500, {"error": {"code": 500, "message": "Internal error encountered.", "status": "INTERNAL"}}
        if failure == "403":
            return 403, example("error.billing.permission-denied.json")
        if service != self.service:
            return 404, {"error": {"code": 404, "message": f"Service services/{service} not found.",
                                   "status": "NOT_FOUND"}}
        if failure == "huge":
            return 200, {"skus": [skus[0]] * self.huge_skus, "nextPageToken": ""}
        size = min(int(query.get("pageSize", [str(DEFAULT_PAGE_SIZE)])[0] or DEFAULT_PAGE_SIZE), self.page_size)
        token = query.get("pageToken", [""])[0]
        start = int(base64.urlsafe_b64decode(token).decode()) if token else 0
        end = start + size
        next_token = base64.urlsafe_b64encode(str(end).encode()).decode() if end < len(skus) else ""
        return 200, {"skus": skus[start:end], "nextPageToken": next_token}


class _Handler(BaseHTTPRequestHandler):
    server_api: GcpBillingApi
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        api = self.server_api
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        with api._lock:
            api.requests.append(Recorded(url.path, query, dict(self.headers)))
        match = ROUTE.fullmatch(url.path)
        unknown = set(query) - PARAMETERS - SYSTEM_PARAMETERS
        if match is None or unknown:
            problem = f"GET {url.path}: " + (f"unknown parameters {sorted(unknown)}" if unknown else "no such method")
            with api._lock:
                api.violations.append(problem)
            self._send(400 if match else 404, {"error": {"code": 400 if match else 404, "message": problem,
                                                         "status": "INVALID_ARGUMENT" if match else "NOT_FOUND"}})
            return
        if api._failure == "malformed":
            self._send_bytes(200, b'{"skus": [{"name": "services/6F81-5844-456A/skus/0C5C-D8E4-38C1", "descr')
            return
        status, body = api.answer(match["service"], query)
        self._send(status, body)

    def _send(self, status: int, body: Any) -> None:
        self._send_bytes(status, json.dumps(body).encode())

    def _send_bytes(self, status: int, data: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (its deadline), as it should
