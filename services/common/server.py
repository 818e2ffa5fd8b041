"""Serving corral's gRPC services: listeners, interceptors, health, reflection.

A service process serves the same servicers on one or two listeners:
- *internal*: mutual TLS; the caller is the service named by its client
  certificate. Other corral services (and workers) call here.
- *public*: TLS and a bearer token; people call here.
Each listener is its own `grpc.aio.Server`, so the authentication rule is a
property of the port, not something each handler has to remember. Every
server also serves gRPC health checking and server reflection, traces
each call with OpenTelemetry when a tracer provider is given, and holds
every call to the process's `CallLimits` (services.common.call_limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import grpc
from google.protobuf import message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from grpc_status import rpc_status
from opentelemetry.instrumentation.grpc import aio_server_interceptor
from opentelemetry.sdk.trace import TracerProvider

from services.common.authz import refusal
from services.common.call_limits import CallLimits, StreamSlots, UserLimiter
from services.common.errors import DeadlineExceeded, InvalidRequest, PermissionDenied, to_status
from services.common.fields import violations
from services.common.files import write_atomically
from services.common.handlers import rewrapped
from services.common.identity import (
    Authenticator,
    BearerAuthenticator,
    PeerCertificate,
    Principal,
    reset_principal,
    set_principal,
)
from services.common.metrics import MetricsInterceptor
from services.common.tls import TlsFiles

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Service:
    """One gRPC service to serve: its full name and how to register it."""

    name: str
    """Full service name, e.g. 'corral.auth.v1.AuthService'."""
    servicer: object
    """The servicer instance."""
    register: Callable[[Any, grpc.aio.Server], None]
    """The generated `add_XServicer_to_server` function."""


@dataclasses.dataclass(frozen=True)
class Listener:
    """Where and how to listen."""

    address: str
    """host:port; port 0 picks a free port."""
    tls: TlsFiles
    """This service's certificate and the CA."""
    authenticate: Authenticator
    """Who the caller is (see services.common.identity)."""
    internal: bool
    """Mutual TLS (client certificate required) when True: methods are allowed by the caller's role."""
    require_client_cert: bool | None = None
    """Whether the TLS handshake requires a client certificate; None: as `internal`. (A driver's
    enrollment listener is internal, methods allowed by role, but its callers have no certificate yet.)"""
    services: Sequence[Service] | None = None
    """What this listener serves instead of `serve`'s services: the same services, built apart (the
    frontend's internal listener reads through a database pool of its own); None: `serve`'s."""

    @classmethod
    def mutual_tls(cls, address: str, tls: TlsFiles, gateway_methods: frozenset[str] = frozenset(),
                   services: Sequence[Service] | None = None) -> Listener:
        """An internal listener: callers are the corral services and workers named by their
        client certificates (signed by `tls.ca_cert`); the internal gateway may call `gateway_methods`
        on its own (services.common.identity.PeerCertificate)."""
        return cls(address, tls, PeerCertificate(tls.ca_cert, gateway_methods), internal=True, services=services)

    @property
    def client_cert_required(self) -> bool:
        return self.internal if self.require_client_cert is None else self.require_client_cert


class RequestInterceptor(grpc.aio.ServerInterceptor):
    """Authenticates each call, refuses callers the method does not allow
    (`services.common.authz`), sets its principal, checks the request's fields, holds
    the call to its limits, and maps errors to statuses."""

    def __init__(self, authenticate: Authenticator, internal: bool, limits: CallLimits = CallLimits(),
                 stream_slots: StreamSlots | None = None, user_limiter: UserLimiter | None = None):
        self._authenticate = authenticate
        self._internal = internal
        self._limits = limits
        self._stream_slots = stream_slots
        self._user_limiter = user_limiter

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(("/grpc.health.", "/grpc.reflection.")):
            return handler
        method = details.method
        authenticate, internal = self._authenticate, self._internal
        limits, slots, quotas = self._limits, self._stream_slots, self._user_limiter
        # The request is decoded here rather than by grpc, so that bytes that are no message of its type (a
        # REST body the gateway transcoded into a corrupt one) are INVALID_ARGUMENT, not an UNKNOWN error.
        deserialize, streaming = handler.request_deserializer, handler.request_streaming

        def decoded(request: Any) -> Any:
            if deserialize is None:
                return request
            return _decoded_stream(request, deserialize) if streaming else _decoded(request, deserialize)

        async def begin(request: Any, context: grpc.aio.ServicerContext, held: list[str]) -> tuple[Principal, Any]:
            """Authenticate, authorize, hold the user to their quotas (a read slot taken is put in
            `held`, for the caller to give back however the call ends), check the fields."""
            if not internal and (why := refusal(method, internal, None)) is not None:
                raise PermissionDenied(why)  # before the token is even looked at
            principal = await authenticate(context, method)
            if internal and (why := refusal(method, internal, principal)) is not None:
                raise PermissionDenied(why)
            if quotas is not None and (read_slot := quotas.admit(principal, method)) is not None:
                held.append(read_slot)
            token = set_principal(principal)
            if limits.field_limits is not None and isinstance(request, message.Message):
                found = violations(request, limits.field_limits)
                if found:
                    reset_principal(token)
                    raise InvalidRequest(found, "request fields over their limits")
            return principal, token

        def give_back(held: list[str]) -> None:
            if quotas is not None:
                for read_slot in held:
                    quotas.release(read_slot)

        async def fail(context: grpc.aio.ServicerContext, error: Exception) -> None:
            status = to_status(error)
            if status is None:
                log.exception("unexpected error in %s", method, exc_info=error)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}")
            await context.abort_with_status(rpc_status.to_status(status))

        def unary_response(behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
            async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
                token, held = None, []
                # A client stream (an image's upload) is a long request: its servicer bounds its time.
                deadline = asyncio.timeout(None if streaming else limits.unary_deadline_s)
                try:
                    async with deadline:
                        request = decoded(request)
                        _, token = await begin(request, context, held)
                        return await behavior(request, context)
                except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
                    if isinstance(error, grpc.aio.AbortError):
                        raise
                    if isinstance(error, TimeoutError) and deadline.expired():
                        # DEADLINE_EXCEEDED, as if the client had set this deadline: the
                        # call may well succeed when the server is less busy. (A single
                        # read too slow on its own is RESOURCE_EXHAUSTED: errors.py.)
                        error = DeadlineExceeded(f"the call ran longer than this server allows a call "
                                                 f"({limits.unary_deadline_s:g} s: rpc_deadline_s)")
                    await fail(context, error)
                finally:
                    give_back(held)
                    if token is not None:
                        reset_principal(token)

            return wrapped

        def stream_response(behavior: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
            async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                token, holder, held = None, None, []
                try:
                    request = decoded(request)
                    principal, token = await begin(request, context, held)
                    if slots is not None:
                        slots.acquire(principal.name)
                        holder = principal.name
                    responses = behavior(request, context)
                    if isinstance(authenticate, BearerAuthenticator):
                        responses = _while_authenticated(responses, authenticate, context)
                    async for response in responses:
                        yield response
                except Exception as error:  # noqa: BLE001 - mapped to a status, never swallowed
                    if isinstance(error, grpc.aio.AbortError):
                        raise
                    await fail(context, error)
                finally:
                    # However the stream ends: finished, failed, or cancelled by the client.
                    if holder is not None and slots is not None:
                        slots.release(holder)
                    give_back(held)
                    if token is not None:
                        reset_principal(token)

            return wrapped

        return rewrapped(handler, unary_response, stream_response, request_deserializer=None)


def _decoded(data: bytes, deserialize: Callable[[bytes], Any]) -> Any:
    try:
        return deserialize(data)
    except message.DecodeError as e:
        raise InvalidRequest([], f"the request is not a well-formed message of its type: {e}") from None


async def _decoded_stream(requests: AsyncIterator[bytes], deserialize: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    async for data in requests:
        yield _decoded(data, deserialize)


STREAM_RECHECK_MIN_S = 0.25
"""A server stream's token is checked again at most this often (a verifier that allows no reuse
would otherwise be asked without pause)."""


async def _while_authenticated(responses: AsyncIterator[Any], authenticator: BearerAuthenticator,
                               context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    """`responses` for as long as the call's bearer token is accepted: checked again each time
    the answer the authenticator holds may no longer be reused (even while the stream has
    nothing to send), so a revoked token's stream ends within the same bound as its calls,
    with the authenticator's refusal (UNAUTHENTICATED)."""
    loop = asyncio.get_running_loop()
    iterator = responses.__aiter__()
    recheck_at = loop.time() + max(STREAM_RECHECK_MIN_S, await authenticator.recheck(context))
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=max(0.0, recheck_at - loop.time()))
            if pending in done:
                finished, pending = pending, None
                try:
                    response = finished.result()
                except StopAsyncIteration:
                    return
                yield response
            else:
                recheck_at = loop.time() + max(STREAM_RECHECK_MIN_S, await authenticator.recheck(context))
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # its end is not the call's
                await pending
        await iterator.aclose()  # type: ignore[attr-defined]


@dataclasses.dataclass
class RunningServers:
    """The started servers of one process and the ports they bound."""

    servers: list[grpc.aio.Server]
    ports: list[int]
    health: health.aio.HealthServicer
    stream_slots: StreamSlots | None = None
    """Server streams open per caller, when limited."""
    service_names: list[str] = dataclasses.field(default_factory=list)
    """The services served (health reports each, and "" for the whole server)."""
    user_limiter: UserLimiter | None = None
    """Each user's requests, reads and submissions, when limited."""
    serving: bool = False
    """What health reports now."""
    _watch: asyncio.Task[None] | None = None
    _recheck: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def set_serving(self, serving: bool) -> None:
        """Report every service SERVING or NOT_SERVING."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self.serving = serving
        for name in [*self.service_names, ""]:
            await self.health.set(name, status)

    def watch_health(self, probe: Callable[[], Awaitable[object]], period_s: float = 2.0,
                     timeout_s: float = 2.0, ready: Callable[[], bool] = lambda: True) -> None:
        """Check `probe` (e.g. a `SELECT 1` on the database) every `period_s`: health says
        NOT_SERVING while it fails or takes longer than `timeout_s`, or while `ready()` is false
        (a standby driver is not ready: only the leader serves), SERVING once both hold again.
        `recheck_health()` looks again at once."""

        async def watch() -> None:
            serving = self.serving
            while True:
                self._recheck.clear()
                try:
                    # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives as the
                    # probe answers (CPython gh-86296), and stop() would wait for this loop forever.
                    async with asyncio.timeout(timeout_s):
                        await probe()
                    healthy, why = ready(), "not ready"
                except Exception as e:  # noqa: BLE001 - any failure means not serving
                    healthy, why = False, f"health probe failed: {e}"
                if healthy != serving:
                    serving = healthy
                    if healthy:
                        log.info("SERVING again")
                    else:
                        log.warning("now NOT_SERVING: %s", why)
                    await self.set_serving(serving)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(period_s):
                        await self._recheck.wait()

        self._watch = asyncio.create_task(watch())

    def recheck_health(self) -> None:
        """Run the health check now rather than at the end of its period (readiness changed)."""
        self._recheck.set()

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING, then stop accepting calls and let running ones finish."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self.health.enter_graceful_shutdown()
        for server in self.servers:
            await server.stop(grace_s)


async def serve(
    services: Sequence[Service],
    listeners: Sequence[Listener],
    tracer_provider: TracerProvider | None = None,
    limits: CallLimits = CallLimits(),
    serving_at_start: bool = True,
    also_reflected: Sequence[str] = (),
) -> RunningServers:
    """Start one server per listener with every service, health and reflection, every
    call held to `limits` (stream slots are counted across the listeners). Health says
    SERVING from the start unless `serving_at_start` is false (a driver is not ready until
    it leads: a gateway that asked a fresh standby must not hear SERVING even once). If a
    listener cannot start (its port is taken), the servers already started are stopped first."""
    health_servicer = health.aio.HealthServicer()
    servers, ports = [], []
    # Reflection also lists `also_reflected`: services another process serves at the same address (a gateway's).
    names = [s.name for s in services] + list(also_reflected) + [health.SERVICE_NAME, reflection.SERVICE_NAME]
    slots = None if limits.max_streams_per_caller is None else StreamSlots(limits.max_streams_per_caller)
    user_limiter = None if limits.user_quotas is None else UserLimiter(limits.user_quotas)
    async with contextlib.AsyncExitStack() as started:
        for listener in listeners:
            interceptors: list[grpc.aio.ServerInterceptor] = []
            if tracer_provider is not None:
                interceptors.append(aio_server_interceptor(tracer_provider=tracer_provider))
            interceptors.append(MetricsInterceptor())  # before the next: it counts the status that one sets
            interceptors.append(RequestInterceptor(listener.authenticate, listener.internal, limits, slots,
                                                   user_limiter))
            server = grpc.aio.server(interceptors=interceptors, options=[
                ("grpc.max_receive_message_length", limits.max_receive_message_bytes)])
            served = services if listener.services is None else listener.services
            assert [s.name for s in served] == [s.name for s in services], "a listener serves the same services"
            for service in served:
                service.register(service.servicer, server)
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            reflection.enable_server_reflection(names, server)
            port = server.add_secure_port(listener.address, listener.tls.server_credentials(listener.client_cert_required))
            await server.start()
            started.push_async_callback(server.stop, None)
            servers.append(server)
            ports.append(port)
        running = RunningServers(servers, ports, health_servicer, slots, [s.name for s in services],
                                 user_limiter=user_limiter)
        await running.set_serving(serving_at_start)
        started.pop_all()
    return running


def database_probe(db: Any) -> Callable[[], Awaitable[object]]:
    """A health probe: one round trip to the database."""
    return lambda: db.fetchone("SELECT 1 AS alive", name="health_probe")


def write_ports_file(path: Path, ports: Mapping[str, object]) -> None:
    """Tell whoever started this process (`corral up`, a benchmark) which
    ports it bound, as JSON, written whole (corral up once read a ports file
    between its creation and its write, and stopped)."""
    write_atomically(path, json.dumps(dict(ports)).encode())


class Stoppable(Protocol):
    """A running service app."""

    async def stop(self) -> None: ...


async def run_until_signalled(app: Stoppable) -> None:
    """Serve until SIGTERM or SIGINT, then stop `app` (its stop() drains calls)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    try:
        await stopping.wait()
    finally:
        with contextlib.suppress(Exception):
            await app.stop()
