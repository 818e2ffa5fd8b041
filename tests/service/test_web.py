"""The web UI (services.web) over real HTTP on loopback, in front of a real auth and frontend: sign-in and
sign-out, the session cookie's flags, CSRF on every form, the Content-Security-Policy, and one tenant's
pages refused to another, whatever URL they guess. (The pages in a real browser: tests/web/.)"""

from __future__ import annotations

import re
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from aiohttp import web

from corral.auth.v1 import auth_service_pb2 as apb
from corral.auth.v1 import auth_service_pb2_grpc
from corral.batch.v1 import batch_service_pb2 as pb
from corral.batch.v1 import batch_service_pb2_grpc, job_spec_pb2
from services.auth.app import AuthApp, AuthConfig
from services.auth.app import start as start_auth
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendApp
from services.web import sessions
from services.web.app import CONTENT_SECURITY_POLICY, server_ssl, make_app
from services.web.backend import Backend
from tests.conftest import service_url
from tests.service.conftest import bearer, person_channel

PASSWORDS = {"alice": "alice-password-1", "bob": "bob-password-22", "root": "root-password-333"}


@pytest.fixture
async def people(auth_app: AuthApp, db: Database) -> dict[str, str]:
    """alice and bob (users, each with a project of their own) and root (an administrator), with passwords;
    their API tokens."""
    store = AuthStore(auth_app.db)
    tokens = {}
    for name in ("alice", "bob"):
        await store.create_user(name, password=PASSWORDS[name])
        tokens[name] = (await store.create_token(name, "api"))[1]
    tokens["root"] = (await store.ensure_admin("root", password=PASSWORDS["root"]))[1]
    await JobStore(db).create_billing_project("alice-lab", ["alice"])
    await JobStore(db).create_billing_project("bob-lab", ["bob"])
    return tokens


@pytest.fixture
async def site(auth_app: AuthApp, frontend: FrontendApp, certs: DevCertificateAuthority) -> AsyncIterator[str]:
    """The web on a free loopback port (plain HTTP: the gateway's TLS is tested in tests/web/), calling the
    real frontend and auth; its base URL."""
    backend = Backend(f"localhost:{frontend.public_port}", f"localhost:{auth_app.public_port}",
                      Path(certs.directory) / "ca.pem", None)
    runner = web.AppRunner(make_app(backend))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await backend.close()


class Browser:
    """A client that keeps the cookies the web sets (Secure ones too: the test speaks plain HTTP)."""

    def __init__(self, base: str):
        self.client = httpx.AsyncClient(base_url=base, follow_redirects=False, timeout=30)
        self.cookies: dict[str, str] = {}

    async def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        headers = dict(kwargs.pop("headers", {}) or {})  # type: ignore[arg-type]
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        response = await self.client.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        for header in response.headers.get_list("set-cookie"):
            name, _, rest = header.partition("=")
            value = rest.split(";", 1)[0]
            if value in ("", '""') or "Max-Age=0" in header:
                self.cookies.pop(name, None)
            else:
                self.cookies[name] = value
        return response

    async def get(self, path: str, **kwargs: object) -> httpx.Response:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, data: dict[str, str], **kwargs: object) -> httpx.Response:
        return await self.request("POST", path, data=data, **kwargs)

    async def sign_in(self, username: str) -> httpx.Response:
        form = await self.get("/login")
        nonce = re.search(r'name="nonce" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
        return await self.post("/login", {"username": username, "password": PASSWORDS[username], "nonce": nonce})

    async def csrf_of(self, path: str) -> str:
        page = await self.get(path)
        return re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]

    async def close(self) -> None:
        await self.client.aclose()


@pytest.fixture
async def browsers(site: str) -> AsyncIterator[dict[str, Browser]]:
    made = {name: Browser(site) for name in ("alice", "bob", "root", "nobody")}
    yield made
    for browser in made.values():
        await browser.close()


async def submit(frontend: FrontendApp, certs: DevCertificateAuthority, token: str, project: str,
                 n_jobs: int = 3) -> int:
    jobs = [job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                                 parents=[job_spec_pb2.ParentRef(in_update_offset=-1)] if i else [])
            for i in range(n_jobs)]
    async with person_channel(certs.issue("someone"), frontend.public_port) as channel:
        answer = await batch_service_pb2_grpc.BatchServiceStub(channel).SubmitBatch(
            pb.SubmitBatchRequest(billing_project=project, idempotency_token=f"{project}-{n_jobs}",
                                  attributes={"name": f"{project} batch"}, jobs=jobs), metadata=bearer(token))
    return answer.batch.batch_id


async def test_sign_in_sets_a_strict_session_cookie_and_sign_out_revokes_it(browsers, people, auth_app,
                                                                              certs) -> None:
    alice = browsers["alice"]
    first = await alice.get("/batches")
    assert first.status_code == 302 and first.headers["location"] == "/login?next=/batches"
    signed = await alice.sign_in("alice")
    assert signed.status_code == 303 and signed.headers["location"] == "/batches"
    cookie = next(h for h in signed.headers.get_list("set-cookie") if h.startswith(sessions.SESSION_COOKIE))
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "secure", "samesite", "path", "max-age", "expires"} <= flags
    assert "SameSite=Strict" in cookie and "Path=/" in cookie and "Domain" not in cookie
    max_age = int(re.search(r"Max-Age=(\d+)", cookie).group(1))  # type: ignore[union-attr]
    assert 0 < max_age <= 31 * 24 * 3600  # it ends with the token
    page = await alice.get("/batches")
    assert page.status_code == 200 and "Signed in as <strong>alice</strong>" in page.text
    token = alice.cookies[sessions.SESSION_COOKIE]

    out = await alice.post("/logout", {"csrf": await alice.csrf_of("/batches")})
    assert out.status_code == 303 and out.headers["location"] == "/login"
    assert sessions.SESSION_COOKIE not in alice.cookies
    async with person_channel(certs.issue("someone"), auth_app.public_port) as channel:
        with pytest.raises(Exception) as refused:
            await auth_service_pb2_grpc.AuthServiceStub(channel).WhoAmI(apb.WhoAmIRequest(), metadata=bearer(token))
    assert "UNAUTHENTICATED" in str(refused.value)
    # The old cookie, replayed, is a sign-in page, not a session.
    replay = await alice.get("/batches", headers={"Cookie": f"{sessions.SESSION_COOKIE}={token}"})
    assert replay.status_code == 302 and replay.headers["location"].startswith("/login")


async def test_wrong_password_and_a_forged_sign_in_form_are_refused(browsers, people) -> None:
    bob = browsers["bob"]
    form = await bob.get("/login")
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    wrong = await bob.post("/login", {"username": "bob", "password": "nope", "nonce": nonce})
    assert wrong.status_code == 401 and "Wrong username or password" in wrong.text
    forged = await bob.post("/login", {"username": "bob", "password": PASSWORDS["bob"], "nonce": "made-up"})
    assert forged.status_code == 403 and sessions.SESSION_COOKIE not in bob.cookies
    elsewhere = await bob.post("/login", {"username": "bob", "password": PASSWORDS["bob"], "nonce": nonce},
                               headers={"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403 and sessions.SESSION_COOKIE not in bob.cookies


async def test_sign_in_never_sends_the_browser_to_another_site(browsers, people) -> None:
    form = await browsers["alice"].get("/login?next=//evil.example/x")
    assert 'name="next" value="/batches"' in form.text
    nonce = re.search(r'name="nonce" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
    signed = await browsers["alice"].post("/login", {"username": "alice", "password": PASSWORDS["alice"],
                                                     "nonce": nonce, "next": "https://evil.example/"})
    assert signed.headers["location"] == "/batches"


async def test_every_form_needs_its_sessions_csrf_token(browsers, people, frontend, certs) -> None:
    batch_id = await submit(frontend, certs, people["alice"], "alice-lab")
    alice, bob = browsers["alice"], browsers["bob"]
    await alice.sign_in("alice")
    await bob.sign_in("bob")
    for data in ({}, {"csrf": "made-up"}, {"csrf": await bob.csrf_of("/batches")}):
        refused = await alice.post(f"/batches/{batch_id}/cancel", data)
        assert refused.status_code == 403 and "security token" in refused.text
    page = await alice.get(f"/batches/{batch_id}")
    assert "Cancelled" not in page.text
    other_site = await alice.post(f"/batches/{batch_id}/cancel", {"csrf": await alice.csrf_of("/batches")},
                                  headers={"Origin": "https://evil.example"})
    assert other_site.status_code == 403
    confirm = await alice.get(f"/batches/{batch_id}/cancel")
    assert confirm.status_code == 200 and "This cannot be undone" in confirm.text
    done = await alice.post(f"/batches/{batch_id}/cancel", {"csrf": await alice.csrf_of(f"/batches/{batch_id}")})
    assert done.status_code == 303 and done.headers["location"] == f"/batches/{batch_id}?done=cancelled"
    assert "Cancelled by alice" in (await alice.get(f"/batches/{batch_id}")).text


async def test_another_tenants_batch_is_not_found_whatever_url_is_guessed(browsers, people, frontend, certs) -> None:
    batch_id = await submit(frontend, certs, people["alice"], "alice-lab")
    bob = browsers["bob"]
    await bob.sign_in("bob")
    for path in (f"/batches/{batch_id}", f"/batches/{batch_id}/jobs/1", f"/batches/{batch_id}/jobs/1/log",
                 f"/batches/{batch_id}/dag.svg", f"/batches/{batch_id}/timeline.svg", f"/batches/{batch_id}/events",
                 f"/batches/{batch_id}/jobs/1/log/live", f"/batches/{batch_id}/cancel", f"/batches/{batch_id}/rerun"):
        page = await bob.get(path)
        assert page.status_code == 404, path
        assert "alice-lab batch" not in page.text
    csrf = await bob.csrf_of("/batches")
    for action in ("cancel", "rerun"):
        assert (await bob.post(f"/batches/{batch_id}/{action}", {"csrf": csrf})).status_code == 404
    listed = await bob.get("/batches")
    assert f'href="/batches/{batch_id}"' not in listed.text
    assert (await bob.get("/admin")).status_code == 403
    alice = browsers["alice"]
    await alice.sign_in("alice")
    assert "alice-lab batch" in (await alice.get(f"/batches/{batch_id}")).text
    assert (await alice.get("/batches/not-a-number")).status_code == 404
    assert (await alice.get(f"/batches/{2**70}")).status_code == 404


async def test_every_page_has_a_strict_csp_and_no_inline_script_or_style(browsers, people, frontend, certs) -> None:
    batch_id = await submit(frontend, certs, people["alice"], "alice-lab", 2)
    alice, root = browsers["alice"], browsers["root"]
    await alice.sign_in("alice")
    await root.sign_in("root")
    pages = [(alice, "/login"), (alice, "/batches"), (alice, "/batches?q=state%3Drunning"),
             (alice, f"/batches/{batch_id}"), (alice, f"/batches/{batch_id}/jobs/1"), (alice, "/billing"),
             (alice, f"/batches/{batch_id}/cancel"), (alice, "/batches/999999"), (root, "/admin")]
    for browser, path in pages:
        page = await browser.get(path)
        assert page.status_code in (200, 404), (path, page.status_code, page.text[:500])
        assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY and "script-src 'self'" in CONTENT_SECURITY_POLICY
        assert page.headers["x-frame-options"] == "DENY" and page.headers["cache-control"] == "no-store"
        assert not re.search(r"<script(?![^>]*\bsrc=)", page.text), path
        assert not re.search(r"\sstyle=", page.text), path
        assert not re.search(r"\son[a-z]+=", page.text), path
        for script in re.findall(r"<script[^>]*>", page.text):
            assert 'integrity="sha384-' in script


async def test_a_query_error_is_shown_where_it_is(browsers, people) -> None:
    alice = browsers["alice"]
    await alice.sign_in("alice")
    page = await alice.get("/batches?q=state%3Drunning%20cost%3E%3Eabc")
    assert page.status_code == 200
    assert 'aria-invalid="true"' in page.text
    assert "state=running cost&gt;<mark>&gt;</mark>abc" in page.text and "(at character 19)" in page.text


async def test_an_administrator_sees_the_admin_page(browsers, people) -> None:
    root = browsers["root"]
    await root.sign_in("root")
    page = await root.get("/admin")
    assert page.status_code == 200 and "alice" in page.text and "bob-lab" in page.text
    assert 'href="/admin"' in (await root.get("/batches")).text
    alice = browsers["alice"]
    await alice.sign_in("alice")
    assert 'href="/admin"' not in (await alice.get("/batches")).text


@pytest.fixture
async def gated_site(db_config, certs: DevCertificateAuthority, frontend: FrontendApp,
                     tmp_path: Path) -> AsyncIterator[str]:
    """A web and an auth that share the gateway's token: auth believes the web's word on where a sign-in
    comes from (the web, in turn, answers the gateway alone when it serves TLS)."""
    token_file = tmp_path / "gateway.token"
    token_file.write_text("t" * 40)
    auth = await start_auth(AuthConfig(service_url(db_config, "auth"), certs.directory,
                                       gateway_token_file=token_file))
    backend = Backend(f"localhost:{frontend.public_port}", f"localhost:{auth.public_port}",
                      Path(certs.directory) / "ca.pem", token_file.read_text())
    runner = web.AppRunner(make_app(backend))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()
        await backend.close()
        await auth.stop()


async def test_sign_ins_through_the_web_are_throttled_by_the_browsers_address(gated_site: str) -> None:
    """Failed sign-ins count against the address the gateway saw (its X-Forwarded-For), not against the web's
    own: one address is locked out, another is not."""
    async def attempt(source: str, username: str) -> int:
        browser = Browser(gated_site)
        try:
            form = await browser.get("/login")
            nonce = re.search(r'name="nonce" value="([^"]+)"', form.text).group(1)  # type: ignore[union-attr]
            answer = await browser.post("/login", {"username": username, "password": "wrong", "nonce": nonce},
                                        headers={"X-Forwarded-For": f"203.0.113.9, {source}"})
            return answer.status_code
        finally:
            await browser.close()

    statuses = [await attempt("10.1.1.1", f"someone{i}") for i in range(12)]
    assert statuses[:10] == [401] * 10 and statuses[-1] == 429
    assert await attempt("10.1.1.2", "someone-else") == 401


async def test_what_a_url_carries_is_bounded_and_refused_in_words(browsers, people) -> None:
    alice = browsers["alice"]
    await alice.sign_in("alice")
    bad_token = await alice.get("/batches?page=not-a-token")
    assert bad_token.status_code == 400 and "page_token" in bad_token.text
    many_terms = await alice.get("/batches?q=" + "a%20" * 1500)
    assert many_terms.status_code == 200 and 'aria-invalid="true"' in many_terms.text  # over the frontend's terms
    assert (await alice.get("/batches?q=" + "a" * 20_000)).status_code in (400, 414)  # over aiohttp's line
    assert (await alice.get("/batches/1/jobs/1?attempt=" + "x" * 3000)).status_code == 404
    assert (await alice.get("/billing?project=" + "p" * 3000)).status_code in (400, 404)


async def test_behind_the_gateway_the_web_answers_the_gateways_certificate_alone(
        auth_app: AuthApp, frontend: FrontendApp, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """Served over TLS, the web asks each caller for a certificate of the deployment CA and answers only the
    gateway's: a job or a worker holding another certificate of the CA (or none) gets nothing, so the
    X-Forwarded-For the web reads on a sign-in is the gateway's word."""
    web_dir = tmp_path / "web-certs"
    certs.provision("web", web_dir)
    backend = Backend(f"localhost:{frontend.public_port}", f"localhost:{auth_app.public_port}",
                      web_dir / "ca.pem", None)
    runner = web.AppRunner(make_app(backend, behind_gateway=True))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ssl(web_dir))
    await site.start()
    url = f"https://localhost:{site._server.sockets[0].getsockname()[1]}/healthz"  # type: ignore[union-attr]
    try:
        def client(identity: str | None) -> httpx.AsyncClient:
            context = ssl.create_default_context(cafile=str(web_dir / "ca.pem"))
            if identity is not None:
                files = certs.issue(identity)
                context.load_cert_chain(str(files.cert), str(files.key))
            return httpx.AsyncClient(verify=context, timeout=30)

        async with client("gateway") as gateway:
            assert (await gateway.get(url)).status_code == 200
        async with client("frontend") as other:
            assert (await other.get(url)).status_code == 403
        async with client(None) as anonymous:
            with pytest.raises(httpx.HTTPError):
                await anonymous.get(url)
    finally:
        await runner.cleanup()
        await backend.close()
