"""Users and tokens in the database, with passwords and secrets hashed."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import pymysql

from services.db.database import Database
from services.db.store import wall_clock_ms

T = TypeVar("T")
ROLES = ("user", "developer", "admin")
DAY_MS = 24 * 3600 * 1000
DEFAULT_TOKEN_TTL_MS = 30 * DAY_MS
# scrypt parameters: ~16 MiB and tens of milliseconds per login on one core.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1


def hash_password(password: str) -> str:
    """scrypt with a random salt, in a self-describing string."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P)
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${salt.hex()}${digest.hex()}"


def check_password(password: str, stored: str | None) -> bool:
    """Constant-time comparison against a hash_password string."""
    if not stored:
        return False
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p))
    return hmac.compare_digest(candidate.hex(), digest)


@functools.cache
def dummy_password_hash() -> str:
    """A hash of a random password nobody knows, with the parameters of real ones: a login
    for a user who cannot log in (unknown, deactivated, a service identity without a
    password) checks against it, so it costs what a wrong password costs."""
    return hash_password(secrets.token_urlsafe(32))


def _sha256(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class User:
    """A row of `users`."""

    username: str
    kind: str
    roles: frozenset[str]
    state: str
    display_name: str
    email: str
    created_at_ms: int
    deactivated_at_ms: int | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> User:
        roles = row["roles"]
        return cls(
            username=row["username"], kind=row["kind"],
            roles=frozenset(roles if isinstance(roles, set) else filter(None, str(roles).split(","))),
            state=row["state"], display_name=row["display_name"], email=row["email"],
            created_at_ms=row["time_created_ms"], deactivated_at_ms=row["time_deactivated_ms"],
        )


@dataclasses.dataclass(frozen=True)
class Token:
    """A row of `tokens` (never the secret)."""

    token_id: str
    username: str
    kind: str
    name: str
    created_at_ms: int
    expires_at_ms: int
    revoked_at_ms: int | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Token:
        return cls(row["token_id"], row["username"], row["kind"], row["name"], row["time_created_ms"],
                   row["time_expires_ms"], row["time_revoked_ms"])

    def valid_at(self, now_ms: int) -> bool:
        return self.revoked_at_ms is None and self.expires_at_ms > now_ms


class UserExists(Exception):
    """create_user with a taken username."""


class AuthStore:
    """What the auth service reads and writes."""

    def __init__(self, db: Database, clock_ms: Callable[[], int] = wall_clock_ms, concurrent_hashes: int = 2):
        self.db = db
        self.clock_ms = clock_ms
        # scrypt takes ~16 MiB and tens of ms of a core: run it off the event loop, a few at a time.
        self._hashing = asyncio.Semaphore(concurrent_hashes)

    async def _off_loop(self, work: Callable[[], T]) -> T:
        async with self._hashing:
            return await asyncio.to_thread(work)

    async def create_user(
        self, username: str, kind: str = "person", roles: frozenset[str] = frozenset({"user"}),
        password: str | None = None, display_name: str = "", email: str = "",
    ) -> User:
        """Insert a user; raises UserExists for a taken name."""
        try:
            await self.db.execute(
                """INSERT INTO users (username, kind, roles, display_name, email, password_hash, time_created_ms)
                   VALUES (%s, %s, %s, %s, %s, %s, %s)""",
                (username, kind, ",".join(sorted(roles)), display_name, email,
                 await self._off_loop(lambda: hash_password(password)) if password else None, self.clock_ms()),
                name="create_user",
            )
        except pymysql.err.IntegrityError as e:
            raise UserExists(username) from e
        user = await self.get_user(username)
        assert user is not None
        return user

    async def get_user(self, username: str) -> User | None:
        row = await self.db.fetchone("SELECT * FROM users WHERE username = %s", (username,), name="get_user")
        return User.from_row(row) if row else None

    async def list_users(self, state: str | None, after: str, limit: int) -> list[User]:
        rows = await self.db.fetchall(
            """SELECT * FROM users WHERE username > %s AND (%s IS NULL OR state = %s)
               ORDER BY username LIMIT %s""",
            (after, state, state, limit), name="list_users",
        )
        return [User.from_row(r) for r in rows]

    async def deactivate_user(self, username: str) -> None:
        """Deactivate and revoke every token of the user."""
        now = self.clock_ms()
        await self.db.execute(
            "UPDATE users SET state = 'deactivated', time_deactivated_ms = COALESCE(time_deactivated_ms, %s) "
            "WHERE username = %s", (now, username), name="deactivate_user")
        await self.db.execute(
            "UPDATE tokens SET time_revoked_ms = %s WHERE username = %s AND time_revoked_ms IS NULL",
            (now, username), name="revoke_user_tokens")

    async def check_login(self, username: str, password: str) -> User | None:
        """The user if the password is theirs and they may log in. Every refusal costs one
        password check, against the user's hash or the dummy, so the time taken does not
        tell an unknown or deactivated username from a wrong password."""
        row = await self.db.fetchone("SELECT * FROM users WHERE username = %s", (username,), name="login")
        stored = row["password_hash"] if row is not None and row["state"] == "active" else None
        right = await self._off_loop(lambda: check_password(password, stored or dummy_password_hash()))
        if row is None or not stored or not right:
            return None
        return User.from_row(row)

    async def create_token(self, username: str, kind: str, name: str = "", ttl_ms: int = DEFAULT_TOKEN_TTL_MS
                           ) -> tuple[Token, str]:
        """A new token and its secret (returned only here, stored hashed)."""
        token_id = secrets.token_hex(8)
        secret = f"{token_id}.{secrets.token_urlsafe(32)}"
        now = self.clock_ms()
        await self.db.execute(
            """INSERT INTO tokens (token_id, secret_sha256, username, kind, name, time_created_ms, time_expires_ms)
               VALUES (%s, %s, %s, %s, %s, %s, %s)""",
            (token_id, _sha256(secret), username, kind, name, now, now + ttl_ms), name="create_token",
        )
        return Token(token_id, username, kind, name, now, now + ttl_ms, None), secret

    async def verify(self, secret: str) -> tuple[User, Token] | None:
        """The active user and valid token behind a secret, or None."""
        row = await self.db.fetchone(
            """SELECT t.*, u.kind AS user_kind, u.roles, u.state, u.display_name, u.email,
                      u.time_created_ms AS user_created_ms, u.time_deactivated_ms
               FROM tokens t JOIN users u ON u.username = t.username WHERE t.secret_sha256 = %s""",
            (_sha256(secret),), name="verify_token",
        )
        if row is None:
            return None
        token = Token.from_row(row)
        user = User.from_row({**row, "kind": row["user_kind"], "time_created_ms": row["user_created_ms"]})
        if not token.valid_at(self.clock_ms()) or user.state != "active":
            return None
        return user, token

    async def get_token(self, token_id: str) -> Token | None:
        row = await self.db.fetchone("SELECT * FROM tokens WHERE token_id = %s", (token_id,), name="get_token")
        return Token.from_row(row) if row else None

    async def list_tokens(self, username: str, include_invalid: bool, after: str, limit: int) -> list[Token]:
        rows = await self.db.fetchall(
            """SELECT * FROM tokens WHERE username = %s AND token_id > %s
                 AND (%s OR (time_revoked_ms IS NULL AND time_expires_ms > %s))
               ORDER BY token_id LIMIT %s""",
            (username, after, include_invalid, self.clock_ms(), limit), name="list_tokens",
        )
        return [Token.from_row(r) for r in rows]

    async def revoke_token(self, token_id: str) -> None:
        await self.db.execute(
            "UPDATE tokens SET time_revoked_ms = COALESCE(time_revoked_ms, %s) WHERE token_id = %s",
            (self.clock_ms(), token_id), name="revoke_token")

    async def ensure_admin(self, username: str, password: str | None = None) -> tuple[User, str]:
        """Create the administrator if missing; return it with a fresh API token."""
        user = await self.get_user(username)
        if user is None:
            user = await self.create_user(username, roles=frozenset(ROLES), password=password,
                                          display_name="administrator")
        _, secret = await self.create_token(username, "api", name="corral up")
        return user, secret
