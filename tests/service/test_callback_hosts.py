"""Resolving and reaching callback hosts (services/common/callback_hosts.py):
the system resolver's bounds, and a transport that connects only to the
address it checked while TLS still verifies the name."""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.common.callback_hosts import PinnedTransport, SystemResolver, Unresolved, checked_addresses
from services.common.tls import DevCertificateAuthority
from services.common.urls import CallbackRules, IPAddress, RefusedUrl
from tests.http_receiver import receiving

LOOPBACK = CallbackRules.parse(["127.0.0.0/8"])


def resolver(table: dict[str, list[str]]) -> Any:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in table[host]]
    return resolve


async def test_a_name_is_refused_if_any_of_its_addresses_is() -> None:
    resolve = resolver({"hooks.example": ["93.184.215.14", "10.0.0.7"], "ok.example": ["93.184.215.14"]})
    with pytest.raises(RefusedUrl, match="hooks.example resolves to 10.0.0.7, a private address"):
        await checked_addresses("https://hooks.example/done", CallbackRules(), resolve)
    target, addresses = await checked_addresses("https://ok.example:8443/done", CallbackRules(), resolve)
    assert (target.host, target.port, addresses) == ("ok.example", 8443, [ipaddress.ip_address("93.184.215.14")])


async def test_the_system_resolver_reads_the_hosts_file() -> None:
    assert ipaddress.ip_address("127.0.0.1") in await SystemResolver()("localhost", 80)


async def test_a_slow_resolution_is_given_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> list[Any]:
        release.wait(10)
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    resolve = SystemResolver(timeout_s=0.2, threads=1)
    try:
        with pytest.raises(Unresolved, match="slow.example did not resolve within 0.2 s") as error:
            await resolve("slow.example", 443)
        assert error.value.transient
    finally:
        release.set()
        resolve.close()


async def test_an_unknown_name_is_unresolved_for_good(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown(*args: Any, **kwargs: Any) -> list[Any]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    with pytest.raises(Unresolved, match="nowhere.example does not resolve: Name or service not known") as error:
        await SystemResolver()("nowhere.example", 443)
    assert not error.value.transient


async def test_the_transport_connects_to_the_checked_address_with_the_name_in_the_host_header() -> None:
    with receiving() as receiver:
        transport = PinnedTransport(LOOPBACK, resolver({"hooks.example": ["127.0.0.1"]}))
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.post(receiver.url(host="hooks.example"), json={"n": 1})
        assert response.status_code == 200
        [post] = receiver.posts()
        assert (post["headers"]["Host"], post["body"]) == (f"hooks.example:{receiver.port}", {"n": 1})


async def test_the_transport_refuses_a_forbidden_address_and_sends_nothing() -> None:
    with receiving() as receiver:
        transport = PinnedTransport(CallbackRules(), resolver({"hooks.example": ["127.0.0.1"]}))
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(RefusedUrl, match="hooks.example resolves to 127.0.0.1, a loopback address"):
                await client.post(receiver.url(host="hooks.example"), json={})
        assert receiver.requests == []


async def test_tls_verifies_the_name_while_connecting_to_the_checked_address(tmp_path: Path) -> None:
    """The receiver's certificate names hooks.example only (not 127.0.0.1): the POST succeeds
    because SNI and verification use the name; another name for the same address fails."""
    ca = DevCertificateAuthority(tmp_path / "certs")
    files = ca.issue("hooks", hostnames=("hooks.example",))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(files.cert, files.key)
    client_tls = ssl.create_default_context(cafile=str(files.ca_cert))
    resolve = resolver({"hooks.example": ["127.0.0.1"], "other.example": ["127.0.0.1"]})
    with receiving(server) as receiver:
        transport = PinnedTransport(LOOPBACK, resolve, inner=httpx.AsyncHTTPTransport(verify=client_tls))
        async with httpx.AsyncClient(transport=transport) as client:
            response = await client.post(receiver.url(host="hooks.example", scheme="https"), json={})
            assert response.status_code == 200
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED|Hostname mismatch"):
                await client.post(receiver.url(host="other.example", scheme="https"), json={})
        assert len(receiver.posts()) == 1
