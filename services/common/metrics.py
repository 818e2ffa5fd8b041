"""Prometheus metrics: what every service counts, and the port they are read on.

Each service process, given `--metrics-address HOST:PORT`, serves its
metrics in Prometheus' text format at `https://HOST:PORT/metrics` (threads
of its own, prometheus_client's exposition), and writes the port it bound to
`--metrics-port-file` if given (as `corral up --metrics` asks). The metrics
name users and pools (never a token or a job's contents), and a job of the
process runtime shares its host's network, so the port speaks TLS with the
process's own certificate and answers only a client that shows a
certificate of the deployment CA (`corral up --metrics` provisions one for
the scraper in DATA/certs/metrics; jobs hold none).

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
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import grpc
from prometheus_client import Counter, Histogram, make_wsgi_app

from services.common.files import write_atomically
from services.common.handlers import StreamBehavior, UnaryBehavior, rewrapped
from services.common.tls import TlsFiles

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
                        help="serve Prometheus metrics at https://HOST:PORT/metrics (port 0: any free one), "
                             "to clients with a certificate of the deployment CA (default: no metrics)")
    parser.add_argument("--metrics-port-file", type=Path, metavar="PATH",
                        help="write the metrics port bound to PATH (removed when the process ends)")


class MetricsServer:
    """The process's metrics endpoint, from `--metrics-address`, over TLS with `tls`'s certificate, for
    clients with a certificate signed by `tls`'s CA only; `close` stops it."""

    def __init__(self, address: str, tls: TlsFiles, port_file: Path | None = None):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--metrics-address {address!r}: HOST:PORT")
        self._server = _serve(host.strip("[]"), int(port), tls)
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        self.port: int = self._server.server_port
        self._port_file = port_file
        if port_file is not None:
            write_atomically(port_file, str(self.port).encode())

    def close(self) -> None:
        if self._port_file is not None:
            self._port_file.unlink(missing_ok=True)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


HANDSHAKE_TIMEOUT_S = 10.0
"""How long a metrics client has to finish its TLS handshake, and then each read or write."""


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass  # a request per scrape: not worth a log line


class _MutualTlsServer(ThreadingMixIn, WSGIServer):
    """A thread per connection, which does the TLS handshake itself within HANDSHAKE_TIMEOUT_S: a client
    that connects and never finishes its handshake holds up only its own thread. (prometheus_client's
    own server wraps the listening socket, so one such client would stall every scrape.)"""

    daemon_threads = True
    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(HANDSHAKE_TIMEOUT_S)
        try:
            connection = self.context.wrap_socket(request, server_side=True)
        except OSError:  # no certificate, not the CA's, not TLS, too slow: nothing is read
            return
        with connection:
            super().finish_request(connection, client_address)


def _serve(host: str, port: int, tls: TlsFiles) -> _MutualTlsServer:
    """The process's metrics (prometheus_client's default registry) at https://HOST:PORT/metrics, with
    `tls`'s certificate, to clients with a certificate `tls`'s CA signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca_cert))
    context.load_cert_chain(tls.cert, tls.key)
    context.verify_mode = ssl.CERT_REQUIRED

    class Server(_MutualTlsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = make_server(host, port, make_wsgi_app(), Server, handler_class=_Quiet)
    server.context = context
    return server


def serve_for_process(args: argparse.Namespace, identity: str) -> MetricsServer | None:
    """The metrics endpoint `args` ask for (none without --metrics-address), with the certificate of
    `identity` in `args.certs_dir`, closed when the process exits (its port file removed; a process killed
    outright leaves it, and its port answers nothing)."""
    if not args.metrics_address:
        return None
    server = MetricsServer(args.metrics_address, TlsFiles.of(args.certs_dir, identity), args.metrics_port_file)
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


