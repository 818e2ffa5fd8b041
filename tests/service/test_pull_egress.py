"""Issue 33 part 6, while the image is pulled: the worker's egress proxy (services.worker.egress) connects
only where a job's image may come from, to an address it has just checked. Real skopeo through the image
cache wired as the worker wires it (services.worker.app._image_cache); a fake registry that sends the
pull elsewhere (its token service's realm, a redirect), the names resolved by the test's own table.
docs/security.md, "What must not happen": an image reference makes a worker probe the host."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import http.server
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from services.common.callback_hosts import Unresolved
from services.common.image_refs import Mirror
from services.common.registry_rules import RegistryRules
from services.common.tls import DevCertificateAuthority
from services.common.urls import IPAddress
from services.worker.app import _image_cache
from services.worker.config import WorkerConfig
from services.worker.egress import EgressProxy
from services.worker.image_tools import ImagePullError, PullFailure, SkopeoUmoci
from services.worker.images import ImageCache

pytestmark = pytest.mark.timeout(120)


class Resolver:
    """Names to addresses, from a table whose entries may change between lookups (a list per name: each
    lookup takes the next, the last one stays)."""

    def __init__(self, table: dict[str, list[list[str]]]):
        self.table = table
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        if host not in self.table:
            raise Unresolved(f"{host} does not resolve", transient=False)
        answers = self.table[host]
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        return [ipaddress.ip_address(a) for a in answer]


class Knocks:
    """A TCP listener on 127.0.0.1 that counts who connects (and answers nothing)."""

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.socket.settimeout(0.1)
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                connection, _ = self.socket.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.count += 1
            connection.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.socket.close()


@contextlib.contextmanager
def knocks() -> Iterator[Knocks]:
    listener = Knocks()
    try:
        yield listener
    finally:
        listener.close()


@contextlib.contextmanager
def fake_registry(tls: ssl.SSLContext, elsewhere: str) -> Iterator[int]:
    """An HTTPS 'registry' on 127.0.0.1 that sends every pull to `elsewhere` (https://host:port): repositories
    under realm/ through its token service's realm, under redirect/ by redirecting the manifest. Its port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the name http.server calls
            if self.path.startswith("/v2/redirect/"):
                self.send_response(307)
                self.send_header("Location", f"{elsewhere}/manifest")
            else:
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="{elsewhere}/token",service="fake"')
            self.send_header("Docker-Distribution-Api-Version", "registry/2.0")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """A server context whose certificate names registry.test and evil.test, and the CA that signed it."""
    files = DevCertificateAuthority(tmp_path / "ca").issue("registry", hostnames=("registry.test", "evil.test"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    return context, files.ca_cert


async def raw(proxy: EgressProxy, head: str, authorised: bool = True) -> tuple[str, asyncio.StreamReader,
                                                                               asyncio.StreamWriter]:
    """Send a request head to the proxy; its status line, and the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    url = proxy.environment()["HTTPS_PROXY"]
    password = url.split(":")[2].split("@")[0]
    auth = base64.b64encode(f"corral:{password}".encode()).decode()
    writer.write((head + (f"Proxy-Authorization: Basic {auth}\r\n" if authorised else "") + "\r\n").encode())
    await writer.drain()
    status = (await reader.readline()).decode().strip()
    return status, reader, writer


async def test_the_proxy_connects_only_where_the_rules_allow_to_the_address_it_checked() -> None:
    with knocks() as target:
        resolver = Resolver({"registry.test": [["127.0.0.1"]], "rebound.test": [["127.0.0.1"]],
                             "public.test": [["93.184.215.14"]]})
        proxy = EgressProxy(RegistryRules.of(None, [f"registry.test:{target.port}"]), resolver)
        await proxy.start()
        try:
            status, _, writer = await raw(proxy, f"CONNECT registry.test:{target.port} HTTP/1.1\r\n")
            assert status == "HTTP/1.1 200 Connection established"  # named by the deployment: to its address
            writer.close()
            for refused in (f"CONNECT 127.0.0.1:{target.port} HTTP/1.1\r\n",  # the same port, by address: not named
                            f"CONNECT rebound.test:{target.port} HTTP/1.1\r\n",  # a name that resolves to loopback
                            "CONNECT 169.254.169.254:80 HTTP/1.1\r\n",
                            "CONNECT [::1]:22 HTTP/1.1\r\n",
                            f"GET http://registry.test:{target.port}/v2/ HTTP/1.1\r\n"):  # plain HTTP: never
                status, _, writer = await raw(proxy, refused)
                assert status == "HTTP/1.1 403 corral refuses this destination", refused
                writer.close()
            status, _, writer = await raw(proxy, "CONNECT nowhere.test:443 HTTP/1.1\r\n")
            assert status == "HTTP/1.1 502 destination unreachable"  # as skopeo would find it
            writer.close()
            status, _, writer = await raw(proxy, f"CONNECT registry.test:{target.port} HTTP/1.1\r\n",
                                          authorised=False)
            assert status == "HTTP/1.1 407 proxy authentication required"  # only the worker's skopeo holds it
            writer.close()
            await asyncio.sleep(0.3)
            assert target.count == 1
            assert proxy.refused[-5:] == [f"127.0.0.1:{target.port}", f"rebound.test:{target.port}",
                                          "169.254.169.254:80", "[::1]:22", f"http://registry.test:{target.port}/v2/"]
        finally:
            await proxy.close()


def open_cache(root: Path, rules_names: list[str], resolver: Resolver, ca_cert: Path,
               proxy: EgressProxy) -> ImageCache:
    """The image cache as the worker opens it, but that skopeo trusts the test's CA and goes through the proxy
    even for the registries the deployment names (so that the proxy, not skopeo, resolves the test's names)."""
    environment = {**proxy.environment(), "NO_PROXY": "", "no_proxy": "", "SSL_CERT_FILE": str(ca_cert)}
    return ImageCache(root, None, tools=SkopeoUmoci(environment=environment), allowed_registries=tuple(rules_names),
                      resolve=resolver)


@pytest.mark.parametrize("repository", ["realm", "redirect"])
async def test_a_registry_that_sends_the_pull_to_an_internal_address_reaches_nothing(
        tmp_path: Path, tls: tuple[ssl.SSLContext, Path], repository: str) -> None:
    context, ca_cert = tls
    with knocks() as internal:
        with fake_registry(context, f"https://evil.test:{internal.port}") as port:
            registry = f"registry.test:{port}"
            for evil_allowed in (False, True):
                resolver = Resolver({"registry.test": [["127.0.0.1"]], "evil.test": [["127.0.0.1"]]})
                named = [registry, *([f"evil.test:{internal.port}"] if evil_allowed else [])]
                proxy = EgressProxy(RegistryRules.of(None, named), resolver)
                await proxy.start()
                cache = open_cache(tmp_path / f"cache-{evil_allowed}", named, resolver, ca_cert, proxy)
                try:
                    with pytest.raises(ImagePullError) as error:
                        await cache.pull(f"{registry}/{repository}/x:1")
                finally:
                    await cache.close()
                    await proxy.close()
                if evil_allowed:  # the control: allowed, the internal address is reached
                    assert internal.count >= 1, error.value
                else:
                    assert internal.count == 0, "the pull reached the internal address"
                    assert error.value.failure is PullFailure.REFUSED, error.value
                    assert error.value.user_words.startswith("registry not allowed")
                    assert f"evil.test:{internal.port}" in proxy.refused


async def test_a_name_rebound_between_the_check_and_the_pull_reaches_nothing(tmp_path: Path,
                                                                             tls: tuple[ssl.SSLContext, Path]) -> None:
    """rebound.test resolves to a public address when the cache checks it, and to 127.0.0.1 when skopeo
    connects: the proxy resolves it itself, refuses, and nothing is reached."""
    _, ca_cert = tls
    with knocks() as internal:
        resolver = Resolver({"rebound.test": [["93.184.215.14"], ["127.0.0.1"]]})
        proxy = EgressProxy(RegistryRules(), resolver)
        await proxy.start()
        cache = open_cache(tmp_path / "cache", [], resolver, ca_cert, proxy)
        try:
            with pytest.raises(ImagePullError) as error:
                await cache.pull(f"rebound.test:{internal.port}/x:1")
        finally:
            await cache.close()
            await proxy.close()
        assert resolver.lookups[:2] == ["rebound.test", "rebound.test"]  # the cache's check, then the proxy's
        assert error.value.failure is PullFailure.REFUSED, error.value
        assert internal.count == 0


async def test_the_worker_sends_every_pull_through_its_egress_proxy(tmp_path: Path) -> None:
    """services.worker.app wires the cache as the tests above do: skopeo's environment names the worker's own
    proxy (with its password), which refuses the metadata server, and `localhost` (the own registry's name,
    never an address); the own registry and the mirrors bypass it."""
    config = WorkerConfig("w", "token", 1000, ("localhost:1",), tmp_path / "certs", tmp_path / "scratch",
                          f"file://{tmp_path}/logs", own_registry="http://127.0.0.1:5999",
                          registry_mirrors=(Mirror.parse("ghcr.io=http://10.0.0.9:5000/ghcr"),))
    async with contextlib.AsyncExitStack() as stack:
        images = await _image_cache(config, stack)
        environment = images.tools.environment  # type: ignore[attr-defined]
        assert environment["NO_PROXY"] == "10.0.0.9:5000,127.0.0.1:5999"
        url = environment["HTTPS_PROXY"]
        assert url == environment["HTTP_PROXY"] and url.startswith("http://corral:")
        port = int(url.rsplit(":", 1)[1])
        auth = base64.b64encode(url.removeprefix("http://").split("@")[0].encode()).decode()
        for target in ("169.254.169.254:80", "localhost", "localhost:443"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"CONNECT {target} HTTP/1.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n".encode())
            await writer.drain()
            assert (await reader.readline()).decode().strip() == "HTTP/1.1 403 corral refuses this destination", target
            writer.close()
