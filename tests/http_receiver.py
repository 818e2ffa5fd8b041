"""An HTTP(S) server on 127.0.0.1 port 0 that records what is POSTed to it:
where completion callbacks land in tests."""

from __future__ import annotations

import contextlib
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from typing import Any


class Receiver:
    """Records every request and answers with the next status of `statuses`
    (200 when none is left); requests to /slow get no answer until it stops.
    With `tls`, it serves HTTPS with that context."""

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        self.release = threading.Event()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"path": self.path, "headers": dict(self.headers),
                                          "body": json.loads(body)})
                if self.path == "/slow":
                    receiver.release.wait(10)
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    def url(self, path: str = "/done", host: str = "127.0.0.1", scheme: str = "http") -> str:
        return f"{scheme}://{host}:{self.port}{path}"

    def posts(self, path: str = "/done") -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]


@contextlib.contextmanager
def receiving(tls: ssl.SSLContext | None = None) -> Iterator[Receiver]:
    """A running Receiver, stopped (and joined) on exit."""
    r = Receiver(tls)
    r.thread.start()
    try:
        yield r
    finally:
        r.release.set()
        r.server.shutdown()
        r.server.server_close()
        r.thread.join()
