"""The web UI's aiohttp application: security headers on every response, the session and CSRF checks, the
error pages, the static files (with their integrity hashes) and every route (`make_app`); `serve` runs it
over TLS behind the gateway until SIGTERM.

Every response gets a strict Content-Security-Policy: scripts, styles, images and connections from this
origin only, no inline script or style, no frames, forms posting only here. HTML is never cached (it shows a
user's data); static files are named by their content's hash and cached for a year.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import logging
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import jinja2
from aiohttp import web
from prometheus_client import Histogram
from yarl import URL

from corral.errors import (CorralError, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied,
                           ResourceExhausted, Unauthenticated, Unavailable)
from services.common.server import write_ports_file
from services.common.tls import TlsFiles
from services.web import sessions, views
from services.web.backend import Backend, UserCalls, Who

log = logging.getLogger("corral.web")
HERE = Path(__file__).parent
STATIC = HERE / "static"

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                           "connect-src 'self'; font-src 'self'; object-src 'self'; frame-ancestors 'none'; "
                           "base-uri 'none'; form-action 'self'")
"""No inline script or style anywhere: the pages' SVG uses classes, their behaviour is static/corral.js.
`object-src 'self'` lets a page embed its own SVG drawings; nothing else is embedded."""
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Strict-Transport-Security": "max-age=31536000",
}
PAGE_SECONDS = Histogram("corral_web_request_duration_seconds", "How long the web UI took to answer each request "
                         "(a stream: to begin), by route and HTTP status", ["route", "status"])
PUBLIC_PATHS = ("/login", "/static/", "/healthz", "/favicon.ico")
"""What answers without a session."""
MAX_FORM_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class WebConfig:
    """How `python -m services.web` runs."""

    address: str
    """Where it listens (HOST:PORT; port 0: a free one, written to `ports_file`)."""
    frontend_address: str
    """The frontend's public (TLS, bearer token) listener."""
    auth_address: str
    """Auth's public listener: sign-in, sign-out, who the token is."""
    certs_dir: Path | None
    """Its own certificate (identity `web`) and the deployment CA; it serves TLS and asks callers for a
    certificate of the CA (the gateway's). None: plain HTTP, for tests that reach it directly (`ca_cert` then
    says what to trust)."""
    ca_cert: Path | None = None
    """The CA that signed the frontend's and auth's certificates, when `certs_dir` is None."""
    ports_file: Path | None = None
    login_source_token_file: Path | None = None
    """The secret with which auth believes the browser's address on a sign-in (the gateway's, which it also
    holds); None: sign-ins count against this service's own address."""


@dataclasses.dataclass
class Session:
    """The signed-in user of one request."""

    token: str
    who: Who
    calls: UserCalls

    @property
    def csrf(self) -> str:
        return sessions.csrf_token(self.token)


BACKEND = web.AppKey("backend", Backend)
TEMPLATES = web.AppKey("templates", jinja2.Environment)


class Assets:
    """The static files, each with its content's hash: a URL that changes with the content (cached for a
    year) and a Subresource Integrity value for its tag."""

    def __init__(self, directory: Path):
        self.hashes: dict[str, bytes] = {p.name: hashlib.sha384(p.read_bytes()).digest()
                                         for p in sorted(directory.iterdir()) if p.is_file()}

    def url(self, name: str) -> str:
        return f"/static/{name}?v={self.hashes[name][:6].hex()}"

    def integrity(self, name: str) -> str:
        return "sha384-" + base64.b64encode(self.hashes[name]).decode()


SESSION = web.RequestKey("session", Session)


def render(request: web.Request, template: str, status: int = 200, **values: object) -> web.Response:
    """A page of `template`, with the session (if any) and the navigation."""
    session: Session | None = request.get(SESSION)
    text = request.app[TEMPLATES].get_template(template).render(
        who=session.who if session else None, csrf=session.csrf if session else "", path=request.path, **values)
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


def path_id(request: web.Request, name: str) -> int:
    """A positive id from the path (`/batches/{batch_id}`), or 404."""
    try:
        value = int(request.match_info[name])
    except ValueError:
        raise web.HTTPNotFound() from None
    if not 0 < value < 2**63:
        raise web.HTTPNotFound()
    return value


def session_of(request: web.Request) -> Session:
    session = request.get(SESSION)
    assert session is not None, "a page that needs a session is behind the session middleware"
    return session


@web.middleware
async def security_headers(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    """The security headers on every response, and `Server-Timing: app;dur=MS`: how long the page took here
    (bench web reads it; a stream's says how long it took to begin)."""
    began = time.perf_counter()
    try:
        response = await handler(request)
    except web.HTTPException as e:
        response = e
    took_s = time.perf_counter() - began
    resource = request.match_info.route.resource
    PAGE_SECONDS.labels(resource.canonical if resource is not None else "(none)", str(response.status)).observe(took_s)
    if not response.prepared:
        response.headers["Server-Timing"] = f"app;dur={took_s * 1000:.1f}"
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    if not request.path.startswith("/static/"):
        response.headers.setdefault("Cache-Control", "no-store")
    if isinstance(response, web.HTTPException):
        raise response
    return response


GATEWAY_IDENTITY = "spiffe://corral/service/gateway"
"""The only caller the web answers when it serves TLS: the public gateway's certificate."""


@web.middleware
async def gateway_only(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    """Refuse a caller whose certificate is not the gateway's (the CA also signs the services' and the workers'
    certificates): then `X-Forwarded-For` is the gateway's word."""
    transport = request.transport
    certificate = transport.get_extra_info("peercert") if transport is not None else None
    uris = [value for kind, value in (certificate or {}).get("subjectAltName", ()) if kind == "URI"]
    if GATEWAY_IDENTITY not in uris:
        raise web.HTTPForbidden(text="the web UI answers the gateway alone")
    return await handler(request)


def _login_redirect(request: web.Request) -> web.HTTPFound:
    target = request.rel_url.path_qs if request.method == "GET" else "/"
    response = web.HTTPFound(URL("/login").with_query(next=target))
    sessions.forget(response, sessions.SESSION_COOKIE)
    return response


@web.middleware
async def session_and_csrf(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                           ) -> web.StreamResponse:
    """Load the session (or send to the sign-in page), and refuse a state-changing request without its CSRF
    token or from another origin."""
    if request.method not in ("GET", "HEAD") and not _same_origin(request):
        raise web.HTTPForbidden(text="refused: the request came from another site")
    if request.path.startswith(PUBLIC_PATHS):
        return await handler(request)
    token = request.cookies.get(sessions.SESSION_COOKIE)
    if not token:
        raise _login_redirect(request)
    backend = request.app[BACKEND]
    try:
        who = await backend.who(token)
    except Unauthenticated:
        backend.forget(token)
        raise _login_redirect(request) from None
    request[SESSION] = Session(token, who, backend.as_user(token))
    if request.method not in ("GET", "HEAD"):
        form = await request.post()
        if not sessions.csrf_matches(token, form.get(sessions.CSRF_FIELD)):  # type: ignore[arg-type]
            return render(request, "error.html", status=403, title="Refused",
                          message="This form was refused: its security token is missing or belongs to another "
                                  "session. Reload the page and try again.")
    return await handler(request)


def _same_origin(request: web.Request) -> bool:
    """Whether a non-GET request's Origin (when the browser sends one) is this site."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    host = request.headers.get("X-Forwarded-Host") or request.host
    return origin in (f"https://{host}", f"http://{host}")


@web.middleware
async def error_pages(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                      ) -> web.StreamResponse:
    """corral's errors as pages: the status the web uses for each, with the server's words."""
    try:
        return await handler(request)
    except Unauthenticated:
        raise _login_redirect(request) from None
    except NotFound as e:
        return render(request, "error.html", status=404, title="Not found", message=_words(e))
    except PermissionDenied as e:
        return render(request, "error.html", status=403, title="Not allowed", message=_words(e))
    except (InvalidArgument, FailedPrecondition) as e:
        return render(request, "error.html", status=400, title="Refused", message=_words(e))
    except ResourceExhausted as e:
        return render(request, "error.html", status=429, title="Too many requests", message=_words(e))
    except Unavailable as e:
        return render(request, "error.html", status=503, title="corral is unavailable", message=_words(e))
    except CorralError as e:
        log.warning("%s %s: %s", request.method, request.path, e)
        return render(request, "error.html", status=502, title="Something went wrong", message=_words(e))


def _words(error: CorralError) -> str:
    return str(error)  # the message, then each field violation


def templates(assets: Assets) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(asset=assets.url, integrity=assets.integrity, csrf_field=sessions.CSRF_FIELD)
    env.filters.update(views.FILTERS)
    return env


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def favicon(request: web.Request) -> web.Response:
    """The icon browsers ask for by name (the pages name static/favicon.svg)."""
    raise web.HTTPFound(request.app[TEMPLATES].globals["asset"]("favicon.svg"))  # type: ignore[operator]


def make_app(backend: Backend, behind_gateway: bool = False) -> web.Application:
    """The application: middlewares, static files, every page's route; `behind_gateway`: only the gateway's
    certificate is answered (the TLS listener asks every caller for one)."""
    from services.web import graphs, live, pages  # they use render() and the keys, defined above

    first = [gateway_only] if behind_gateway else []
    app = web.Application(middlewares=[*first, security_headers, error_pages, session_and_csrf],
                          client_max_size=MAX_FORM_BYTES)
    assets = Assets(STATIC)
    app[BACKEND] = backend
    app[TEMPLATES] = templates(assets)
    app[graphs.DRAWINGS] = graphs.Drawings()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_static("/static/", STATIC, append_version=False, follow_symlinks=False)
    pages.add_routes(app.router)
    graphs.add_routes(app.router)
    live.add_routes(app.router)
    app.on_response_prepare.append(_static_cache)
    return app


async def _static_cache(request: web.Request, response: web.StreamResponse) -> None:
    if request.path.startswith("/static/"):
        response.headers["Cache-Control"] = "public, max-age=31536000, immutable"


def server_ssl(certs_dir: Path) -> ssl.SSLContext:
    """TLS with its own certificate; callers must show a certificate of the deployment CA (the gateway)."""
    files = TlsFiles.of(certs_dir, "web")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(files.ca_cert))
    context.load_cert_chain(str(files.cert), str(files.key))
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


async def serve(config: WebConfig) -> None:
    """Serve until SIGTERM or SIGINT."""
    ca_cert = config.certs_dir / "ca.pem" if config.certs_dir is not None else config.ca_cert
    if ca_cert is None:
        raise ValueError("the web needs the deployment CA: --certs-dir or --ca-cert")
    token = config.login_source_token_file.read_text().strip() if config.login_source_token_file else None
    backend = Backend(config.frontend_address, config.auth_address, ca_cert, token)
    runner = web.AppRunner(make_app(backend, behind_gateway=config.certs_dir is not None), access_log=None, handle_signals=False, shutdown_timeout=5.0)
    await runner.setup()
    host, _, port = config.address.rpartition(":")
    site = web.TCPSite(runner, host, int(port), ssl_context=server_ssl(config.certs_dir) if config.certs_dir
                       else None)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    log.info("web UI on %s:%d", host, bound)
    if config.ports_file is not None:
        write_ports_file(config.ports_file, {"web": bound})
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await runner.cleanup()
    await backend.close()
