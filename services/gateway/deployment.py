"""One description of a deployment, from which every Envoy config is generated.

A deployment says where the two gateways listen, which certificates they
hold, where each upstream service listens, and the limits people's calls are
held to. It is read from a small YAML file (`envoy/local.yaml` describes the
default local deployment) or built in Python (`corral up`, the tests).

Paths may be relative: they are then relative to the directory Envoy runs
in (`corral up` runs it in its data directory), and are written into the
configs as given, so a checked-in config names no machine's absolute path.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml


@dataclasses.dataclass(frozen=True)
class Address:
    """A host and a port."""

    host: str
    """An IP address or a name; the services and gateways bind loopback locally."""
    port: int
    """TCP port; 0 only where the gateway listens (Envoy picks a free port: ask its admin interface which)."""

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port {self.port} of {self.host} is not between 0 and 65535")

    @classmethod
    def parse(cls, text: str) -> Address:
        """'host:port' → Address."""
        host, _, port = str(text).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{text!r} is not host:port")
        return cls(host, int(port))

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class GatewayTls:
    """The gateway's own certificate (shown to people and workers, and to the upstream services, which
    see a caller named spiffe://corral/service/gateway) and the deployment CA."""

    ca_cert: Path
    """The deployment CA: upstream services' certificates and workers' client certificates chain to it."""
    cert: Path
    """The gateway's certificate chain (PEM)."""
    key: Path
    """The gateway's private key (PEM)."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """What people's calls through the public gateway are held to."""

    max_request_bytes: int = 4 * 1024 * 1024
    """Largest REST/JSON request body; gRPC messages are held to the same size by the services
    (the frontend's max_request_bytes). Larger bodies are refused with 413."""
    max_response_bytes: int = 64 * 1024 * 1024
    """Largest unary REST/JSON response the transcoder buffers (server streams are not buffered)."""
    max_request_headers_kb: int = 64
    """Largest request header block."""
    route_timeout_s: float = 65.0
    """Unary calls end after this long (a little over the services' own 60 s call deadline, so the
    service's DEADLINE_EXCEEDED, with its reason, normally reaches the caller first). Streams are exempt."""
    stream_idle_timeout_s: float = 300.0
    """A request with no bytes either way for this long is reset (408 to REST). Server streams (WatchBatch on a
    quiet batch sends nothing for hours) are exempt: a long request is not an idle one (HTTP/2 PINGs and TCP
    keepalives find a client that vanished)."""
    idle_timeout_s: float = 10.0
    """A connection with no request under way is closed after this long (a gRPC client reconnects when it next
    calls). This is also what closes an HTTP/2 connection whose first request's headers never arrive whole: Envoy
    sees no request until its HEADERS frame is complete, so the request-headers timeout cannot."""
    request_headers_timeout_s: float = 10.0
    """A request whose headers are not all in this long after their first byte is reset, and on HTTP/1.1 its
    connection closed: a slow client cannot hold a connection by sending its headers a byte at a time."""
    request_timeout_s: float = 120.0
    """A request whose body is not all in this long (and that has no answer yet) is ended (408 to REST)."""
    tls_handshake_timeout_s: float = 10.0
    """A connection whose TLS handshake is not done this long after it was accepted is closed."""
    max_connections: int = 50_000
    """Most client connections one gateway process holds at once, over all its listeners (Envoy's overload
    manager); a connection past it is closed as it is accepted. Envoy is given this many file descriptors and
    hardening.FD_RESERVE more, so it never runs out of them for its upstreams (`corral up` lowers the cap
    to what this machine's descriptor limit allows)."""
    connection_buffer_bytes: int = 32 * 1024
    """Most bytes Envoy buffers for one connection, client or upstream, before it stops reading from it
    (flow control, not an error: a filter that must see a whole body has its own limit, max_request_bytes)."""
    max_concurrent_streams: int = 100
    """Most HTTP/2 requests at once on one client connection (a client queues more until one ends)."""
    http2_stream_window_bytes: int = 64 * 1024
    """HTTP/2 flow-control window of one request: bytes a client may send before Envoy passes them on."""
    http2_connection_window_bytes: int = 1024 * 1024
    """HTTP/2 flow-control window of a whole connection."""
    health_check_interval_s: float = 1.0
    """How often Envoy asks each upstream's gRPC health: a new leader gets workers' calls, and a standby
    that was the leader stops getting them, within about two of these."""
    health_check_timeout_s: float = 2.0
    """How long one health answer may take (an answer slower than this counts as a failure)."""
    enroll_per_second: int = 20
    """Enroll calls the enrollment listener forwards per second, after a burst of `enroll_burst`; more are
    refused at once (HTTP 429, which a worker's gRPC client sees as UNAVAILABLE and retries after a
    back-off). Anyone who reaches the listener may call Enroll: this bounds the database work they cause."""
    enroll_burst: int = 100
    """Enroll calls forwarded at once before `enroll_per_second` applies (a scale-up of that many machines
    enrolls without waiting)."""

    def __post_init__(self) -> None:
        if not (1 <= self.enroll_per_second <= 100_000 and 1 <= self.enroll_burst <= 100_000):
            raise ValueError("limits: enroll_per_second and enroll_burst must be 1 to 100000")
        for name in ("stream_idle_timeout_s", "idle_timeout_s", "request_headers_timeout_s", "request_timeout_s",
                     "tls_handshake_timeout_s"):
            # Envoy reads 0 as "no timeout": a limit must limit.
            if not 0 < getattr(self, name) <= 86_400:
                raise ValueError(f"limits: {name} must be more than 0 and at most 86400 seconds")
        if not 1 <= self.max_connections <= 10_000_000:
            raise ValueError("limits: max_connections must be 1 to 10000000")
        if not 1 <= self.max_concurrent_streams <= 2**31 - 1:
            raise ValueError("limits: max_concurrent_streams must be 1 to 2147483647")
        # HTTP/2's least window is 65535 bytes; Envoy takes at most 2^31 - 1.
        for name in ("http2_stream_window_bytes", "http2_connection_window_bytes"):
            if not 65_535 <= getattr(self, name) <= 2**31 - 1:
                raise ValueError(f"limits: {name} must be 65535 to 2147483647")
        if not 1024 <= self.connection_buffer_bytes <= 2**31 - 1:
            raise ValueError("limits: connection_buffer_bytes must be 1024 to 2147483647")


@dataclasses.dataclass(frozen=True)
class Deployment:
    """Everything the gateways' configs are generated from."""

    public_listen: Address
    """Where people reach corral: TLS, HTTP/2 (gRPC) and HTTP/1.1 (REST/JSON)."""
    internal_listen: Address
    """Where workers reach the leading driver: mutual TLS."""
    public_admin_socket: Path
    """The Unix socket of the public gateway's Envoy admin interface (stats, cluster health, readiness), made
    0600: the admin interface has no authentication and can stop Envoy, and a job of the process runtime
    shares the host's network, so it is never a TCP port. Keep the path short (a socket's path is at most
    107 bytes): a relative one, in the directory Envoy runs in, is best."""
    internal_admin_socket: Path
    """The internal gateway's admin socket, likewise."""
    tls: GatewayTls
    """The gateway's certificate and the deployment CA."""
    auth: Address
    """The auth service's public (TLS, bearer token) listener."""
    frontends: tuple[Address, ...]
    """Every frontend's public listener; calls are balanced over the healthy ones."""
    drivers: tuple[Address, ...]
    """Every driver's internal (mutual TLS) listener; only the leader says SERVING, so only it gets calls."""
    descriptor_set: Path
    """The FileDescriptorSet the REST/JSON transcoder reads (`services.gateway.descriptors` writes it)."""
    access_log: Path
    """Where both gateways append their JSON access log lines."""
    limits: Limits = Limits()
    """What people's calls are held to."""
    public_stats_listen: Address | None = None
    """Where the public gateway serves its statistics (`/stats/prometheus` alone, read from the admin
    socket) to Prometheus: TLS with the gateway's certificate, to clients with a certificate of the
    deployment CA. None: no such listener."""
    internal_stats_listen: Address | None = None
    """The internal gateway's statistics listener, likewise."""
    auth_token: str | None = None
    """A secret the public gateway puts in `x-corral-gateway-token` on every call it forwards to auth (any
    such header from a client replaced, and removed from calls to the frontends), so that auth believes
    this gateway's `x-forwarded-for` there and throttles logins by the real client's address. Given to auth
    with `--gateway-token-file`; never in a checked-in description, which may name it as `%ENVIRONMENT(VAR)%`
    instead (Envoy reads VAR when it starts: helm/corral). None: no header."""
    enroll_listen: Address | None = None
    """Where new workers, which have no certificate yet, enroll (issue 16): TLS with the gateway's
    certificate and no client certificate, forwarding WorkerEnrollmentService/Enroll alone to the leading
    driver (anything else: 404, which gRPC clients read as UNIMPLEMENTED). None: no such listener."""
    webs: tuple[Address, ...] = ()
    """The web UI's listeners (services.web: HTTPS, for the gateway's certificate alone), served at `/` of the
    public listener; none: no UI, and `/` is 404."""
    worker_san_prefix: str = "spiffe://corral/worker/"
    """Only client certificates with a URI SAN starting with this reach the internal gateway ('' accepts
    any certificate the CA signed)."""

    def __post_init__(self) -> None:
        for upstream in (self.auth, *self.frontends, *self.drivers, *self.webs):
            if upstream.port == 0:
                raise ValueError(f"upstream {upstream} needs its port")
        if not self.frontends:
            raise ValueError("a deployment needs at least one frontend")
        if not self.drivers:
            raise ValueError("a deployment needs at least one driver")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deployment:
        """A deployment from its YAML form (see envoy/local.yaml); unknown keys are refused."""
        data = dict(data)
        tls = GatewayTls(**{k: Path(v) for k, v in _only(data.pop("tls"), GatewayTls).items()})
        limits = Limits(**_only(data.pop("limits", {}) or {}, Limits))
        fields = _only(data, cls)
        return cls(
            public_listen=Address.parse(fields["public_listen"]),
            internal_listen=Address.parse(fields["internal_listen"]),
            public_admin_socket=Path(fields["public_admin_socket"]),
            internal_admin_socket=Path(fields["internal_admin_socket"]),
            tls=tls,
            auth=Address.parse(fields["auth"]),
            frontends=tuple(Address.parse(a) for a in fields["frontends"]),
            drivers=tuple(Address.parse(a) for a in fields["drivers"]),
            webs=tuple(Address.parse(a) for a in fields.get("webs") or ()),
            descriptor_set=Path(fields["descriptor_set"]),
            access_log=Path(fields["access_log"]),
            limits=limits,
            **{name: Address.parse(fields[name])
               for name in ("public_stats_listen", "internal_stats_listen", "enroll_listen")
               if fields.get(name)},
            **({"worker_san_prefix": fields["worker_san_prefix"]} if "worker_san_prefix" in fields else {}),
            # Only as a reference Envoy resolves when it starts (helm/corral: %ENVIRONMENT(VAR)%), never the secret.
            **({"auth_token": fields["auth_token"]} if fields.get("auth_token") else {}),
        )

    @classmethod
    def load(cls, path: Path) -> Deployment:
        """Read a deployment description (YAML)."""
        return cls.from_dict(yaml.safe_load(path.read_text()))


def _only(data: dict[str, Any], kind: type) -> dict[str, Any]:
    """`data`, refusing keys that are not fields of `kind` (a misspelt limit must not be ignored)."""
    known = {f.name for f in dataclasses.fields(kind)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {kind.__name__} settings: {', '.join(unknown)}")
    return data
