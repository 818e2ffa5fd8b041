"""Why a server could not be reached, found by connecting to it again: for `corral`'s error line only.

gRPC reports the last address it tried: `localhost` is [::1] and 127.0.0.1,
and corral's services listen on 127.0.0.1 alone, so a certificate the profile
does not trust often comes back as "[::1]: connection refused", and a handshake
may fail without its reason. Then the CLI connects to each address itself, and on one that accepts
tries the TLS handshake gRPC would make (the profile's CA, the host's name,
HTTP/2): a certificate it does not trust, or a handshake that fails, is then
the cause the user reads. Only ever run after a call has failed.
"""

from __future__ import annotations

import socket
import ssl

from corral.refusal_words import NOT_TRUSTED, TLS_FAILED

PROBE_TIMEOUT_S = 3.0
"""How long each connection or handshake of the probe may take."""


def probe(address: str, ca_cert: str | None, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """The cause to say for `address` (host:port) that gRPC found refused, or None to keep gRPC's: every
    address refused, or one that accepts and completes the handshake (the failure was elsewhere)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        found = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return None
    for family, kind, protocol, _, where in found:
        try:
            sock = socket.socket(family, kind, protocol)
            sock.settimeout(timeout_s)
            sock.connect(where)
        except OSError:
            sock.close()
            continue
        with sock:
            return _handshake(sock, host, ca_cert)
    return None


def _handshake(sock: socket.socket, host: str, ca_cert: str | None) -> str | None:
    try:
        context = ssl.create_default_context(cafile=ca_cert)
    except OSError:
        return None  # the CA file itself: the command's own error says so
    context.set_alpn_protocols(["h2"])
    try:
        with context.wrap_socket(sock, server_hostname=host):
            return None
    except ssl.SSLCertVerificationError as e:
        return f"{NOT_TRUSTED.removesuffix(')')}; {e.verify_message})"
    except (ssl.SSLError, OSError):
        return TLS_FAILED
