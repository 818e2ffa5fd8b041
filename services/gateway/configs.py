"""The Envoy configs of both gateways, as Python data, from one `Deployment`.

- public: one TLS listener for people (HTTP/2 for gRPC, HTTP/1.1 or 2 for
  REST/JSON, by ALPN). gRPC is routed by service name to auth or to the
  frontends; REST/JSON is transcoded to the same gRPC calls by
  `grpc_json_transcoder` from the descriptor set, and then routed the same
  way. Errors come back as JSON `google.rpc.Status` with the HTTP status of
  the gRPC code; server streams as one JSON message per line.
  Every other path goes to the web UI (services.web), if the deployment
  has one: HTTP/1.1 over mutual TLS, its event streams without a timeout;
  `/api/...` and gRPC that no route takes stay 404 (never the UI's page).
- internal: mutual TLS for workers only, routing the driver's services to the
  one driver that says SERVING on gRPC health: the leader; and, if the
  deployment has one, an enrollment listener for new workers without a
  certificate: TLS only, forwarding WorkerEnrollmentService/Enroll alone.

Each upstream is health-checked with gRPC health every
`limits.health_check_interval_s` (also while it has no traffic, so a new
leader is found within about that long), and the gateway shows upstreams its
own certificate (spiffe://corral/service/gateway), verifying theirs against
the deployment CA and their spiffe identity. Both gateways write one JSON
line per request carrying `x-request-id` and `traceparent`.

Each Envoy's admin interface is a Unix socket (0600), never a TCP port: it
has no authentication, and a job of the process runtime shares the host's
network. Prometheus reads the statistics through a listener of their own
that forwards `/stats/prometheus` alone, to clients with a certificate of
the deployment CA.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from services.common.identity import GATEWAY_TOKEN_HEADER
from services.gateway import hardening
from services.gateway.deployment import Address, Deployment, GatewayTls, Limits
from services.gateway.descriptors import OPENAPI_ROUTE, openapi_path
from services.gateway.local_replies import local_replies
from services.gateway.rest_body_keys import lua_path
from services.gateway.routing import REFLECTION_SERVICES, RoutedService, internal_services, public_services

Config = dict[str, Any]

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
_TLS_SOCKET = "envoy.transport_sockets.tls"

IDENTITY_URI = "spiffe://corral/service/{}"
"""The URI SAN each upstream service's certificate carries (services.common.tls)."""

HEALTH_SERVICE = {"auth": "", "frontend": "", "driver": "corral.driver.v1.DriverService"}
"""The name each upstream's health is asked for: the whole server, except the driver's service, which
only the leader serves."""


def _seconds(value: float) -> str:
    """A protobuf Duration in its JSON form."""
    return f"{value:g}s"


def _socket(address: Address) -> Config:
    return {"socket_address": {"address": address.host, "port_value": address.port}}


def _certificate(tls: GatewayTls) -> Config:
    return {"certificate_chain": {"filename": str(tls.cert)}, "private_key": {"filename": str(tls.key)}}


ADMIN_SOCKET_MODE = 0o600
"""The admin socket's permissions: Envoy's own account alone (the admin interface can stop Envoy)."""
STATS_PATH = "/stats/prometheus"
"""The one admin path a statistics listener forwards."""


def _admin(socket: Path) -> Config:
    # Outside the connection cap: readiness and stats must answer while clients hold every connection.
    return {"address": _pipe(socket, ADMIN_SOCKET_MODE), "ignore_global_conn_limit": True}


def _pipe(socket: Path, mode: int | None = None) -> Config:
    return {"pipe": {"path": str(socket), **({"mode": mode} if mode is not None else {})}}


def _with_stats(config: Config, name: str, listen: Address | None, admin_socket: Path,
                deployment: Deployment) -> Config:
    """`config` with, if `listen` is given, a listener there that serves GET STATS_PATH from the admin socket
    to clients with a certificate of the deployment CA (Prometheus, given corral up's metrics certificate),
    and nothing else: no other admin path is reachable through it."""
    if listen is None:
        return config
    manager = {
        "@type": _HCM,
        "stat_prefix": f"{name}_stats",
        "codec_type": "AUTO",
        "http_filters": [_router()],
        "route_config": {
            "name": f"{name}_stats",
            "virtual_hosts": [{
                "name": "stats",
                "domains": ["*"],
                "routes": [
                    {"match": {"path": STATS_PATH,
                               "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
                     "route": {"cluster": "admin", "timeout": "10s"}},
                    {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                ],
            }],
        },
    }
    tls_context = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "require_client_certificate": True,
        "common_tls_context": {
            "tls_certificates": [_certificate(deployment.tls)],
            "validation_context": {"trusted_ca": {"filename": str(deployment.tls.ca_cert)}},
        },
    }
    admin = {
        "name": "admin",
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {"cluster_name": "admin",
                            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _pipe(admin_socket)}}]}]},
    }
    resources = config["static_resources"]
    return {**config, "static_resources": {
        "listeners": [*resources["listeners"],
                      _listener(f"{name}_stats", listen, tls_context, manager, deployment.limits)],
        "clusters": [*resources["clusters"], admin]}}


def access_log(deployment: Deployment, gateway: str) -> list[Config]:
    """One JSON line per request, with the ids that tie it to the services' logs and traces."""
    fields = {
        "gateway": gateway,
        "start_time": "%START_TIME%",
        "method": "%REQ(X-ENVOY-ORIGINAL-METHOD?:METHOD)%",
        "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
        "protocol": "%PROTOCOL%",
        "response_code": "%RESPONSE_CODE%",
        "grpc_status": "%GRPC_STATUS%",
        "response_flags": "%RESPONSE_FLAGS%",
        "bytes_received": "%BYTES_RECEIVED%",
        "bytes_sent": "%BYTES_SENT%",
        "duration_ms": "%DURATION%",
        "upstream_cluster": "%UPSTREAM_CLUSTER%",
        "upstream_host": "%UPSTREAM_HOST%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "traceparent": "%REQ(TRACEPARENT)%",
        "user_agent": "%REQ(USER-AGENT)%",
        "peer_uri_san": "%DOWNSTREAM_PEER_URI_SAN%",
    }
    return [{
        "name": "envoy.access_loggers.file",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog",
            "path": str(deployment.access_log),
            "log_format": {"json_format": fields},
        },
    }]


def _cluster(name: str, hosts: tuple[Address, ...], deployment: Deployment,
             http_health_path: str | None = None) -> Config:
    """An upstream over HTTP/2 and mutual TLS, health-checked by gRPC health, balanced over healthy hosts; with
    `http_health_path`, over HTTP/1.1 (the web UI), its health a GET of that path."""
    limits = deployment.limits
    if http_health_path is None:
        protocol: Config = {"http2_protocol_options": hardening.upstream_http2_options(limits)}
        health: Config = {"grpc_health_check": {"service_name": HEALTH_SERVICE[name]}}
    else:
        protocol, health = {"http_protocol_options": {}}, {"http_health_check": {"path": http_health_path}}
    interval = _seconds(limits.health_check_interval_s)
    ip_only = all(_is_ip(h.host) for h in hosts)
    return {
        "name": name,
        "type": "STATIC" if ip_only else "STRICT_DNS",
        "connect_timeout": "2s",
        "lb_policy": "ROUND_ROBIN",
        # Never "panic" into sending calls to unhealthy hosts: a standby driver must get none.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        **hardening.cluster_limits(limits),
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": protocol,
            },
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _socket(h)}} for h in hosts]}],
        },
        "health_checks": [{
            "timeout": _seconds(limits.health_check_timeout_s),
            "interval": interval,
            # Also while the cluster has no traffic (Envoy's default then is 60 s): a worker that
            # reconnects after a failover must find the new leader already known.
            "no_traffic_interval": interval,
            # Two failures in a row, so one slow answer from a busy host does not take it out; one
            # success puts a host (a newly elected leader) in at once.
            "unhealthy_threshold": 2,
            "healthy_threshold": 1,
            **health,
        }],
        "transport_socket": {
            "name": _TLS_SOCKET,
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
                "common_tls_context": {
                    "alpn_protocols": ["h2"] if http_health_path is None else ["http/1.1"],
                    "tls_certificates": [_certificate(deployment.tls)],
                    "validation_context": {
                        "trusted_ca": {"filename": str(deployment.tls.ca_cert)},
                        "match_typed_subject_alt_names": [
                            {"san_type": "URI", "matcher": {"exact": IDENTITY_URI.format(name)}}],
                    },
                },
            },
        },
    }


WEB_STREAMS = r"/batches/[0-9]+/(events|jobs/[0-9]+/log/live)"
"""The web UI's server-sent event streams: long requests, with no timeout."""


def _web_routes(deployment: Deployment) -> list[Config]:
    """With a web UI: `/api/...` that the transcoder did not take, and gRPC to no service of ours, are 404
    here (a REST or gRPC client gets its own kind of error, not a page); everything else goes to the UI,
    without the REST body checks and with no gateway token."""
    if not deployment.webs:
        return []
    disabled = {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}
    web = {"request_headers_to_remove": [GATEWAY_TOKEN_HEADER],
           "typed_per_filter_config": {BUFFER: disabled, LUA: disabled}}
    return [
        {"match": {"prefix": "/api/"}, "direct_response": {"status": 404}},
        {"match": {"prefix": "/", "headers": [{"name": "content-type", "string_match": {"prefix": "application/grpc"}}]},
         "direct_response": {"status": 404}},
        {"match": {"safe_regex": {"regex": WEB_STREAMS}},
         "route": {"cluster": "web", "timeout": "0s", "idle_timeout": "0s"}, **web},
        {"match": {"prefix": "/"}, "route": {"cluster": "web", "timeout": _seconds(deployment.limits.route_timeout_s)},
         **web},
    ]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


MAX_OPENAPI_BYTES = 4 * 2**20


def _openapi_route(deployment: Deployment) -> Config:
    """GET OPENAPI_ROUTE: the REST API's OpenAPI document, from the file beside the descriptor set."""
    return {"match": {"path": OPENAPI_ROUTE, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
            "direct_response": {"status": 200, "body": {"filename": str(openapi_path(deployment.descriptor_set))}},
            "response_headers_to_add": [{"header": {"key": "content-type", "value": "application/json"},
                                         "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}


def _routes(services: list[RoutedService], timeout_s: float, auth_token: str | None = None) -> list[Config]:
    """Per service, its streaming methods without a timeout, then the rest of it with one. With `auth_token`,
    calls to auth carry it in GATEWAY_TOKEN_HEADER (a client's own replaced), and others never carry one."""
    routes = []
    for service in services:
        headers: Config = {}
        if auth_token is not None and service.upstream == "auth":
            headers = {"request_headers_to_add": [{"header": {"key": GATEWAY_TOKEN_HEADER, "value": auth_token},
                                                   "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]}
        elif auth_token is not None:
            headers = {"request_headers_to_remove": [GATEWAY_TOKEN_HEADER]}
        # gRPC is not buffered (its streams, uploads among them, flow as they come): only REST bodies are,
        # whose paths no gRPC route matches, for the unknown-key check to read whole (_rest_body_keys).
        unbuffered = {BUFFER: {"@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}}
        for method in service.streaming_methods:
            # A stream is a long request, not an idle one: no call timeout, and no idle timeout (a quiet
            # WatchBatch sends nothing for hours; a vanished client is found by PINGs and TCP keepalives).
            unlimited = {BODY_SIZE_LIMIT: {
                "@type": "type.googleapis.com/envoy.config.route.v3.FilterConfig", "disabled": True}} \
                if method in service.client_streaming_methods else {}
            routes.append({"match": {"path": f"/{service.name}/{method}"},
                           "route": {"cluster": service.upstream, "timeout": "0s", "idle_timeout": "0s"},
                           **headers, "typed_per_filter_config": {**unbuffered, **unlimited}})
        routes.append({"match": {"prefix": f"/{service.name}/"},
                       "route": {"cluster": service.upstream, "timeout": _seconds(timeout_s)}, **headers,
                       "typed_per_filter_config": unbuffered})
    return routes


BODY_SIZE_LIMIT = "envoy.filters.http.body_size_limit"
BUFFER = "envoy.filters.http.buffer"
LUA = "envoy.filters.http.lua"


def _router() -> Config:
    return {"name": "envoy.filters.http.router",
            "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}


def _body_size_limit(deployment: Deployment) -> Config:
    """Refuse (413) a request whose body, REST or gRPC, is larger than the limit, before any service
    reads it. (The transcoder's own limit only holds what it buffers, and a REST body is streamed.)"""
    return {
        "name": BODY_SIZE_LIMIT,
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.body_size_limit.v3.BodySizeLimit",
            "max_request_bytes": deployment.limits.max_request_bytes,
        },
    }


def _rest_buffer(deployment: Deployment) -> Config:
    """A REST request's body whole before the unknown-key check reads it, up to the request limit (Lua's
    body() alone would be held to the 32 KiB connection buffer). gRPC routes turn it off (_routes)."""
    return {"name": BUFFER, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer",
        "max_request_bytes": deployment.limits.max_request_bytes}}


def _rest_body_keys(deployment: Deployment) -> Config:
    """Refuse a REST body key that no field of the request has, naming it (services.gateway.rest_body_keys:
    the transcoder would drop it without a word)."""
    return {"name": LUA, "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua",
        "default_source_code": {"filename": str(lua_path(deployment.descriptor_set))}}}


def _transcoder(deployment: Deployment, services: list[RoutedService]) -> Config:
    limits = deployment.limits
    return {
        "name": "envoy.filters.http.grpc_json_transcoder",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
            "proto_descriptor": str(deployment.descriptor_set),
            "services": [s.name for s in services],
            # A failed call's grpc-status-details-bin becomes the JSON body (google.rpc.Status with its
            # details) and its code the HTTP status, instead of an empty 200.
            "convert_grpc_status": True,
            "print_options": {
                "add_whitespace": False,
                "always_print_primitive_fields": False,
                "always_print_enums_as_ints": False,
                "preserve_proto_field_names": False,
                # Server streams as one JSON message per line, each sent as it comes, rather than one
                # JSON array that is only complete when the stream ends.
                "stream_newline_delimited": True,
            },
            "max_request_body_size": limits.max_request_bytes,
            "max_response_body_size": limits.max_response_bytes,
            # A query parameter no field of the request has is refused (400), not silently dropped.
            "request_validation_options": {"reject_unknown_query_parameters": True},
        },
    }


def _listener(name: str, address: Address, tls_context: Config, manager: Config, limits: Limits) -> Config:
    """A TLS listener serving `manager`, held to `limits` (services.gateway.hardening); a timeout `manager`
    sets itself is kept."""
    common = {**hardening.idle_timeout(limits), **manager.get("common_http_protocol_options", {})}
    manager = {**hardening.manager_limits(limits), **manager, "common_http_protocol_options": common}
    return {
        "name": name,
        "address": _socket(address),
        **hardening.listener_limits(limits),
        "filter_chains": [{
            **hardening.filter_chain_limits(limits),
            "transport_socket": {"name": _TLS_SOCKET, "typed_config": tls_context},
            "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}],
        }],
    }


def public_config(deployment: Deployment) -> Config:
    """The public gateway: TLS for people, gRPC by service name, REST/JSON transcoded."""
    services = public_services()
    limits = deployment.limits
    reflection = [RoutedService(name, "frontend", ("ServerReflectionInfo",)) for name in REFLECTION_SERVICES]
    manager = {
        "@type": _HCM,
        "stat_prefix": "public",
        "codec_type": "AUTO",
        "use_remote_address": True,
        "generate_request_id": True,
        # People quote it when something went wrong; it is in the access log and the services' traces.
        "always_set_request_id_in_response": True,
        "normalize_path": True,
        "merge_slashes": True,
        "max_request_headers_kb": limits.max_request_headers_kb,
        "common_http_protocol_options": {"headers_with_underscores_action": "REJECT_REQUEST"},
        "access_log": access_log(deployment, "public"),
        "local_reply_config": local_replies(limits),
        "http_filters": [_body_size_limit(deployment), _rest_buffer(deployment), _rest_body_keys(deployment),
                         _transcoder(deployment, services), _router()],
        "route_config": {
            "name": "public",
            # The OpenAPI document, served whole from its file (some 150 KB; Envoy's default is 4 KiB).
            "max_direct_response_body_size_bytes": MAX_OPENAPI_BYTES,
            "virtual_hosts": [{
                "name": "corral",
                "domains": ["*"],
                "routes": [_openapi_route(deployment),
                           *_routes(services + reflection, limits.route_timeout_s, deployment.auth_token),
                           *_web_routes(deployment)],
            }],
        },
    }
    tls_context = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "common_tls_context": {
            "alpn_protocols": ["h2", "http/1.1"],
            "tls_certificates": [_certificate(deployment.tls)],
        },
    }
    return _with_stats({
        "admin": _admin(deployment.public_admin_socket),
        "overload_manager": hardening.overload_manager(limits),
        "static_resources": {
            "listeners": [_listener("public", deployment.public_listen, tls_context, manager, limits)],
            "clusters": [_cluster("auth", (deployment.auth,), deployment),
                         _cluster("frontend", deployment.frontends, deployment),
                         *([_cluster("web", deployment.webs, deployment, "/healthz")] if deployment.webs else [])],
        },
    }, "public", deployment.public_stats_listen, deployment.public_admin_socket, deployment)


def internal_config(deployment: Deployment) -> Config:
    """The internal gateway: workers (mutual TLS, certificates of the deployment CA) to the leading driver.

    The worker's identity travels to the driver in `x-forwarded-client-cert` (set by the gateway, any
    such header from the worker removed): the driver sees the gateway's certificate on the connection."""
    limits = deployment.limits
    manager = {
        "@type": _HCM,
        "stat_prefix": "internal",
        "codec_type": "HTTP2",
        "generate_request_id": True,
        "forward_client_cert_details": "SANITIZE_SET",
        "set_current_client_cert_details": {"uri": True, "cert": True, "chain": True},
        "access_log": access_log(deployment, "internal"),
        "http_filters": [_router()],
        "route_config": {
            "name": "internal",
            "virtual_hosts": [{
                "name": "drivers",
                "domains": ["*"],
                "routes": _routes(internal_services(), limits.route_timeout_s),
            }],
        },
    }
    validation: Config = {"trusted_ca": {"filename": str(deployment.tls.ca_cert)}}
    if deployment.worker_san_prefix:
        validation["match_typed_subject_alt_names"] = [
            {"san_type": "URI", "matcher": {"prefix": deployment.worker_san_prefix}}]
    tls_context = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "require_client_certificate": True,
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [_certificate(deployment.tls)],
            "validation_context": validation,
        },
    }
    listeners = [_listener("internal", deployment.internal_listen, tls_context, manager, limits)]
    if deployment.enroll_listen is not None:
        listeners.append(_enroll_listener(deployment))
    return _with_stats({
        "admin": _admin(deployment.internal_admin_socket),
        "overload_manager": hardening.overload_manager(limits),
        "static_resources": {
            "listeners": listeners,
            "clusters": [_cluster("driver", deployment.drivers, deployment)],
        },
    }, "internal", deployment.internal_stats_listen, deployment.internal_admin_socket, deployment)


ENROLL_PATH = "/corral.driver.v1.WorkerEnrollmentService/Enroll"
"""The one path the enrollment listener forwards."""
MAX_ENROLL_REQUEST_BYTES = 64 * 1024
"""Largest request body on the enrollment listener (an EnrollRequest is 1 to 3 KB; its CSR at most 16 KiB)."""


def _enroll_listener(deployment: Deployment) -> Config:
    """New workers, which have no certificate yet, enroll here with their one-time token (issue 16): TLS with
    the gateway's certificate, no client certificate asked for, and one route, a POST of Enroll, to the
    leading driver under the gateway's own certificate; anything else is 404 (UNIMPLEMENTED to gRPC). No
    `x-forwarded-client-cert` reaches the driver from here (any a caller sent is removed): the driver
    takes the call for the gateway's own, which may call Enroll alone."""
    assert deployment.enroll_listen is not None
    limits = deployment.limits
    manager = {
        "@type": _HCM,
        "stat_prefix": "enroll",
        "codec_type": "HTTP2",
        "generate_request_id": True,
        # Enrolling is one short call: a connection idle this long is closed.
        "stream_idle_timeout": "30s",
        "request_timeout": "30s",
        "forward_client_cert_details": "SANITIZE",
        "max_request_headers_kb": 16,
        "access_log": access_log(deployment, "enroll"),
        "http_filters": [{
            # Before anything reaches the driver: anyone who reaches this listener may call Enroll.
            "name": "envoy.filters.http.local_ratelimit",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
                "stat_prefix": "enroll_rate_limit",
                "token_bucket": {"max_tokens": limits.enroll_burst, "tokens_per_fill": limits.enroll_per_second,
                                 "fill_interval": "1s"},
                "filter_enabled": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}},
                "filter_enforced": {"default_value": {"numerator": 100, "denominator": "HUNDRED"}},
            },
        }, {
            "name": "envoy.filters.http.body_size_limit",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.body_size_limit.v3.BodySizeLimit",
                "max_request_bytes": MAX_ENROLL_REQUEST_BYTES,
            },
        }, _router()],
        "route_config": {
            "name": "enroll",
            "virtual_hosts": [{
                "name": "enroll",
                "domains": ["*"],
                "routes": [
                    {"match": {"path": ENROLL_PATH,
                               "headers": [{"name": ":method", "string_match": {"exact": "POST"}}]},
                     "route": {"cluster": "driver", "timeout": _seconds(limits.route_timeout_s)}},
                    {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
                ],
            }],
        },
    }
    tls_context = {
        "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
        "require_client_certificate": False,
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_certificates": [_certificate(deployment.tls)],
        },
    }
    return _listener("enroll", deployment.enroll_listen, tls_context, manager, limits)


CONFIGS = {"public": public_config, "internal": internal_config}
"""Every gateway config, by the file stem it is written under (`envoy-NAME.yaml`)."""
