"""Fixtures of the web tier: Debian's Chromium driven by Playwright's sync API (tests/web/browsers.py), contexts
that verify the UI's certificate against a CA they are told to trust, and the page checks of
tests/web/pages.py (axe-core, screenshots, script bytes).

The tests are plain functions (`def`, not `async def`): Playwright's sync API refuses to run inside a
running asyncio loop. A server the test needs runs in a thread of its own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from tests.web import pages
from tests.web.browsers import chromium, trusting


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright's sync API for a module (its driver process, stopped at the module's end). Not for the
    session: the sync API keeps an asyncio loop running in the main thread while it is started, and the other
    tiers' async tests, which pytest-xdist may give the same process afterwards, need that thread free."""
    with sync_playwright() as started:
        yield started


def _launch(playwright: Playwright, **options: Any) -> Browser:
    # Playwright passes --no-sandbox to Chromium itself: the tests run as root, where the sandbox cannot start.
    return playwright.chromium.launch(executable_path=chromium(), headless=True, **options)


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Headless Chromium for the module, trusting no CA but the system's. Closed at the end. The test fails
    (it is not skipped) when Chromium is not installed: scripts/setup.sh --for test installs it."""
    launched = _launch(playwright)
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture(scope="module")
def _browsers_by_ca() -> Iterator[dict[str, Browser]]:
    """A browser per CA that `new_context` was asked to trust, by the digest of the CA's certificate, launched
    once for the module (trust is the browser process's) and closed at the module's end."""
    launched: dict[str, Browser] = {}
    try:
        yield launched
    finally:
        for each in launched.values():
            each.close()


NewContext = Callable[..., BrowserContext]
"""`new_context(trust=None, **options)`: see the fixture."""


@pytest.fixture
def new_context(browser: Browser, playwright: Playwright, _browsers_by_ca: dict[str, Browser],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[NewContext]:
    """A factory of browser contexts, closed after the test: `new_context(trust=ca_pem, **options)`, where
    `ca_pem` is a CA's certificate (the UI's is DATA/ca.pem) that the context's browser trusts as a root,
    with every check of the server's certificate left on (its name too); without `trust`, only the system's
    CAs are trusted. `options` are Playwright's `Browser.new_context` options, but `ignore_https_errors`,
    which would hide the certificate errors the tests are there to see."""
    made: list[BrowserContext] = []

    def new(trust: Path | None = None, **options: Any) -> BrowserContext:
        if options.pop("ignore_https_errors", False):
            raise ValueError("the web tier verifies certificates: pass trust=<the CA's certificate> instead")
        owner = browser
        if trust is not None:
            digest = hashlib.sha256(trust.read_bytes()).hexdigest()
            if digest not in _browsers_by_ca:
                home = tmp_path_factory.mktemp("browser-home")
                _browsers_by_ca[digest] = _launch(playwright, **trusting(trust, home))
            owner = _browsers_by_ca[digest]
        context = owner.new_context(ignore_https_errors=False, **options)
        made.append(context)
        return context

    try:
        yield new
    finally:
        for context in made:
            context.close()


@pytest.fixture
def axe() -> Callable[[Page], list[dict[str, Any]]]:
    """`axe(page)`: axe-core's WCAG 2 A/AA violations on the page (tests/web/pages.py)."""
    return pages.axe


@pytest.fixture
def assert_accessible() -> Callable[[Page, str], None]:
    """`assert_accessible(page, name)`: fail on axe-core's serious and critical violations, print the rest."""
    return pages.assert_accessible


@pytest.fixture
def screenshot() -> Callable[[Page, str], Path]:
    """`screenshot(page, name)`: a full-page PNG in $CORRAL_TEST_ARTIFACTS/screenshots (default
    test-artifacts/screenshots), whose path it returns."""
    return pages.screenshot


@pytest.fixture
def script_bytes() -> Callable[[Page], int]:
    """`script_bytes(page)`: the bytes of script files the page has loaded (Resource Timing's
    encodedBodySize)."""
    return pages.script_bytes
