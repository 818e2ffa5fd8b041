"""A process's metrics port (services.common.metrics.MetricsServer): HTTPS that answers only a client
certificate of the deployment CA, and that a client stalling its handshake cannot hold up."""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.metrics import MetricsServer
from services.common.tls import DevCertificateAuthority, TlsFiles


@pytest.fixture
def certs(tmp_path: Path) -> DevCertificateAuthority:
    ca = DevCertificateAuthority(tmp_path / "ca")
    ca.ensure()
    return ca


@pytest.fixture
def server(certs: DevCertificateAuthority, tmp_path: Path) -> Iterator[MetricsServer]:
    server = MetricsServer("127.0.0.1:0", certs.provision("frontend", tmp_path / "frontend"),
                           tmp_path / "frontend.port")
    try:
        yield server
    finally:
        server.close()


def scrape(server: MetricsServer, ca_cert: Path, client: TlsFiles | None, timeout_s: float = 10.0) -> str:
    context = ssl.create_default_context(cafile=str(ca_cert))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    with urllib.request.urlopen(f"https://localhost:{server.port}/metrics", timeout=timeout_s,
                                context=context) as answer:
        return answer.read().decode()


def test_a_client_certificate_of_the_ca_reads_the_metrics(server: MetricsServer, certs: DevCertificateAuthority,
                                                          tmp_path: Path) -> None:
    scraper = certs.provision("metrics", tmp_path / "metrics")
    assert "corral_rpc_requests" in scrape(server, certs.ca_cert_path, scraper)
    assert int((tmp_path / "frontend.port").read_text()) == server.port


def test_no_certificate_or_another_cas_is_refused(server: MetricsServer, certs: DevCertificateAuthority,
                                                 tmp_path: Path) -> None:
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
        scrape(server, certs.ca_cert_path, None)
    other = DevCertificateAuthority(tmp_path / "other-ca")
    other.ensure()
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
        scrape(server, certs.ca_cert_path, other.provision("metrics", tmp_path / "other"))
    # Plain HTTP gets no metrics either.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as plain:
        plain.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        try:
            answer = plain.recv(65536)
        except ConnectionResetError:
            answer = b""
        assert b"corral_rpc" not in answer
    # And the server still serves.
    assert "corral_rpc_requests" in scrape(server, certs.ca_cert_path, certs.provision("metrics", tmp_path / "m"))


def test_a_client_that_never_finishes_its_handshake_holds_up_no_one_else(
        server: MetricsServer, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    scraper = certs.provision("metrics", tmp_path / "metrics")
    with socket.create_connection(("127.0.0.1", server.port)), socket.create_connection(("127.0.0.1", server.port)):
        # Two connections that send nothing, open while the scrape runs.
        assert "corral_rpc_requests" in scrape(server, certs.ca_cert_path, scraper, timeout_s=5)
