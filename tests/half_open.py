"""A slow-client attacker: many TLS connections that each send half a request and then nothing.

    python -m tests.half_open --port PORT [--host 127.0.0.1] [--source 127.0.0.2] --count N [--protocol h2|http/1.1]

Each connection completes its TLS handshake and sends half a request:
HTTP/2's preface, its SETTINGS and a HEADERS frame whose header announces
more bytes than follow; or, for HTTP/1.1, a request line and a header line
with no blank line after them. Then it holds the connection open and sends
nothing more. It prints a JSON line every `--report-every-s` (`{"open": n,
"refused": m, "closed_by_peer": k}`: `open` counts connections that got as far
as sending their half request and are still open; `refused`, those the peer
closed or refused before that; `closed_by_peer`, those it closed after), one
with `"done": true` once all `count` were tried, and goes on reporting until
its standard input closes (the test closes it, or dies); then it exits.

A process of its own, so that the test's event loop (which serves the services
behind the gateway) is not slowed, and with its own file descriptor limit
(raised to its hard limit). Plain non-blocking sockets and one selector:
asyncio's TLS transport holds some 300 KB per connection, this some 40 KB.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import resource
import selectors
import socket
import ssl
import sys
import time

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# A HEADERS frame on stream 1 (END_HEADERS set) announcing 64 bytes of header block, and only 5 of them.
HALF_HEADERS = b"\x00\x00\x40\x01\x04\x00\x00\x00\x01" + b"\x82\x87\x84\x41\x0f"
HALF_HTTP1 = b"POST /corral.auth.v1.AuthService/WhoAmI HTTP/1.1\r\nHost: corral\r\nContent-Type: appl"


def half_request(protocol: str) -> bytes:
    """The bytes one connection sends before it falls silent."""
    return H2_PREFACE + EMPTY_SETTINGS + HALF_HEADERS if protocol == "h2" else HALF_HTTP1


def raise_fd_limit() -> int:
    """The soft file descriptor limit raised to the hard one; returns it."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class Connection:
    """One attacking connection: connecting, shaking hands, sending, then holding."""

    def __init__(self, sock: ssl.SSLSocket, payload: bytes):
        self.sock = sock
        self.pending = payload
        self.state = "connecting"

    def step(self) -> str:
        """Advance as far as the socket allows; returns the new state (connecting, handshake, sending, held,
        failed or closed)."""
        try:
            if self.state == "connecting":
                error = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error:
                    return self._end("failed")
                self.state = "handshake"
            if self.state == "handshake":
                self.sock.do_handshake()
                self.state = "sending"
            if self.state == "sending":
                while self.pending:
                    self.pending = self.pending[self.sock.send(self.pending):]
                self.state = "held"
            elif self.state == "held":
                # Readable while held: the peer sent something (its SETTINGS, a GOAWAY) or closed.
                while True:
                    if not self.sock.recv(65536):
                        return self._end("closed")
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
            return self.state
        except (OSError, ssl.SSLError):
            return self._end("failed" if self.state != "held" else "closed")
        return self.state

    def _end(self, state: str) -> str:
        self.state = state
        self.sock.close()
        return state


class Attack:
    """`count` connections, at most `in_flight` of them connecting or shaking hands at once."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.payload = half_request(args.protocol)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE  # the attacker trusts anything: verifying costs it CPU
        self.context.set_alpn_protocols([args.protocol])
        self.selector = selectors.DefaultSelector()
        self.started = 0
        self.in_flight = 0
        self.open = 0
        self.refused = 0
        self.closed_by_peer = 0

    def start_one(self) -> None:
        raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        raw.setblocking(False)
        self.started += 1
        try:
            raw.bind((self.args.source, 0))
            raw.connect_ex((self.args.host, self.args.port))
            sock = self.context.wrap_socket(raw, server_hostname="localhost", do_handshake_on_connect=False)
        except OSError:
            raw.close()
            self.refused += 1
            return
        self.in_flight += 1
        connection = Connection(sock, self.payload)
        self.selector.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE, connection)

    def on_event(self, connection: Connection) -> None:
        before = connection.state
        after = connection.step()
        if after == before:
            return
        if after in ("failed", "closed"):
            self.selector.unregister(connection.sock)
        if before in ("connecting", "handshake", "sending"):
            if after == "held":
                self.in_flight -= 1
                self.open += 1
                # Held: only the peer's bytes or its close matter now.
                self.selector.modify(connection.sock, selectors.EVENT_READ, connection)
            elif after == "failed":
                self.in_flight -= 1
                self.refused += 1
        elif before == "held" and after == "closed":
            self.open -= 1
            self.closed_by_peer += 1

    def report(self, **extra: object) -> None:
        print(json.dumps({"open": self.open, "refused": self.refused, "closed_by_peer": self.closed_by_peer,
                          **extra}), flush=True)

    def run(self) -> None:
        next_report = time.monotonic() + self.args.report_every_s
        done = False
        stdin_open = True
        os.set_blocking(sys.stdin.fileno(), False)
        while stdin_open:
            while self.started < self.args.count and self.in_flight < self.args.in_flight:
                self.start_one()
            for key, _ in self.selector.select(timeout=0.05):
                self.on_event(key.data)
            if not done and self.started >= self.args.count and self.in_flight == 0:
                done = True
                self.report(done=True)
            if time.monotonic() >= next_report:
                self.report(done=done)
                next_report += self.args.report_every_s
                stdin_open = _stdin_open()


def _stdin_open() -> bool:
    try:
        return os.read(sys.stdin.fileno(), 4096) != b""
    except BlockingIOError:
        return True
    except OSError as e:
        return e.errno == errno.EAGAIN


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--source", default="127.0.0.2", help="the local address the connections come from")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--protocol", choices=("h2", "http/1.1"), default="h2")
    parser.add_argument("--in-flight", type=int, default=200, help="connections connecting or shaking hands at once")
    parser.add_argument("--report-every-s", type=float, default=0.5)
    return parser.parse_args(argv)


if __name__ == "__main__":
    raise_fd_limit()
    Attack(parse()).run()
