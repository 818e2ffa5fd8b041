"""The limit of every field a caller controls in AuthService's requests.

As for the frontend (services/frontend/field_limits.py): a string that is
stored, or looked up, is held to its column's size, and the tests compare
each limit with the migrated schema. The request interceptor checks them
before the servicer runs, so an oversized display name is INVALID_ARGUMENT
naming the field, never a DataError.
"""

from __future__ import annotations

from services.auth.servicer import MAX_PAGE_SIZE, MAX_USERNAME_CHARS
from services.common.fields import FieldLimits, Integer, Repeated, Text, Unchecked

AUTH = "corral.auth.v1."
MAX_PASSWORD_CHARS = 1024
"""Passwords are hashed, never stored; this only bounds the hashing's input."""
MAX_SECRET_CHARS = 256
"""A token's secret is about 60 characters; it is hashed, never stored."""

_username = Text(100, column="users.username")
"""A name to look up; a new user's name follows the stricter rule of CreateUser (64)."""

AUTH_FIELD_LIMITS: FieldLimits = {
    # The login throttle's own bound (services/auth/servicer.py): no user's name is longer.
    f"{AUTH}LoginRequest.username": Text(MAX_USERNAME_CHARS, column="users.username"),
    f"{AUTH}LoginRequest.password": Text(MAX_PASSWORD_CHARS),
    f"{AUTH}CreateUserRequest.username": Text(64, column="users.username"),
    f"{AUTH}CreateUserRequest.roles": Repeated(16),
    f"{AUTH}CreateUserRequest.display_name": Text(255, column="users.display_name"),
    f"{AUTH}CreateUserRequest.email": Text(255, column="users.email"),
    f"{AUTH}CreateUserRequest.password": Text(MAX_PASSWORD_CHARS),
    f"{AUTH}GetUserRequest.username": _username,
    f"{AUTH}ListUsersRequest.page_size": Integer(0, MAX_PAGE_SIZE, by_servicer=True),
    f"{AUTH}ListUsersRequest.page_token": Text(256),
    f"{AUTH}DeactivateUserRequest.username": _username,
    f"{AUTH}CreateTokenRequest.name": Text(255, column="tokens.name"),
    f"{AUTH}CreateTokenRequest.ttl": Unchecked("AuthService refuses one that is not positive or over a year"),
    f"{AUTH}CreateTokenRequest.username": _username,
    f"{AUTH}ListTokensRequest.username": _username,
    f"{AUTH}ListTokensRequest.page_size": Integer(0, MAX_PAGE_SIZE, by_servicer=True),
    f"{AUTH}ListTokensRequest.page_token": Text(256),
    f"{AUTH}RevokeTokenRequest.token_id": Text(16, column="tokens.token_id"),
    f"{AUTH}VerifyTokenRequest.token": Text(MAX_SECRET_CHARS),
}
