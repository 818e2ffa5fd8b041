"""Sessions and CSRF: a session is the user's corral token in a cookie; nothing is kept on the server.

The cookie is `__Host-` prefixed (the browser then insists on Secure, Path=/ and no Domain), HttpOnly (no
script reads it), SameSite=Strict (no other site's page sends it), and expires with the token. Signing out
revokes the token at auth, so a copied cookie ends with it.

A form that changes something carries a CSRF token: an HMAC of a fixed label keyed by the session's token,
so every replica computes the same one without a shared secret, and no page of another origin can (it would
need the HttpOnly cookie). The sign-in form, before any session, carries a random nonce that must equal a
short-lived cookie of its own (a double submit), so another site cannot sign a browser into its account.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import secrets

SESSION_COOKIE = "__Host-corral-session"
LOGIN_COOKIE = "__Host-corral-login"
"""The sign-in form's nonce (a double submit): set with the form, checked with the post."""
CSRF_FIELD = "csrf"
"""The hidden field every state-changing form carries."""
LOGIN_NONCE_TTL_S = 3600
_CSRF_LABEL = b"corral web csrf v1"


def csrf_token(session_token: str) -> str:
    """The CSRF token of a session: the same on every replica, unguessable without the session's token."""
    digest = hmac.new(session_token.encode(), _CSRF_LABEL, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def csrf_matches(session_token: str, offered: str | None) -> bool:
    """Whether a form's CSRF field is its session's (compared in constant time)."""
    return bool(offered) and hmac.compare_digest(csrf_token(session_token).encode(), str(offered).encode())


def new_login_nonce() -> str:
    return secrets.token_urlsafe(24)


def well_formed_nonce(value: str) -> bool:
    """Whether a login cookie looks like a nonce this service made (32 URL-safe characters)."""
    return len(value) == 32 and all(c.isalnum() or c in "-_" for c in value)


def login_nonce_matches(cookie: str | None, offered: str | None) -> bool:
    return bool(cookie) and bool(offered) and hmac.compare_digest(str(cookie).encode(), str(offered).encode())


def forget(response: object, name: str) -> None:
    """Remove a cookie from the browser: with the attributes it was set with, without which a browser keeps
    a `__Host-` cookie (it refuses any Set-Cookie of that name that is not Secure)."""
    response.del_cookie(name, path="/", secure=True, httponly=True, samesite="Strict")  # type: ignore[attr-defined]


def cookie_attributes(expires_at: datetime.datetime | None) -> dict[str, object]:
    """aiohttp's set_cookie arguments for a session cookie that ends when its token does."""
    attributes: dict[str, object] = {"path": "/", "secure": True, "httponly": True, "samesite": "Strict"}
    if expires_at is not None:
        remaining = (expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
        attributes["max_age"] = max(0, int(remaining))
        attributes["expires"] = expires_at.strftime("%a, %d %b %Y %H:%M:%S GMT")
    return attributes
