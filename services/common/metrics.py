"""Prometheus metrics: what every service counts, and the port they are read on.

Each service process, given `--metrics-address HOST:PORT`, serves its
metrics in Prometheus' text format at `http://HOST:PORT/metrics` (a thread
of prometheus_client's own), and writes the port it bound to
`--metrics-port-file` if given (as `corral up --metrics` asks). The port is
internal, like the services' internal gRPC ports: it has no
authentication, so bind it to loopback or a network only operators reach
(the metrics name users and pools, never a token or a job's contents).

The metrics are the process's (prometheus_client's default registry): a
module defines those it updates, so a process exports those of the modules
it runs. The ones every service has are here: the RPCs it served and the
database transactions it retried. docs/operations.md lists every metric.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import Counter, Histogram, start_http_server

from services.common.files import write_atomically
from services.common.handlers import StreamBehavior, UnaryBehavior, rewrapped

RPC_REQUESTS = Counter("corral_rpc_requests", "RPCs this process served, by gRPC service, method and status code "
                       "(a stream is counted when it ends).", ["service", "method", "code"])
RPC_SECONDS = Histogram("corral_rpc_duration_seconds", "How long this process took to serve each RPC, by gRPC "
                        "service and method (a stream: its whole life).", ["service", "method"],
                        buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                 300, 3600))
DB_RETRIES = Counter("corral_db_retries", "Database transactions and procedure calls retried whole after a "
                     "deadlock (MySQL error 1213) or a lock wait timeout (1205), by statement or procedure name "
                     "and error.", ["name", "error"])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--metrics-address` and `--metrics-port-file`, for a service's `python -m` entry point."""
    parser.add_argument("--metrics-address", metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics (port 0: any free one); "
                             "no authentication, so an internal address (default: no metrics)")
    parser.add_argument("--metrics-port-file", type=Path, metavar="PATH",
                        help="write the metrics port bound to PATH (removed when the process ends)")


class MetricsServer:
    """The process's metrics endpoint, from `--metrics-address`; `close` stops it."""

    def __init__(self, address: str, port_file: Path | None = None):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--metrics-address {address!r}: HOST:PORT")
        self._server, self._thread = start_http_server(int(port), addr=host.strip("[]"))
        self.port: int = self._server.server_port
        self._port_file = port_file
        if port_file is not None:
            write_atomically(port_file, str(self.port).encode())

    @classmethod
    def from_arguments(cls, args: argparse.Namespace) -> MetricsServer | None:
        if not args.metrics_address:
            return None
        return cls(args.metrics_address, args.metrics_port_file)

    def close(self) -> None:
        if self._port_file is not None:
            self._port_file.unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_for_process(args: argparse.Namespace) -> MetricsServer | None:
    """The metrics endpoint `args` ask for (none without --metrics-address), closed when the process exits
    (its port file removed; a process killed outright leaves it, and its port answers nothing)."""
    server = MetricsServer.from_arguments(args)
    if server is not None:
        atexit.register(server.close)
    return server


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Counts and times every RPC a server serves, by its status code: placed first among a server's
    interceptors, it sees the status the others set (an abort's, or OK)."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:  # no such method: grpc answers UNIMPLEMENTED, and the name is the caller's
            return handler
        service, _, method = details.method.strip("/").rpartition("/")

        @contextlib.contextmanager
        def counted(context: grpc.aio.ServicerContext) -> Iterator[None]:
            started, code = time.perf_counter(), grpc.StatusCode.UNKNOWN
            try:
                yield
                code = _code(context, grpc.StatusCode.OK)
            except BaseException as e:  # noqa: BLE001 - counted, then raised as it was
                cancelled = isinstance(e, asyncio.CancelledError)
                code = _code(context, grpc.StatusCode.CANCELLED if cancelled else grpc.StatusCode.UNKNOWN)
                raise
            finally:
                RPC_SECONDS.labels(service, method).observe(time.perf_counter() - started)
                RPC_REQUESTS.labels(service, method, code.name).inc()

        def unary_response(behavior: UnaryBehavior) -> UnaryBehavior:
            async def counting(request: Any, context: grpc.aio.ServicerContext) -> Any:
                with counted(context):
                    return await behavior(request, context)
            return counting

        def stream_response(behavior: StreamBehavior) -> StreamBehavior:
            async def counting(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                with counted(context):
                    async for response in behavior(request, context):
                        yield response
            return counting

        return rewrapped(handler, unary_response, stream_response)


def _code(context: grpc.aio.ServicerContext, otherwise: grpc.StatusCode) -> grpc.StatusCode:
    """The status the call's context was given, if any."""
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # some grpc versions keep the number
        return next((c for c in grpc.StatusCode if c.value[0] == code), otherwise)
    return otherwise


