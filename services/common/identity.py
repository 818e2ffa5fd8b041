"""Who is calling: a principal per request, set by the request interceptor.

On an internal (mutual TLS) listener the caller is the service or worker
named by the identity URI of its verified client certificate
(`services.common.tls`). On a public listener the caller is the person (or
service account) behind the bearer token in the `authorization` metadata.

The rule that keeps users' tokens from acting as services: a principal of
kind 'service' comes only from a verified certificate. A bearer token of a
service-kind user (a pipeline runner, say) authenticates a
'service_account': it acts with its roles, as a person would, and never
passes `require_service`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import math
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import grpc
from cryptography import x509

from services.common.errors import PermissionDenied, Unauthenticated
from services.common.tls import SERVICE_IDENTITIES, SERVICE_URI_PREFIX, WORKER_URI_PREFIX

SERVICE_ROLES = frozenset(SERVICE_IDENTITIES)
"""The corral services that may hold a certificate signed by the CA itself."""


@dataclasses.dataclass(frozen=True)
class Principal:
    """An authenticated caller."""

    name: str
    """Username, or the service identity of a certificate."""
    kind: str
    """'service': a corral service, by its certificate on an internal listener (nothing else is);
    'person' or 'service_account': a bearer token of a person or of a service-kind user; 'enrollee': a caller
    without a certificate on a driver's enrollment listener (services.driver.enrollment)."""
    roles: frozenset[str] = frozenset()
    """'user', 'developer', 'admin' (services: empty)."""
    token_id: str | None = None
    """The token the call used, for a person."""
    role: str = ""
    """For a certificate: 'auth', 'frontend', 'driver' or 'worker' (what internal methods allow);
    empty for a bearer token."""
    through_gateway: bool = False
    """A worker whose certificate the internal gateway forwarded: it reaches drivers only through it."""

    @property
    def is_admin(self) -> bool:
        return "admin" in self.roles

    def require_admin(self) -> None:
        """Refuse unless the caller is an administrator."""
        if not self.is_admin:
            raise PermissionDenied(f"{self.name} is not an administrator")

    def require_service(self) -> None:
        """Refuse unless the caller is a corral service (mutual TLS); never a bearer token."""
        if self.kind != "service":
            raise PermissionDenied("only corral services may call this")


_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("corral_principal", default=None)


def current_principal() -> Principal:
    """The caller of the RPC being served; raises if the call is anonymous."""
    principal = _current.get()
    if principal is None:
        raise Unauthenticated("this call needs credentials")
    return principal


def set_principal(principal: Principal | None) -> contextvars.Token[Principal | None]:
    """Used by the interceptor around each call."""
    return _current.set(principal)


def reset_principal(token: contextvars.Token[Principal | None]) -> None:
    """Undo `set_principal` at the end of a call.

    A streaming call the client cancels has its handler's generator closed
    from another task, whose context never saw the principal: nothing to
    undo there, and the call's own context ends with its task."""
    with contextlib.suppress(ValueError):
        _current.reset(token)


Authenticator = Callable[[grpc.aio.ServicerContext, str], Awaitable[Principal | None]]
"""Given a call's context and full method name, its principal (None = anonymous)."""


@functools.lru_cache(maxsize=1024)
def _issuer(pem: bytes) -> x509.Name:
    return x509.load_pem_x509_certificate(pem).issuer


class PeerCertificate:
    """Authenticates a mutual-TLS caller by its verified client certificate.

    The identity is the certificate's one `spiffe://corral/...` URI. A
    service identity must be signed by the CA itself: a certificate signed by
    an intermediate (the drivers' worker issuer) may only name a worker, so a
    driver that signs worker certificates cannot mint a frontend.

    A caller that reaches us through the internal gateway (Envoy,
    services.gateway) is the worker behind it: the gateway verified the
    worker's certificate against the same CA, and sends it in
    `x-forwarded-client-cert`, removing any such header the worker sent. That
    header is believed only on a connection that presents the gateway's own
    certificate, and only when it names a worker. The gateway itself, forwarding
    no certificate, may call only `gateway_methods`: the enrollment of a new
    worker, which has no certificate yet and proves itself with its one-time
    token (services.driver.enrollment); any other call without a forwarded
    certificate is refused.
    """

    def __init__(self, ca_cert: Path, gateway_methods: frozenset[str] = frozenset()):
        self._ca_subject = x509.load_pem_x509_certificate(ca_cert.read_bytes()).subject
        self._gateway_methods = gateway_methods

    async def __call__(self, context: grpc.aio.ServicerContext, method: str) -> Principal:
        auth = context.auth_context()
        uris = [u.decode() for u in auth.get("peer_uri") or () if u.startswith(b"spiffe://corral/")]
        pems = auth.get("x509_pem_cert") or []
        if not pems:
            raise Unauthenticated("a client certificate is required")
        principal = self._identify(uris, pems[0])
        if principal.role != GATEWAY_IDENTITY:
            return principal
        forwarded = forwarded_certificate(context.invocation_metadata() or ())
        if forwarded is None and method in self._gateway_methods:
            return principal  # the gateway's own call (what it may call: services.common.authz)
        if forwarded is None:
            raise Unauthenticated("the gateway forwarded no client certificate (x-forwarded-client-cert)")
        caller = self._identify(_spiffe_uris(forwarded), forwarded)
        if caller.role != "worker":
            # The gateway admits workers only. A certificate is public: were anything else believed here,
            # whoever held the gateway's key could be any service.
            raise Unauthenticated(f"the gateway forwards workers only, not {caller.name}")
        return dataclasses.replace(caller, through_gateway=True)

    def _identify(self, uris: list[str], pem: bytes) -> Principal:
        if len(uris) != 1:
            raise Unauthenticated("the client certificate must name exactly one spiffe://corral/ identity")
        uri = uris[0]
        if uri.startswith(WORKER_URI_PREFIX) and len(uri) > len(WORKER_URI_PREFIX):
            return Principal(name="worker-" + uri.removeprefix(WORKER_URI_PREFIX), kind="service", role="worker")
        name = uri.removeprefix(SERVICE_URI_PREFIX)
        if not uri.startswith(SERVICE_URI_PREFIX) or name not in SERVICE_ROLES:
            raise Unauthenticated(f"unknown identity {uri}")
        if _issuer(pem) != self._ca_subject:
            raise Unauthenticated(f"{uri} is not signed by the CA itself: an intermediate issues workers only")
        return Principal(name=name, kind="service", role=name)


GATEWAY_TOKEN_HEADER = "x-corral-gateway-token"
"""The header the public gateway puts on every call it forwards to auth, with a secret auth is given too
(`--gateway-token-file`): the gateway's `x-forwarded-for` is believed on calls that carry it."""

GATEWAY_IDENTITY = "gateway"
"""The internal gateway's identity (spiffe://corral/service/gateway): it forwards workers' certificates."""


def forwarded_certificate(metadata: Iterable[tuple[str, str | bytes]]) -> bytes | None:
    """The client certificate (PEM) in an `x-forwarded-client-cert` header as Envoy sets it
    (`Cert="<url-encoded PEM>"` in its one element), or None if there is none."""
    values = [v for k, v in metadata if k == "x-forwarded-client-cert"]
    if len(values) != 1 or not isinstance(values[0], str):
        return None
    element = values[0]
    if "," in element.replace("%2C", ""):  # more than one element: not what SANITIZE_SET sends
        return None
    for pair in element.split(";"):
        key, _, value = pair.partition("=")
        if key.strip() == "Cert":
            return urllib.parse.unquote(value.strip().strip('"')).encode()
    return None


def _spiffe_uris(pem: bytes) -> list[str]:
    try:
        names = x509.load_pem_x509_certificate(pem).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (ValueError, x509.ExtensionNotFound) as e:
        raise Unauthenticated(f"the forwarded client certificate is unreadable: {e}") from None
    return [u for u in names.value.get_values_for_type(x509.UniformResourceIdentifier)
            if u.startswith("spiffe://corral/")]


def bearer_token(context: grpc.aio.ServicerContext) -> str | None:
    """The token of an `authorization: Bearer <token>` metadata entry."""
    for key, value in context.invocation_metadata() or ():
        if key == "authorization" and isinstance(value, str) and value.lower().startswith("bearer "):
            return value[7:].strip()
    return None


@dataclasses.dataclass(frozen=True)
class TokenAnswer:
    """What the auth service says of a valid bearer token."""

    principal: Principal
    """Its owner."""
    expires_at_ms: int
    """When the token stops being accepted (wall clock, ms since the epoch)."""
    cache_s: float | None = None
    """How long the answer may be reused, as the auth service allows; None: no limit of its own."""


@dataclasses.dataclass(frozen=True)
class _Cached:
    principal: Principal
    since_s: float
    until_s: float


class BearerAuthenticator:
    """Authenticates people by bearer token, with a short cache of answers.

    `verify` resolves a token to its owner and expiry (None if unknown,
    expired or revoked). A valid answer is reused until the earliest of
    `cache_s` and the verifier's own cache time from now, and the token's
    expiry: so every call does not cost a round trip to the auth service, an
    expired token is refused at once, and a revoked token (or a deactivated
    user's) keeps working for at most that cache time. Answers are kept by
    the token's SHA-256, never the token itself.

    No token authenticates a 'service' (see the module docstring): an answer
    claiming one is refused.

    A server stream outlives any one check: the request interceptor asks
    `recheck` again whenever the answer it got may no longer be reused, and
    ends the stream when the token is refused (services.common.server), so
    the bound holds for streams too.
    """

    def __init__(
        self,
        verify: Callable[[str], Awaitable[TokenAnswer | None]],
        anonymous_methods: frozenset[str] = frozenset(),
        cache_s: float = 5.0,
        clock_s: Callable[[], float] = time.time,
    ):
        self._verify = verify
        self._anonymous = anonymous_methods
        self._cache_s = cache_s
        self._clock_s = clock_s  # a wall clock: token expiries are wall-clock times
        self._cache: dict[bytes, _Cached] = {}

    async def __call__(self, context: grpc.aio.ServicerContext, method: str) -> Principal | None:
        token = bearer_token(context)
        if token is None:
            if method in self._anonymous:
                return None
            raise Unauthenticated("missing bearer token (log in with `corral login`)")
        return await self._principal(token)

    async def recheck(self, context: grpc.aio.ServicerContext) -> float:
        """Check the call's token again (raises Unauthenticated once it is refused); returns the
        seconds until this answer may no longer be reused, when the next check must ask auth."""
        token = bearer_token(context)
        if token is None:
            return math.inf  # an anonymous call has nothing to lose
        await self._principal(token)
        cached = self._cache.get(hashlib.sha256(token.encode()).digest())
        return 0.0 if cached is None else max(0.0, cached.until_s - self._clock_s())

    async def _principal(self, token: str) -> Principal:
        key = hashlib.sha256(token.encode()).digest()
        now_s = self._clock_s()
        cached = self._cache.get(key)
        # A clock that went back does not stretch an answer: since_s <= now_s.
        if cached is not None and cached.since_s <= now_s < cached.until_s:
            return cached.principal
        answer = await self._verify(token)
        if answer is None or answer.expires_at_ms <= now_s * 1000:
            self._cache.pop(key, None)
            raise Unauthenticated("invalid, expired or revoked token")
        principal = answer.principal
        if principal.kind == "service":
            raise Unauthenticated("a bearer token cannot authenticate a corral service")
        reuse_s = min(self._cache_s, math.inf if answer.cache_s is None else answer.cache_s)
        if len(self._cache) > 10_000:
            self._cache.clear()
        self._cache[key] = _Cached(principal, now_s, min(now_s + reuse_s, answer.expires_at_ms / 1000))
        return principal
