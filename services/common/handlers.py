"""Wrapping a gRPC method handler's behavior, whatever its kind (what a server interceptor does)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

UnaryBehavior = Callable[..., Awaitable[Any]]
StreamBehavior = Callable[..., AsyncIterator[Any]]


_KEEP: Any = object()


def rewrapped(handler: grpc.RpcMethodHandler, unary_response: Callable[[UnaryBehavior], UnaryBehavior],
              stream_response: Callable[[StreamBehavior], StreamBehavior],
              request_deserializer: Callable[[bytes], Any] | None = _KEEP) -> grpc.RpcMethodHandler:
    """`handler` with its behavior wrapped: by `unary_response` for the kinds that answer once (unary-unary,
    stream-unary), by `stream_response` for those that stream their answer. With `request_deserializer`
    None, the behavior receives the request's bytes (and decodes them itself)."""
    deserializer = handler.request_deserializer if request_deserializer is _KEEP else request_deserializer
    serializers = (deserializer, handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary_response(handler.unary_unary), *serializers)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream_response(handler.unary_stream), *serializers)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary_response(handler.stream_unary), *serializers)
    return grpc.stream_stream_rpc_method_handler(stream_response(handler.stream_stream), *serializers)
