"""Sign-in and sign-out. Sign-in asks auth (with its throttling, counted by the browser's address) and sets
the session cookie to the token it gives; sign-out revokes the token at auth and clears the cookie."""

from __future__ import annotations

import datetime

from aiohttp import web

from corral.auth.v1 import auth_service_pb2 as apb
from corral.errors import InvalidArgument, ResourceExhausted, Unauthenticated
from services.web import sessions
from services.web.app import BACKEND, render, session_of

MAX_FIELD_CHARS = 1024


def _next_path(value: str | None) -> str:
    """Where to go after signing in: a path of this site only (never another site, `//host` included)."""
    if not value or len(value) > 2048 or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/batches"
    return value


def _source(request: web.Request) -> str | None:
    """The browser's address as the gateway saw it: the last x-forwarded-for entry, which the gateway
    appends (the web accepts connections from the gateway alone: mutual TLS)."""
    forwarded = request.headers.get("X-Forwarded-For")
    if forwarded:
        return forwarded.split(",")[-1].strip() or None
    return request.remote


def _login_page(request: web.Request, status: int = 200, error: str = "", username: str = "") -> web.Response:
    # The nonce already set is kept: a second sign-in page (another tab, a redirect the browser followed for
    # something else) must not make the first one's form stale.
    nonce = request.cookies.get(sessions.LOGIN_COOKIE) or ""
    if not sessions.well_formed_nonce(nonce):
        nonce = sessions.new_login_nonce()
    response = render(request, "login.html", status=status, title="Sign in to corral", error=error, username=username, nonce=nonce,
                      next=_next_path(request.query.get("next")))
    response.set_cookie(sessions.LOGIN_COOKIE, nonce, max_age=sessions.LOGIN_NONCE_TTL_S, path="/", secure=True,
                        httponly=True, samesite="Strict")
    return response


async def login_form(request: web.Request) -> web.Response:
    return _login_page(request)


async def login(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    username = str(form.get("username", ""))[:MAX_FIELD_CHARS]
    password = str(form.get("password", ""))[:MAX_FIELD_CHARS]
    if not sessions.login_nonce_matches(request.cookies.get(sessions.LOGIN_COOKIE), form.get("nonce")):  # type: ignore[arg-type]
        return _login_page(request, 403, "This sign-in form expired or came from another site: try again.", username)
    if not username or not password:
        return _login_page(request, 400, "Enter your username and password.", username)
    try:
        answer = await request.app[BACKEND].login(username, password, _source(request))
    except Unauthenticated:
        return _login_page(request, 401, "Wrong username or password.", username)
    except ResourceExhausted as e:
        return _login_page(request, 429, f"Too many sign-in attempts: {e.message}", username)
    except InvalidArgument as e:
        return _login_page(request, 400, e.message, username)
    expires = (answer.expires_at.ToDatetime(datetime.timezone.utc) if answer.HasField("expires_at") else None)
    response = web.HTTPSeeOther(_next_path(str(form.get("next", "")) or request.query.get("next")))
    response.set_cookie(sessions.SESSION_COOKIE, answer.token, **sessions.cookie_attributes(expires))  # type: ignore[arg-type]
    sessions.forget(response, sessions.LOGIN_COOKIE)
    return response


async def logout(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    backend = request.app[BACKEND]
    try:
        await session.calls.call(backend.users.Logout, apb.LogoutRequest())
    except Unauthenticated:
        pass  # already ended
    backend.forget(session.token)
    response = web.HTTPSeeOther("/login")
    sessions.forget(response, sessions.SESSION_COOKIE)
    return response


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/batches")


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", home)
    router.add_get("/login", login_form)
    router.add_post("/login", login)
    router.add_post("/logout", logout)
