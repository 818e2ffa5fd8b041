"""AuthService: translates protos to AuthStore calls and enforces roles."""

from __future__ import annotations

import base64
import hmac
import re
from collections.abc import Iterable

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from corral.auth.v1 import auth_service_pb2 as pb
from corral.auth.v1 import auth_service_pb2_grpc, token_pb2, user_pb2
from services.auth.login_limits import LoginThrottle, source_of
from services.auth.store import DEFAULT_TOKEN_TTL_MS, AuthStore, Token, User, UserExists
from services.common.errors import (
    AlreadyExists,
    FieldViolation,
    InvalidRequest,
    NotFound,
    RateLimited,
    Unauthenticated,
)
from services.common.identity import GATEWAY_TOKEN_HEADER, Principal, TokenAnswer, current_principal

_USERNAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_ROLE_NAMES = {user_pb2.ROLE_USER: "user", user_pb2.ROLE_DEVELOPER: "developer", user_pb2.ROLE_ADMIN: "admin"}
_ROLE_ENUMS = {v: k for k, v in _ROLE_NAMES.items()}
_KINDS = {user_pb2.USER_KIND_PERSON: "person", user_pb2.USER_KIND_SERVICE: "service"}
MAX_PAGE_SIZE = 1000
MAX_USERNAME_CHARS = 64
MAX_PASSWORD_CHARS = 1024
"""Longer passwords are refused before hashing: they would only cost the server time."""
CACHE_TTL_S = 5.0
"""Default of how long other services may reuse a VerifyToken answer (AuthConfig.token_cache_ttl_s):
the longest a revoked token, or a deactivated user's, keeps working there."""

ANONYMOUS_METHODS = frozenset({"/corral.auth.v1.AuthService/Login"})
"""Methods a caller may use without a token."""


def _timestamp(ms: int | None) -> timestamp_pb2.Timestamp | None:
    if ms is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromMilliseconds(ms)
    return ts


def _duration(seconds: float) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromNanoseconds(round(seconds * 1e9))
    return duration


def user_proto(user: User) -> user_pb2.User:
    return user_pb2.User(
        username=user.username,
        kind=user_pb2.USER_KIND_SERVICE if user.kind == "service" else user_pb2.USER_KIND_PERSON,
        roles=sorted(_ROLE_ENUMS[r] for r in user.roles),
        state=user_pb2.USER_STATE_ACTIVE if user.state == "active" else user_pb2.USER_STATE_DEACTIVATED,
        display_name=user.display_name, email=user.email,
        created_at=_timestamp(user.created_at_ms), deactivated_at=_timestamp(user.deactivated_at_ms),
    )


def token_proto(token: Token) -> token_pb2.Token:
    return token_pb2.Token(
        token_id=token.token_id, username=token.username, name=token.name,
        kind=token_pb2.TOKEN_KIND_SESSION if token.kind == "session" else token_pb2.TOKEN_KIND_API,
        created_at=_timestamp(token.created_at_ms), expires_at=_timestamp(token.expires_at_ms),
        revoked_at=_timestamp(token.revoked_at_ms),
    )


def principal_of(user: User, token: Token) -> Principal:
    """The caller behind a token: a person, or a service identity acting as a service account
    (never a corral service, see services.common.identity)."""
    kind = "service_account" if user.kind == "service" else "person"
    return Principal(user.username, kind, user.roles, token.token_id)


def _page(page_size: int, page_token: str) -> tuple[int, str]:
    if page_size < 0 or page_size > MAX_PAGE_SIZE:
        raise InvalidRequest(FieldViolation("page_size", f"must be between 0 and {MAX_PAGE_SIZE}"))
    try:
        after = base64.urlsafe_b64decode(page_token.encode()).decode() if page_token else ""
    except (ValueError, UnicodeDecodeError):
        raise InvalidRequest(FieldViolation("page_token", "not a token this service returned")) from None
    return page_size or 100, after


def _next_page(keys: list[str], limit: int) -> str:
    return base64.urlsafe_b64encode(keys[-1].encode()).decode() if len(keys) == limit else ""


class AuthServicer(auth_service_pb2_grpc.AuthServiceServicer):
    """Users, logins and tokens."""

    def __init__(self, store: AuthStore, throttle: LoginThrottle | None = None,
                 forwarded_for_header: str | None = None, cache_ttl_s: float = CACHE_TTL_S,
                 gateway_token: str | None = None):
        self.store = store
        self.cache_ttl_s = cache_ttl_s
        self.throttle = throttle or LoginThrottle()
        self._forwarded_for_header = forwarded_for_header.lower() if forwarded_for_header else None
        if gateway_token is not None and len(gateway_token) < 32:
            raise ValueError("the gateway token must be at least 32 characters")
        self._gateway_token = gateway_token.encode() if gateway_token else None

    async def verify_token(self, secret: str) -> TokenAnswer | None:
        """A token's owner and expiry, verified here: for this service's own public listener."""
        found = await self.store.verify(secret)
        if found is None:
            return None
        user, token = found
        return TokenAnswer(principal_of(user, token), token.expires_at_ms)

    def _source(self, context: grpc.aio.ServicerContext) -> str:
        """Where a login comes from: the peer, or the trusted gateway's forwarded-for header (on every call
        with --forwarded-for-header; on calls that carry the gateway's token with --gateway-token-file)."""
        metadata = context.invocation_metadata() or ()
        header = self._forwarded_for_header
        if self._gateway_token is not None and self._from_gateway(metadata):
            header = "x-forwarded-for"
        forwarded_for = None
        if header:
            forwarded_for = ",".join(str(v) for k, v in metadata if k == header)
        return source_of(context.peer() or "", forwarded_for)

    def _from_gateway(self, metadata: Iterable[tuple[str, str | bytes]]) -> bool:
        """Whether the call carries the gateway's token (compared in constant time)."""
        assert self._gateway_token is not None
        values = [v for k, v in metadata if k == GATEWAY_TOKEN_HEADER]
        return len(values) == 1 and isinstance(values[0], str) and hmac.compare_digest(
            values[0].encode(), self._gateway_token)

    async def Login(self, request: pb.LoginRequest, context: grpc.aio.ServicerContext) -> pb.LoginResponse:
        violations = []
        if len(request.username) > MAX_USERNAME_CHARS:
            violations.append(FieldViolation("username", f"at most {MAX_USERNAME_CHARS} characters"))
        if len(request.password) > MAX_PASSWORD_CHARS:
            violations.append(FieldViolation("password", f"at most {MAX_PASSWORD_CHARS} characters"))
        if violations:
            raise InvalidRequest(violations)
        source = self._source(context)
        refused = self.throttle.admit(request.username, source)
        if refused is not None:
            raise RateLimited(refused.message(), refused.retry_after_s)
        user = await self.store.check_login(request.username, request.password)
        if user is None:
            raise Unauthenticated("wrong username or password")
        self.throttle.succeeded(request.username, source)
        token, secret = await self.store.create_token(user.username, "session", name="login")
        return pb.LoginResponse(token=secret, expires_at=_timestamp(token.expires_at_ms), user=user_proto(user))

    async def Logout(self, request: pb.LogoutRequest, context: grpc.aio.ServicerContext) -> pb.LogoutResponse:
        principal = current_principal()
        if principal.token_id:
            await self.store.revoke_token(principal.token_id)
        return pb.LogoutResponse()

    async def WhoAmI(self, request: pb.WhoAmIRequest, context: grpc.aio.ServicerContext) -> pb.WhoAmIResponse:
        principal = current_principal()
        user = await self.store.get_user(principal.name)
        if user is None:
            raise NotFound(f"no user {principal.name}")
        token = await self.store.get_token(principal.token_id) if principal.token_id else None
        return pb.WhoAmIResponse(user=user_proto(user), token=token_proto(token) if token else None)

    async def CreateUser(self, request: pb.CreateUserRequest, context: grpc.aio.ServicerContext
                         ) -> pb.CreateUserResponse:
        current_principal().require_admin()
        violations = []
        if not _USERNAME.match(request.username):
            violations.append(FieldViolation("username", "lower-case letters, digits, '_', '.', '-'; 1-64 long"))
        if any(r not in _ROLE_NAMES for r in request.roles):
            violations.append(FieldViolation("roles", "unknown role"))
        if request.kind != user_pb2.USER_KIND_SERVICE and request.password and len(request.password) < 8:
            violations.append(FieldViolation("password", "at least 8 characters"))
        if violations:
            raise InvalidRequest(violations)
        roles = frozenset(_ROLE_NAMES[r] for r in request.roles) or frozenset({"user"})
        try:
            user = await self.store.create_user(
                request.username, _KINDS.get(request.kind, "person"), roles, request.password or None,
                request.display_name, request.email)
        except UserExists:
            raise AlreadyExists(f"user {request.username} exists") from None
        return pb.CreateUserResponse(user=user_proto(user))

    async def GetUser(self, request: pb.GetUserRequest, context: grpc.aio.ServicerContext) -> pb.GetUserResponse:
        principal = current_principal()
        if principal.name != request.username:
            principal.require_admin()
        user = await self.store.get_user(request.username)
        if user is None:
            raise NotFound(f"no user {request.username}")
        return pb.GetUserResponse(user=user_proto(user))

    async def ListUsers(self, request: pb.ListUsersRequest, context: grpc.aio.ServicerContext
                        ) -> pb.ListUsersResponse:
        current_principal().require_admin()
        limit, after = _page(request.page_size, request.page_token)
        state = {user_pb2.USER_STATE_ACTIVE: "active", user_pb2.USER_STATE_DEACTIVATED: "deactivated"}.get(
            request.state)
        users = await self.store.list_users(state, after, limit)
        return pb.ListUsersResponse(users=[user_proto(u) for u in users],
                                    next_page_token=_next_page([u.username for u in users], limit))

    async def DeactivateUser(self, request: pb.DeactivateUserRequest, context: grpc.aio.ServicerContext
                             ) -> pb.DeactivateUserResponse:
        current_principal().require_admin()
        if await self.store.get_user(request.username) is None:
            raise NotFound(f"no user {request.username}")
        await self.store.deactivate_user(request.username)
        user = await self.store.get_user(request.username)
        assert user is not None
        return pb.DeactivateUserResponse(user=user_proto(user))

    async def CreateToken(self, request: pb.CreateTokenRequest, context: grpc.aio.ServicerContext
                          ) -> pb.CreateTokenResponse:
        principal = current_principal()
        username = request.username or principal.name
        if username != principal.name:
            principal.require_admin()
        ttl_ms = request.ttl.ToMilliseconds() if request.HasField("ttl") else DEFAULT_TOKEN_TTL_MS
        if not 0 < ttl_ms <= 366 * 24 * 3600 * 1000:
            raise InvalidRequest(FieldViolation("ttl", "must be positive and at most a year"))
        if await self.store.get_user(username) is None:
            raise NotFound(f"no user {username}")
        token, secret = await self.store.create_token(username, "api", request.name, ttl_ms)
        return pb.CreateTokenResponse(token=token_proto(token), secret=secret)

    async def ListTokens(self, request: pb.ListTokensRequest, context: grpc.aio.ServicerContext
                         ) -> pb.ListTokensResponse:
        principal = current_principal()
        username = request.username or principal.name
        if username != principal.name:
            principal.require_admin()
        limit, after = _page(request.page_size, request.page_token)
        tokens = await self.store.list_tokens(username, request.include_invalid, after, limit)
        return pb.ListTokensResponse(tokens=[token_proto(t) for t in tokens],
                                     next_page_token=_next_page([t.token_id for t in tokens], limit))

    async def RevokeToken(self, request: pb.RevokeTokenRequest, context: grpc.aio.ServicerContext
                          ) -> pb.RevokeTokenResponse:
        principal = current_principal()
        token = await self.store.get_token(request.token_id)
        if token is None or (token.username != principal.name and not principal.is_admin):
            raise NotFound(f"no token {request.token_id}")
        await self.store.revoke_token(token.token_id)
        token = await self.store.get_token(token.token_id)
        assert token is not None
        return pb.RevokeTokenResponse(token=token_proto(token))

    async def VerifyToken(self, request: pb.VerifyTokenRequest, context: grpc.aio.ServicerContext
                          ) -> pb.VerifyTokenResponse:
        # Only corral services (mutual TLS, the internal listener) resolve other people's
        # tokens; a bearer token never makes a service principal (services.common.identity),
        # so on the public listener every caller is refused, a service identity's token too.
        # Nobody needs it there: clients learn about their own token with WhoAmI.
        current_principal().require_service()
        found = await self.store.verify(request.token)
        if found is None:
            raise Unauthenticated("invalid, expired or revoked token")
        user, token = found
        return pb.VerifyTokenResponse(
            user=user_proto(user), token_id=token.token_id, expires_at=_timestamp(token.expires_at_ms),
            cache_ttl=_duration(self.cache_ttl_s))

