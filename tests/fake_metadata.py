"""A cloud machine's metadata server on 127.0.0.1 port 0, speaking the documented endpoints a corral
worker reads, for GCP and Azure at once (each under its own root), and refusing any request without the
cloud's header, as the real ones do:

- GCP (root `/computeMetadata/v1`, header `Metadata-Flavor: Google`;
  https://cloud.google.com/compute/docs/metadata/querying-metadata):
  `instance/attributes/corral-worker` (the boot data), and `instance/preempted` (FALSE, then TRUE), which
  with `wait_for_change=true` holds the request until the value's ETag differs from `last_etag` (or,
  without it, from the value's when asked) or `timeout_sec` passes (https://cloud.google.com/compute/docs/instances/spot#detect-preemption);
- Azure (root `/metadata`, header `Metadata: true`;
  https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service):
  `instance/compute/userData` (base64 of the boot data, with `format=text`), `instance/compute/name`, and
  `scheduledevents` (GET: the events document; POST: `StartRequests` acknowledging events, recorded;
  https://learn.microsoft.com/azure/virtual-machines/linux/scheduled-events). Every Azure request must
  carry an `api-version`.

Stopped when its context ends.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any


class FakeMetadata:
    """The state a test controls: the boot data, preemption, scheduled events; and what was asked."""

    def __init__(self) -> None:
        self.bootstrap_json = ""
        self.vm_name = "vm"
        self.preempted = False
        self.events: list[dict[str, Any]] = []
        self.acknowledged: list[str] = []
        self.failures = 0
        """The next this many requests get HTTP 503 (a metadata server not ready yet)."""
        self.requests: list[str] = []
        self.changed = threading.Condition()
        self.port = 0

    @property
    def gcp_root(self) -> str:
        return f"http://127.0.0.1:{self.port}/computeMetadata/v1"

    @property
    def azure_root(self) -> str:
        return f"http://127.0.0.1:{self.port}/metadata"

    def preempt(self) -> None:
        """The cloud reclaims the machine: instance/preempted turns TRUE (waiting requests answered now)."""
        with self.changed:
            self.preempted = True
            self.changed.notify_all()

    def _preempted_value(self) -> tuple[str, str]:
        value = "TRUE" if self.preempted else "FALSE"
        return value, hashlib.sha256(value.encode()).hexdigest()[:16]


@contextlib.contextmanager
def serving() -> Iterator[FakeMetadata]:
    state = FakeMetadata()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _route(self) -> tuple[str, str, dict[str, str]] | None:
            """(cloud, path under its root, query) once the cloud's header is checked; None if answered."""
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            state.requests.append(f"{self.command} {self.path}")
            if state.failures > 0:
                state.failures -= 1
                self._reply(503)
                return None
            for cloud, root, header, value in (("gcp", "/computeMetadata/v1/", "Metadata-Flavor", "Google"),
                                               ("azure", "/metadata/", "Metadata", "true")):
                if url.path.startswith(root):
                    if self.headers.get(header) != value:
                        self._reply(403, b"missing the metadata header")
                        return None
                    if cloud == "azure" and "api-version" not in query:
                        self._reply(400, b"missing api-version")
                        return None
                    return cloud, url.path.removeprefix(root), query
            self._reply(404)
            return None

        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            route = self._route()
            if route is None:
                return
            cloud, path, query = route
            if cloud == "gcp" and path == "instance/attributes/corral-worker" and state.bootstrap_json:
                self._reply(200, state.bootstrap_json.encode())
            elif cloud == "gcp" and path == "instance/preempted":
                with state.changed:
                    if query.get("wait_for_change") == "true":
                        # Without last_etag, until the value differs from what it is now.
                        seen = query.get("last_etag") or state._preempted_value()[1]
                        state.changed.wait_for(lambda: state._preempted_value()[1] != seen,
                                               timeout=float(query.get("timeout_sec", "60")))
                    value, etag = state._preempted_value()
                self._reply(200, value.encode(), {"ETag": etag, "Content-Type": "application/text"})
            elif cloud == "azure" and path == "instance/compute/userData" and query.get("format") == "text":
                self._reply(200, base64.b64encode(state.bootstrap_json.encode()))
            elif cloud == "azure" and path == "instance/compute/name" and query.get("format") == "text":
                self._reply(200, state.vm_name.encode())
            elif cloud == "azure" and path == "scheduledevents":
                document = {"DocumentIncarnation": len(state.events), "Events": state.events}
                self._reply(200, json.dumps(document).encode(), {"Content-Type": "application/json"})
            else:
                self._reply(404)

        def do_POST(self) -> None:  # noqa: N802
            route = self._route()
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if route is None:
                return
            cloud, path, _ = route
            if cloud == "azure" and path == "scheduledevents":
                for request in json.loads(body).get("StartRequests", []):
                    state.acknowledged.append(request["EventId"])
                self._reply(200)
            else:
                self._reply(404)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.preempt()  # release any held long poll
        server.shutdown()
        server.server_close()
        thread.join(10)
