"""What the public gateway answers when Envoy itself answers (no route, a body over the limit, a REST request the
transcoder cannot read, no healthy upstream): to REST a JSON google.rpc.Status like the services' errors, to gRPC
the gRPC code the services would give."""

from __future__ import annotations

from typing import Any

from services.gateway.deployment import Limits

Config = dict[str, Any]

# The gRPC code a REST caller reads in the google.rpc.Status of a reply Envoy itself made (no route, a body
# over the limit, a malformed REST request, no healthy upstream), by its HTTP status.
_LOCAL_REPLY_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 408: 4, 413: 8, 429: 8, 431: 8, 500: 13, 501: 12,
                      502: 14, 503: 14, 504: 4}
_UNKNOWN = 2
_RESOURCE_EXHAUSTED = 8


def too_large_message(limits: Limits) -> str:
    """What a caller reads when its request is larger than the gateway takes (REST and gRPC alike)."""
    return (f"request larger than the gateway's limit of {limits.max_request_bytes} bytes (max_request_bytes); "
            "send a smaller one (AddJobs: fewer jobs a call)")


def local_replies(limits: Limits) -> Config:
    """Replies Envoy makes itself, to a REST request, carry a JSON google.rpc.Status as the services' errors
    do (the transcoder and the router answer in plain text, or nothing, otherwise). A REST request is one
    whose path is under /api/, before the transcoder rewrote it into a gRPC call (it keeps the original in
    x-envoy-original-path) or as it came; a gRPC call's reply stays gRPC (grpc-status and grpc-message).

    A gRPC call whose request is too large (413) ends RESOURCE_EXHAUSTED, as it does direct to the services:
    Envoy's own mapping of an HTTP status to a gRPC code has none for 413 and says UNKNOWN. (Headers over the
    limit on HTTP/2 end the connection in the codec, before any reply: GOAWAY, UNAVAILABLE to the client.)"""
    rest = {"or_filter": {"filters": [
        {"header_filter": {"header": {"name": name, "string_match": {"prefix": "/api/"}}}}
        for name in (":path", "x-envoy-original-path")]}}

    def status_is(op: str, http_status: int) -> Config:
        value = {"default_value": http_status, "runtime_key": f"corral.local_reply.{op.lower()}.{http_status}"}
        return {"status_code_filter": {"comparison": {"op": op, "value": value}}}

    def mapper(op: str, http_status: int, grpc_code: int) -> Config:
        # The router's 404 says nothing of its own; a body over the limit is told the limit.
        message = {404: "no such REST route: %REQ(:METHOD)% %REQ(:PATH)%",
                   413: too_large_message(limits)}.get(http_status, "%LOCAL_REPLY_BODY%")
        return {"filter": {"and_filter": {"filters": [rest, status_is(op, http_status)]}},
                "body_format_override": {"json_format": {"code": grpc_code, "message": message},
                                         "content_type": "application/json"}}

    # Envoy keeps a grpc-status a mapper set; the body becomes the grpc-message.
    grpc_too_large = {"filter": status_is("EQ", 413),
                      "headers_to_add": [{"header": {"key": "grpc-status", "value": str(_RESOURCE_EXHAUSTED)},
                                          "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}],
                      "body": {"inline_string": too_large_message(limits)}}

    # Any other error is UNKNOWN; a success Envoy makes itself (the OpenAPI document) stays as it is.
    return {"mappers": [*(mapper("EQ", http, code) for http, code in _LOCAL_REPLY_CODES.items()),
                        mapper("GE", 400, _UNKNOWN),
                        # Past the REST mappers: only gRPC calls are left.
                        grpc_too_large]}
