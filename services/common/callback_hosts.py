"""Reaching a callback host safely: the I/O half of `services/common/urls.py`.

A callback URL names a host; `checked_addresses` resolves it (through an
injected `Resolve`, the system's `getaddrinfo` by default) and refuses it if
any address is one callbacks may not reach. The frontend does this when a
batch is created; the driver again when it sends, through `PinnedTransport`,
which connects to an address it has just checked rather than letting the
HTTP client resolve the name a second time: a name that resolves to a public
address at submission and to a private one a moment later (DNS rebinding)
gets nowhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import ipaddress
import socket
from collections.abc import Awaitable, Callable

import httpx

from services.common.urls import (
    CallbackRules,
    CallbackTarget,
    IPAddress,
    RefusedUrl,
    address_kind,
    parse_callback_url,
)

Resolve = Callable[[str, int], Awaitable[list[IPAddress]]]
"""`await resolve(host, port)`: the host's addresses, or `Unresolved`."""


class Unresolved(Exception):
    """The host's name did not resolve; the message says why."""

    def __init__(self, message: str, transient: bool):
        super().__init__(message)
        self.transient = transient
        """A timeout or a temporary failure of DNS: trying again later may work."""


class SystemResolver:
    """`getaddrinfo` in a small thread pool of its own, bounded by `timeout_s`.

    Its own pool, so that names that are slow to resolve (anyone may submit
    such a callback URL) hold up at most `threads` threads and never the event
    loop's default executor, which the services use for file I/O. A lookup
    that outlives its timeout still holds its thread until the system
    resolver gives up; lookups queued behind it time out."""

    def __init__(self, timeout_s: float = 2.0, threads: int = 4):
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="resolve")

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            async with asyncio.timeout(self.timeout_s):
                infos = await asyncio.get_running_loop().run_in_executor(self._pool, lookup)
        except TimeoutError:
            raise Unresolved(f"{host} did not resolve within {self.timeout_s:g} s", transient=True) from None
        except socket.gaierror as e:
            raise Unresolved(f"{host} does not resolve: {e.strerror}", transient=e.errno == socket.EAI_AGAIN) from None
        addresses: list[IPAddress] = []
        for family, _, _, _, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
                if address not in addresses:
                    addresses.append(address)
        if not addresses:
            raise Unresolved(f"{host} has no IPv4 or IPv6 address", transient=False)
        return addresses

    def close(self) -> None:
        """Stop the pool's threads (a lookup under way finishes first, in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


async def checked_addresses(url: str, rules: CallbackRules, resolve: Resolve
                            ) -> tuple[CallbackTarget, list[IPAddress]]:
    """Where a callback URL points and every address of its host, all of them allowed.
    Raises RefusedUrl (the URL or one of its addresses is refused) or Unresolved."""
    target = parse_callback_url(url, rules)
    if target.address is not None:
        return target, [target.address]
    addresses = await resolve(target.host, target.port)
    for address in addresses:
        if what := address_kind(address, rules):
            raise RefusedUrl(f"{target.host} resolves to {address}, {what}")
    return target, addresses


class PinnedTransport(httpx.AsyncBaseTransport):
    """An httpx transport that connects only to addresses it has checked.

    For each request it resolves the host itself (`checked_addresses`),
    refuses the request (RefusedUrl) if any address is forbidden, and sends it
    to a checked address (the next one if that cannot be connected to), with
    the name kept in the Host header and in TLS: the `sni_hostname` request
    extension makes httpx send it as SNI and verify the certificate for it.
    Connections are not kept alive, so one verified for one name is never
    reused for another name at the same address. Proxies from the environment
    are ignored: a proxy would do its own resolving."""

    def __init__(self, rules: CallbackRules, resolve: Resolve, inner: httpx.AsyncBaseTransport | None = None):
        self.rules = rules
        self._resolve = resolve
        self._inner = inner or httpx.AsyncHTTPTransport(
            trust_env=False, limits=httpx.Limits(max_keepalive_connections=0))

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        _, addresses = await checked_addresses(str(request.url), self.rules, self._resolve)
        name = request.url.raw_host.decode("ascii")
        failure: Exception | None = None
        for address in addresses:
            pinned = httpx.Request(request.method, request.url.copy_with(host=str(address)),
                                   headers=request.headers,  # Host is the name's, set when the request was built
                                   stream=request.stream, extensions={**request.extensions, "sni_hostname": name})
            try:
                return await self._inner.handle_async_request(pinned)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                failure = e
        assert failure is not None
        raise failure

    async def aclose(self) -> None:
        await self._inner.aclose()
