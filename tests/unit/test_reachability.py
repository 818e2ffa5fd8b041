"""corral.reachability finds why a server gRPC found "refused" could not be reached: gRPC names the last
address it tried, and `localhost`'s [::1] is refused where corral listens on 127.0.0.1 alone, so a certificate
the profile does not trust read "connection refused; is corral up running?" (issue 36, item 5). A real TLS
listener on loopback, with certificates of two different corral CAs."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.cli_common import EXIT_UNAVAILABLE
from corral.reachability import probe
from services.common.tls import DevCertificateAuthority


@pytest.fixture
def tls_port(tmp_path: Path) -> Iterator[int]:
    """A TLS listener on 127.0.0.1 with a certificate of its own CA, completing every handshake it can."""
    files = DevCertificateAuthority(tmp_path / "server-ca").issue("frontend")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["h2"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)  # so that the loop sees `stop`
    stop = threading.Event()

    def handshake(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                with context.wrap_socket(conn, server_side=True):
                    pass
            except (ssl.SSLError, OSError):
                pass

    def serve() -> None:
        # A thread per connection: gRPC's channel and the probe connect at once, and neither waits on the other.
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=handshake, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        listener.close()


def test_a_certificate_of_another_ca_is_said_to_be_untrusted(tls_port: int, tmp_path: Path) -> None:
    other = DevCertificateAuthority(tmp_path / "profile-ca")
    other.ensure()
    cause = probe(f"localhost:{tls_port}", str(other.ca_cert_path))
    assert cause is not None and cause.startswith("its TLS certificate is not trusted (check the profile's CA "
                                                  "certificate, --ca-cert; ")


def test_the_right_ca_leaves_grpcs_words(tls_port: int, tmp_path: Path) -> None:
    assert probe(f"localhost:{tls_port}", str(tmp_path / "server-ca" / "ca.pem")) is None


def test_a_closed_port_leaves_grpcs_words() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert probe(f"localhost:{port}", None) is None


def test_the_cli_says_so_in_one_line(tls_port: int, tmp_path: Path) -> None:
    """`corral ls` against a server of another CA: one line naming the certificate, exit 8, and none of gRPC's
    own log lines on stderr."""
    other = DevCertificateAuthority(tmp_path / "profile-ca")
    other.ensure()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": f"localhost:{tls_port}", "auth": "localhost:1", "token": "t",
                                  "ca_cert": str(other.ca_cert_path)}))
    environment = {k: v for k, v in os.environ.items() if k not in ("GRPC_VERBOSITY", "CORRAL_TOKEN")}
    done = subprocess.run([sys.executable, "-m", "corral.cli", "ls"], capture_output=True, text=True, timeout=60,
                          env={**environment, "CORRAL_CONFIG": str(config)})
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.startswith(f"error: cannot reach corral at localhost:{tls_port}: its TLS certificate is not "
                                  "trusted (check the profile's CA certificate, --ca-cert; ")
    assert done.stderr.count("\n") == 1, done.stderr
