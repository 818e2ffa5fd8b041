"""Where a worker's pulls may connect: the worker's half of services.common.registry_rules.

The frontend checked each job's registry when the job was submitted; DNS may have changed since (a
name that resolved to a public address may now resolve to 127.0.0.1), and a registry talks back: its
answer can send skopeo elsewhere, to the URL of its token service (`WWW-Authenticate: Bearer
realm=...`) or to a redirect's `Location`, which skopeo follows on its own. So the worker checks twice:

- `registry_refusal`, before a pull asks the registry anything: the job's registry, its host resolved
  now. A refused registry is never contacted (PullFailure.REFUSED, in the rules' words).
- `EgressProxy`, during the pull: skopeo's every connection goes through this HTTP proxy on the
  worker's loopback (`HTTPS_PROXY`, `HTTP_PROXY`), which resolves the host itself, checks every
  address against the same rules, and connects to a checked address: a name rebound between the check
  and the connection, a token realm or a redirect to the metadata server or a private address reaches
  nothing. Only CONNECT (HTTPS) goes through; plain HTTP is for the registries the deployment names,
  which skopeo reaches directly (`NO_PROXY`), so a plain-HTTP redirect elsewhere is refused. The proxy
  asks for a password of its own, which only the worker's skopeo runs hold (in their environment, never
  on a command line): another account's processes cannot use up its connections.

**What remains.** Go's HTTP client never uses a proxy for `localhost` or a loopback address literal:
a token realm or a redirect naming one (`https://127.0.0.1:8443/...`) is fetched directly, from the
worker. skopeo then makes one HTTP GET there (with the job's own registry login on a token realm, never
the deployment's), and the user is told only corral's words for the failure (`PullFailure`), never what
answered; services on the worker's loopback must authenticate their callers, as corral's do.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import secrets

from services.common.callback_hosts import Resolve, Unresolved
from services.common.image_refs import OWN_REGISTRY, InvalidImageReference
from services.common.registry_rules import ALLOWED_HINT, RegistryHost, RegistryRules, needs_lookup, refusal
from services.common.urls import IPAddress

log = logging.getLogger(__name__)

REFUSAL_REASON = "corral refuses this destination"
"""The proxy's answer to a connection it refuses (a 403's reason phrase): skopeo repeats it, and
services.worker.image_tools reads it as PullFailure.REFUSED."""
UNREACHABLE_REASONS = ("destination unreachable", "egress proxy busy")
"""The proxy's other answers (a 502 when no checked address takes the connection, a 503 when it holds
`max_connections`), which services.worker.image_tools reads as PullFailure.UNREACHABLE."""
MAX_HEAD_BYTES = 8192
"""Longest request head the proxy reads."""


async def registry_refusal(registry: str, rules: RegistryRules, resolve: Resolve) -> str | None:
    """Why a job's image may not come from `registry` (host[:port]) now, in the user's words; None if it may
    (a name that does not resolve may: the pull then finds it unreachable)."""
    why, _ = await _checked(registry, rules, resolve)
    return why


async def _checked(registry: str, rules: RegistryRules, resolve: Resolve) -> tuple[str | None, list[IPAddress]]:
    """Why `registry` is refused (None if it is not), and the addresses to connect to (resolved now)."""
    try:
        host = RegistryHost.parse(registry)
    except InvalidImageReference as e:
        return str(e), []
    if host.registry == OWN_REGISTRY:  # a name in references, never this machine: the cache asks the real address
        return f"registry {OWN_REGISTRY} is corral's own registry's name, not an address: {ALLOWED_HINT}", []
    if host.address is not None:
        return refusal(host, rules), [host.address]
    addresses: list[IPAddress] = []
    if needs_lookup(host, rules) or rules.names(host):
        try:
            addresses = await resolve(host.host, host.port)
        except Unresolved:
            return None, []
    return refusal(host, rules, addresses), addresses


class EgressProxy:
    """An HTTP CONNECT proxy on 127.0.0.1 that connects only where `rules` allow (see the module docstring).
    `start` it in the worker's event loop, give skopeo `environment()`, `close` it at the end."""

    def __init__(self, rules: RegistryRules, resolve: Resolve, connect_timeout_s: float = 10.0,
                 head_timeout_s: float = 10.0, max_connections: int = 256):
        self.rules = rules
        self._resolve = resolve
        self.connect_timeout_s = connect_timeout_s
        """Longest wait for a destination to accept a connection."""
        self.head_timeout_s = head_timeout_s
        """Longest wait for a client's request head."""
        self.max_connections = max_connections
        """Connections open through the proxy at once; more are refused (503)."""
        self._password = secrets.token_urlsafe(24)
        self._server: asyncio.Server | None = None
        self._open = 0
        self.refused: list[str] = []
        """The destinations refused (`host:port`), the latest 100: for the worker's log and the tests."""

    async def start(self) -> None:
        """Listen on a free port of 127.0.0.1."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=MAX_HEAD_BYTES)

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return self._server.sockets[0].getsockname()[1]

    def environment(self) -> dict[str, str]:
        """What skopeo's environment needs for its connections to go through the proxy: the proxy's URL, with
        its password, for HTTPS and plain HTTP alike; the registries the deployment names bypass it."""
        url = f"http://corral:{self._password}@127.0.0.1:{self.port}"
        bypass = ",".join(sorted(self.rules.configured))
        return {"HTTPS_PROXY": url, "https_proxy": url, "HTTP_PROXY": url, "http_proxy": url,
                "NO_PROXY": bypass, "no_proxy": bypass}

    async def close(self) -> None:
        """Stop listening; tunnels still open end with their skopeo."""
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._open >= self.max_connections:
            await _answer(writer, 503, UNREACHABLE_REASONS[1])
            return
        self._open += 1
        try:
            await self._tunnel(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, TimeoutError):
            pass
        finally:
            self._open -= 1
            writer.close()

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(self.head_timeout_s):
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        method, target, _ = (request_line.split(" ") + ["", ""])[:3]
        headers = {name.strip().lower(): value.strip()
                   for name, _, value in (line.partition(":") for line in header_lines if line)}
        if not self._authorised(headers.get("proxy-authorization", "")):
            await _answer(writer, 407, "proxy authentication required")
            return
        if method != "CONNECT":
            # Plain HTTP goes to the registries the deployment names only, and those skopeo reaches directly.
            self._note_refusal(target)
            await _answer(writer, 403, REFUSAL_REASON)
            return
        why, addresses = await _checked(target, self.rules, self._resolve)
        if why is not None:
            log.warning("egress: refused a pull's connection to %s: %s", target, why)
            self._note_refusal(target)
            await _answer(writer, 403, REFUSAL_REASON)
            return
        port = RegistryHost.parse(target).port
        upstream = None  # and with no address (the name does not resolve), unreachable
        for address in addresses:
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    upstream = await asyncio.open_connection(str(address), port)
                break
            except (OSError, TimeoutError):
                continue
        if upstream is None:
            await _answer(writer, 502, UNREACHABLE_REASONS[0])
            return
        up_reader, up_writer = upstream
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()

    def _authorised(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        expected = base64.b64encode(f"corral:{self._password}".encode()).decode()
        return scheme.lower() == "basic" and secrets.compare_digest(token.strip(), expected)

    def _note_refusal(self, target: str) -> None:
        self.refused = [*self.refused[-99:], target]


async def _answer(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".encode())
    with contextlib.suppress(OSError):
        await writer.drain()
    writer.close()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    """Copy until `source` ends, then end `sink`'s writing half."""
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            if sink.can_write_eof():
                sink.write_eof()
