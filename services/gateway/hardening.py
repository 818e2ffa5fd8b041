"""What keeps a gateway serving when clients are slow, idle or many: the limits of Envoy's edge-proxy guidance,
as pieces of config that `configs.py` puts into both gateways.

- a cap on the connections the whole Envoy holds (the overload manager's downstream connections monitor):
  past it a new connection is closed as it is accepted, before any TLS work, so Envoy always keeps file
  descriptors for its upstreams, its admin socket and its logs (20,000 half-open connections once took every
  descriptor Envoy had: new clients timed out, and with its upstreams down Envoy crashed when a health check
  could open no socket). `FD_RESERVE` descriptors above the cap are kept free: whoever starts Envoy gives it
  that many (`envoy_process.give_fd_limit`);
- timeouts for whatever a client leaves unfinished: the TLS handshake, the request headers, the whole
  request, a connection with no request, a stream with no bytes. A server stream (WatchBatch) is a long
  request, not an idle one: its route has no idle timeout (`configs._routes`), and a client that vanished is
  found by HTTP/2 PINGs and TCP keepalives instead;
- per-connection buffer limits, HTTP/2 stream and window limits.

Envoy has no per-client-address connection limit (its connection_limit filter counts per filter chain), so
these bound what any number of clients can hold together, not what one address can: docs/gateway.md says what
that leaves open.
"""

from __future__ import annotations

from typing import Any

from services.gateway.deployment import Limits

Config = dict[str, Any]

FD_RESERVE = 1024
"""File descriptors Envoy keeps above its connection cap: upstream connections (a few per worker thread and
upstream host, HTTP/2), health checks, listeners, the admin socket, log files, and a connection past the cap
for the moment it takes to close it."""

CONNECTIONS_MONITOR = "envoy.resource_monitors.global_downstream_max_connections"

# Linux socket option numbers (Envoy takes them as numbers): a connection's peer that vanished without a FIN
# is found by TCP keepalives, which accepted sockets inherit from the listening one.
_SOL_SOCKET, _SO_KEEPALIVE = 1, 9
_IPPROTO_TCP, _TCP_KEEPIDLE, _TCP_KEEPINTVL, _TCP_KEEPCNT = 6, 4, 5, 6
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_PROBES = 60, 20, 3


DRAIN_S = 1.0
"""How long an HTTP/2 connection closed for idleness still takes the new requests that crossed its first GOAWAY
(Envoy's default is 5 s; a refused one a client retries on a new connection). A half-open HTTP/2 connection is
held for the request-headers timeout, then the idle timeout, then this."""


def _seconds(value: float) -> str:
    return f"{value:g}s"


def fd_limit_needed(limits: Limits) -> int:
    """The file descriptor limit an Envoy with `limits` must have: its connection cap and the reserve."""
    return limits.max_connections + FD_RESERVE


def max_connections_within(fd_limit: int, wanted: int) -> int:
    """The largest connection cap, at most `wanted`, that leaves FD_RESERVE of `fd_limit` free (at least 1)."""
    return max(1, min(wanted, fd_limit - FD_RESERVE))


def overload_manager(limits: Limits) -> Config:
    """The bootstrap's overload manager: the connection cap across every listener of this Envoy."""
    return {
        "refresh_interval": "0.25s",
        "resource_monitors": [{
            "name": CONNECTIONS_MONITOR,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3."
                         "DownstreamConnectionsConfig",
                "max_active_downstream_connections": limits.max_connections,
            },
        }],
    }


def listener_limits(limits: Limits) -> Config:
    """Fields of a TLS listener: its per-connection buffer, and TCP keepalives on the connections it accepts."""
    keepalive = [(_SOL_SOCKET, _SO_KEEPALIVE, 1), (_IPPROTO_TCP, _TCP_KEEPIDLE, _KEEPALIVE_IDLE_S),
                 (_IPPROTO_TCP, _TCP_KEEPINTVL, _KEEPALIVE_INTERVAL_S), (_IPPROTO_TCP, _TCP_KEEPCNT, _KEEPALIVE_PROBES)]
    return {
        "per_connection_buffer_limit_bytes": limits.connection_buffer_bytes,
        "socket_options": [{"level": level, "name": name, "int_value": value, "state": "STATE_LISTENING"}
                           for level, name, value in keepalive],
    }


def filter_chain_limits(limits: Limits) -> Config:
    """Fields of a TLS filter chain: the handshake must be done within the handshake timeout."""
    return {"transport_socket_connect_timeout": _seconds(limits.tls_handshake_timeout_s)}


def manager_limits(limits: Limits) -> Config:
    """Fields of an HTTP connection manager: its timeouts, and its HTTP/2 limits."""
    return {
        "request_headers_timeout": _seconds(limits.request_headers_timeout_s),
        # Until the whole request is in, or the answer begins (so a server stream, whose request is short,
        # and a bidirectional one that is answered, are not cut).
        "request_timeout": _seconds(limits.request_timeout_s),
        "stream_idle_timeout": _seconds(limits.stream_idle_timeout_s),
        "drain_timeout": _seconds(DRAIN_S),
        "http2_protocol_options": {
            "max_concurrent_streams": limits.max_concurrent_streams,
            "initial_stream_window_size": limits.http2_stream_window_bytes,
            "initial_connection_window_size": limits.http2_connection_window_bytes,
            # A client that vanished (its long stream has no idle timeout) is found by PINGs it does not answer.
            "connection_keepalive": {"interval": _seconds(_KEEPALIVE_IDLE_S),
                                     "timeout": _seconds(_KEEPALIVE_INTERVAL_S)},
        },
    }


def idle_timeout(limits: Limits) -> Config:
    """The `common_http_protocol_options` field of a connection with no request: closed after this long."""
    return {"idle_timeout": _seconds(limits.idle_timeout_s)}


def cluster_limits(limits: Limits) -> Config:
    """Fields of an upstream cluster: the per-connection buffer, and HTTP/2 windows like the downstream ones."""
    return {"per_connection_buffer_limit_bytes": limits.connection_buffer_bytes}


def upstream_http2_options(limits: Limits) -> Config:
    """The upstream HTTP/2 options: the same stream and connection windows as downstream."""
    return {"initial_stream_window_size": limits.http2_stream_window_bytes,
            "initial_connection_window_size": limits.http2_connection_window_bytes}
