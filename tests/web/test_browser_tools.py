"""The web tier's own tools, each shown to work and to be able to fail: a real HTTPS server on loopback (aiohttp)
with a certificate of a throwaway development CA, serving pages under the UI's strict Content Security
Policy, loaded in headless Chromium that trusts that CA with its certificate checks on."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page

from services.common.tls import DevCertificateAuthority
from tests.web.conftest import NewContext

POLICY = "default-src 'self'; script-src 'self'; style-src 'self'"
APP_JS = b'document.getElementById("status").textContent = "the external script ran";\n'


def _page(body: str) -> str:
    return ('<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>corral: tools</title></head>\n'
            f'<body><main><h1>Tools</h1><p id="status">not yet</p>{body}</main>\n'
            '<script>document.body.dataset.inline = "ran";</script>\n'  # the policy must block this
            '<script src="/app.js"></script></body></html>\n')


PAGES = {
    "/": _page('<label for="name">Name</label> <input id="name" type="text">'),
    "/unlabelled": _page('<input type="text">'),
}


async def _serve_page(request: web.Request) -> web.Response:
    return web.Response(text=PAGES[request.path], content_type="text/html", headers={"Content-Security-Policy": POLICY})


async def _serve_script(request: web.Request) -> web.Response:
    return web.Response(body=APP_JS, content_type="text/javascript", headers={"Content-Security-Policy": POLICY})


class Site:
    """The pages above over HTTPS on 127.0.0.1, one port per certificate, served by aiohttp on an event loop in
    a thread of its own (the tests drive Playwright's sync API, which refuses a running loop)."""

    def __init__(self, certificates: dict[str, ssl.SSLContext]):
        self._certificates = certificates
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        self._listeners: list[asyncio.Server] = []
        self.urls: dict[str, str] = {}
        """The site's root URL for each name of a certificate it serves."""

    def start(self) -> Site:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/app.js", _serve_script)
        for path in PAGES:
            app.router.add_get(path, _serve_page)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        assert self._runner.server is not None
        for name, context in self._certificates.items():
            listening = socket.create_server(("127.0.0.1", 0))  # port 0: the site's own, whatever is free
            self._listeners.append(await self._loop.create_server(self._runner.server, sock=listening, ssl=context))
            self.urls[name] = f"https://127.0.0.1:{listening.getsockname()[1]}"

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(timeout=30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()

    async def _stop(self) -> None:
        for listener in self._listeners:
            listener.close()
        if self._runner is not None:
            await self._runner.cleanup()  # closes the browser's open connections
        # A TLS connection is gone only when its socket closes after the TLS close, a few turns of the loop
        # later: stopping the loop before would leave it open. Python 3.12's Server.wait_closed waits for
        # that; 3.11's does not, hence the count.
        while any(listener._active_count for listener in self._listeners):  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)


def _server_context(ca: DevCertificateAuthority, identity: str, hostnames: tuple[str, ...]) -> ssl.SSLContext:
    files = ca.issue(identity, hostnames)  # the leaf alone, as corral's Envoy serves it
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    return context


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> DevCertificateAuthority:
    """A throwaway development CA, made as corral up makes DATA/ca.pem."""
    authority = DevCertificateAuthority(tmp_path_factory.mktemp("ca"))
    authority.ensure()
    return authority


@pytest.fixture(scope="module")
def site(ca: DevCertificateAuthority) -> Iterator[Site]:
    """The pages, at 'loopback' with a certificate for 127.0.0.1 and at 'misnamed' with one for another
    host, both of the CA."""
    served = Site({"loopback": _server_context(ca, "web", ("127.0.0.1",)),
                   "misnamed": _server_context(ca, "elsewhere", ("elsewhere.invalid",))}).start()
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture
def page(new_context: NewContext, ca: DevCertificateAuthority) -> Page:
    """A page of a context that trusts the CA."""
    return new_context(trust=ca.ca_cert_path).new_page()


def test_a_page_of_the_trusted_ca_loads_and_its_own_script_runs(page: Page, site: Site) -> None:
    response = page.goto(site.urls["loopback"] + "/")
    assert response is not None and response.ok
    assert page.text_content("#status") == "the external script ran"


def test_without_the_ca_or_with_a_wrong_name_the_certificate_is_refused(new_context: NewContext, page: Page,
                                                                         site: Site) -> None:
    untrusting = new_context().new_page()
    with pytest.raises(PlaywrightError, match="ERR_CERT_AUTHORITY_INVALID"):
        untrusting.goto(site.urls["loopback"] + "/")
    with pytest.raises(PlaywrightError, match="ERR_CERT_COMMON_NAME_INVALID"):
        page.goto(site.urls["misnamed"] + "/")


def test_certificate_errors_cannot_be_ignored(new_context: NewContext) -> None:
    with pytest.raises(ValueError, match="trust="):
        new_context(ignore_https_errors=True)


def test_the_policy_blocks_inline_scripts(page: Page, site: Site) -> None:
    refused: list[str] = []
    page.on("console", lambda message: refused.append(message.text) if "Content Security Policy" in message.text
            else None)
    page.goto(site.urls["loopback"] + "/")
    assert page.text_content("#status") == "the external script ran"
    assert page.evaluate("document.body.dataset.inline") is None
    assert any("inline script" in text for text in refused), refused


def test_axe_runs_under_the_policy_and_finds_an_unlabelled_input(page: Page, site: Site,
                                                                 axe: Callable[[Page], list[dict[str, Any]]],
                                                                 assert_accessible: Callable[[Page, str], None]
                                                                 ) -> None:
    page.goto(site.urls["loopback"] + "/unlabelled")
    violations = axe(page)
    assert [(v["id"], v["impact"]) for v in violations] == [("label", "critical")]
    assert violations[0]["nodes"][0]["target"] == ["input"]
    with pytest.raises(pytest.fail.Exception, match=r"unlabelled form is not accessible[\s\S]*label \(critical\)"):
        assert_accessible(page, "the unlabelled form")

    page.goto(site.urls["loopback"] + "/")
    assert axe(page) == []
    assert_accessible(page, "the labelled form")


def test_a_screenshot_is_a_png_in_the_artifacts(page: Page, site: Site, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                screenshot: Callable[[Page, str], Path]) -> None:
    monkeypatch.setenv("CORRAL_TEST_ARTIFACTS", str(tmp_path))
    page.goto(site.urls["loopback"] + "/")
    path = screenshot(page, "browser-tools")
    assert path == tmp_path / "screenshots" / "browser-tools.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError):
        screenshot(page, "../outside")


def test_script_bytes_counts_the_script_files_the_page_loaded(page: Page, site: Site,
                                                              script_bytes: Callable[[Page], int]) -> None:
    page.goto(site.urls["loopback"] + "/")
    assert script_bytes(page) == len(APP_JS)
