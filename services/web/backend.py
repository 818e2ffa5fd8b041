"""The web UI's calls to corral: one TLS channel to the frontend and one to auth, shared by every request,
and each call made with the signed-in user's own bearer token (`UserCalls`), so that the frontend decides
what each user may see exactly as it does for the CLI. The web holds no token of its own.

Errors come back as corral's typed errors (corral.errors): the pages turn NotFound into 404,
PermissionDenied into 403, Unauthenticated into the sign-in page.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc, user_pb2
from corral.batch.v1 import (batch_service_pb2_grpc, fleet_service_pb2_grpc, image_service_pb2_grpc,
                             job_group_service_pb2_grpc)
from corral.batch.v1 import job_service_pb2_grpc
from corral.billing.v1 import billing_service_pb2_grpc
from corral.aio import rate_limit_wait_s
from corral.errors import from_rpc_error

T = TypeVar("T")
CALL_TIMEOUT_S = 30.0
"""The longest a page waits for one call (streams have none)."""
WHO_CACHE_S = 30.0
"""How long a token's user (WhoAmI: name and roles) is reused by this replica before auth is asked again."""
CALLS_AT_ONCE = 2
"""A user's calls in flight from this replica at once (the frontend's max_concurrent_reads_per_user): a page
that asks for several things, and the drawings it loads beside it, queue here rather than being refused."""
LOGIN_SOURCE_HEADER = "x-corral-gateway-token"
"""The header auth believes `x-forwarded-for` on (services.auth.servicer): with it, a sign-in through the
web counts against the browser's address, as one through the gateway does."""


@dataclasses.dataclass(frozen=True)
class Who:
    """The signed-in user."""

    username: str
    is_admin: bool
    expires_at: float
    """When the token ends (epoch seconds; 0: never)."""

    def expired(self) -> bool:
        return 0 < self.expires_at <= time.time()


def _channel(address: str, ca_cert: Path) -> grpc.aio.Channel:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_cert.read_bytes())
    # Round robin: a name with several frontends behind it (a headless Service) gets calls on each of them.
    return grpc.aio.secure_channel(address, credentials, options=[("grpc.max_receive_message_length", 64 << 20),
                                                                  ("grpc.lb_policy_name", "round_robin")])


class Backend:
    """The channels to the frontend and auth, opened once per process."""

    def __init__(self, frontend_address: str, auth_address: str, ca_cert: Path, login_source_token: str | None):
        self._frontend = _channel(frontend_address, ca_cert)
        self._auth = _channel(auth_address, ca_cert)
        self.login_source_token = login_source_token
        self.batches = batch_service_pb2_grpc.BatchServiceStub(self._frontend)
        self.jobs = job_service_pb2_grpc.JobServiceStub(self._frontend)
        self.groups = job_group_service_pb2_grpc.JobGroupServiceStub(self._frontend)
        self.billing = billing_service_pb2_grpc.BillingServiceStub(self._frontend)
        self.images = image_service_pb2_grpc.ImageServiceStub(self._frontend)
        self.users = auth_service_pb2_grpc.AuthServiceStub(self._auth)
        self.fleet = fleet_service_pb2_grpc.FleetServiceStub(self._frontend)
        self._who: dict[str, tuple[float, Who]] = {}
        self._turns: weakref.WeakValueDictionary[str, asyncio.Semaphore] = weakref.WeakValueDictionary()

    async def close(self) -> None:
        await self._frontend.close()
        await self._auth.close()

    def as_user(self, token: str) -> UserCalls:
        turns = self._turns.get(token)
        if turns is None:
            turns = self._turns[token] = asyncio.Semaphore(CALLS_AT_ONCE)
        return UserCalls(self, token, turns)

    async def login(self, username: str, password: str, source: str | None) -> apb.LoginResponse:
        """Sign in at auth; with `source` (the browser's address, as the gateway saw it) and the login-source
        token, auth throttles by that address."""
        metadata: tuple[tuple[str, str], ...] = ()
        if source and self.login_source_token:
            metadata = (("x-forwarded-for", source), (LOGIN_SOURCE_HEADER, self.login_source_token))
        try:
            return await self.users.Login(apb.LoginRequest(username=username, password=password),
                                          metadata=metadata, timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None

    async def who(self, token: str) -> Who:
        """The token's user, cached for WHO_CACHE_S (a revoked token is refused by every call regardless)."""
        now = time.monotonic()
        cached = self._who.get(token)
        if cached is not None and now - cached[0] < WHO_CACHE_S and not cached[1].expired():
            return cached[1]
        answer = await self.as_user(token).call(self.users.WhoAmI, apb.WhoAmIRequest())
        expires = answer.token.expires_at.ToSeconds() if answer.token.HasField("expires_at") else 0
        who = Who(answer.user.username, user_pb2.ROLE_ADMIN in answer.user.roles, expires)
        if len(self._who) > 10_000:
            self._who.clear()
        self._who[token] = (now, who)
        return who

    def forget(self, token: str) -> None:
        self._who.pop(token, None)


class UserCalls:
    """Calls made as one user: their token on every call."""

    def __init__(self, backend: Backend, token: str, turns: asyncio.Semaphore):
        self.backend = backend
        self.token = token
        self._metadata = (("authorization", f"Bearer {token}"),)
        self._turns = turns
        """Shared by every request of this token on this replica (CALLS_AT_ONCE)."""

    async def call(self, method: Callable[..., Awaitable[T]], request: Any, timeout_s: float = CALL_TIMEOUT_S) -> T:
        """One call, waiting for the user's turn; a refusal for the user's rate or count (RetryInfo) is sent
        again after the wait the server asks for, as the client library does."""
        retries = 0
        while True:
            async with self._turns:
                try:
                    return await method(request, metadata=self._metadata, timeout=timeout_s)
                except grpc.aio.AioRpcError as e:
                    wait_s = rate_limit_wait_s(e, retries)
                    if wait_s is None:
                        raise from_rpc_error(e) from None
            retries += 1
            await asyncio.sleep(wait_s)

    async def stream(self, method: Callable[..., Any], request: Any) -> AsyncIterator[Any]:
        """A server stream's responses; its errors as corral's typed errors."""
        call = method(request, metadata=self._metadata)
        try:
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()

    async def gather(self, *calls: Awaitable[Any]) -> list[Any]:
        """Several calls at once; the first error raised (the others cancelled)."""
        return list(await asyncio.gather(*calls))

