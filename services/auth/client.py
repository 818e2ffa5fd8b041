"""How other services resolve a person's bearer token: VerifyToken over mTLS."""

from __future__ import annotations

import grpc

from corral.auth.v1 import auth_service_pb2 as pb
from corral.auth.v1 import auth_service_pb2_grpc, user_pb2
from services.common.errors import Unavailable
from services.common.identity import Principal, TokenAnswer

_ROLES = {user_pb2.ROLE_USER: "user", user_pb2.ROLE_DEVELOPER: "developer", user_pb2.ROLE_ADMIN: "admin"}


class RemoteTokenVerifier:
    """Calls the auth service's VerifyToken; use inside a BearerAuthenticator (which caches)."""

    def __init__(self, channel: grpc.aio.Channel, timeout_s: float = 5.0):
        self._stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        self._timeout_s = timeout_s

    async def __call__(self, token: str) -> TokenAnswer | None:
        try:
            response = await self._stub.VerifyToken(pb.VerifyTokenRequest(token=token), timeout=self._timeout_s)
        except grpc.aio.AioRpcError as e:
            if e.code() == grpc.StatusCode.UNAUTHENTICATED:
                return None
            # Not known to be valid: refused, as UNAVAILABLE (the caller may retry), never
            # INTERNAL, and never let through (the token may have been revoked meanwhile).
            raise Unavailable(f"the token cannot be verified now (the auth service: {e.code().name})") from None
        # A service-kind user's token is a service account, never a corral service.
        kind = "service_account" if response.user.kind == user_pb2.USER_KIND_SERVICE else "person"
        principal = Principal(response.user.username, kind, frozenset(_ROLES[r] for r in response.user.roles),
                              response.token_id)
        return TokenAnswer(principal, response.expires_at.ToMilliseconds(),
                           response.cache_ttl.ToNanoseconds() / 1e9 if response.HasField("cache_ttl") else None)
