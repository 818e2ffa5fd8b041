"""What the web tier checks of a loaded page: accessibility with axe-core, a screenshot kept for whoever
looks at a run, and how many bytes of script the page loaded. Each takes a Playwright `Page` (sync API);
tests/web/conftest.py offers each as a fixture.

The UI's pages have a strict Content Security Policy (`script-src 'self'`). Playwright's `add_script_tag`
inserts an inline <script> into the page, which that policy blocks, so axe-core is injected with
`page.evaluate` instead: code evaluated through the DevTools protocol is not the page's and the policy does
not apply to it, so the page is checked under its real policy, with no `bypass_csp` that would also let the
page's own inline scripts run unseen.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

REPO = Path(__file__).resolve().parents[2]
AXE = REPO / ".tools" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
"""axe-core as scripts/setup.sh --for test installs it: `npm ci` from tests/web/package-lock.json, which
pins its version and records its integrity hash."""
WCAG_TAGS = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa")
"""axe's rules for WCAG 2.0, 2.1 and 2.2 at levels A and AA; its best practices (tagged `best-practice`)
are not run."""
FAILING_IMPACTS = ("serious", "critical")
"""The impacts that fail `assert_accessible`; minor and moderate violations are printed."""
ARTIFACTS_VARIABLE = "CORRAL_TEST_ARTIFACTS"
"""Where a run keeps what the tests leave for people to look at; test-artifacts/ at the repository's root
unless set (it is ignored by git)."""


def axe(page: Page) -> list[dict[str, Any]]:
    """axe-core's violations of WCAG 2 A and AA on the page as it is now (its top frame), each as axe
    reports it: `id`, `impact`, `help`, `helpUrl` and the `nodes` that violate the rule, with their
    `target` selectors."""
    if not AXE.is_file():
        pytest.fail(f"axe-core is not installed at {AXE.relative_to(REPO)}: run scripts/setup.sh --for test")
    # The trailing expression makes the script's value plain: Playwright calls a value that is a function.
    page.evaluate(AXE.read_text() + "\n;undefined")
    return page.evaluate("async (tags) => (await axe.run(document, {runOnly: {type: 'tag', values: tags}}))"
                         ".violations", list(WCAG_TAGS))


def assert_accessible(page: Page, name: str) -> None:
    """Fail when axe finds a serious or critical violation on the page (`name` says which page in the
    message), listing each with its rule, impact, help and first targets; print the minor and moderate
    ones, which do not fail."""
    failing, other = [], []
    for violation in axe(page):
        (failing if violation["impact"] in FAILING_IMPACTS else other).append(_describe(violation))
    for line in other:
        print(f"{name}: {line}")
    if failing:
        pytest.fail(f"{name} is not accessible (axe-core, WCAG 2 A/AA):\n" + "\n".join(failing), pytrace=False)


def _describe(violation: dict[str, Any], targets_shown: int = 3) -> str:
    targets = [" ".join(node["target"]) if isinstance(node["target"], list) else str(node["target"])
               for node in violation["nodes"]]
    more = f" and {len(targets) - targets_shown} more" if len(targets) > targets_shown else ""
    return (f"  {violation['id']} ({violation['impact']}): {violation['help']}: "
            f"{', '.join(targets[:targets_shown])}{more}")


def artifacts() -> Path:
    """The directory the tests leave screenshots and the like in ($CORRAL_TEST_ARTIFACTS, or
    test-artifacts/ at the repository's root)."""
    return Path(os.environ.get(ARTIFACTS_VARIABLE) or REPO / "test-artifacts")


def screenshot(page: Page, name: str) -> Path:
    """Save a PNG of the whole page (not only what fits the viewport) as `screenshots/NAME.png` in the
    artefacts directory, replacing one of the same name, and return its path."""
    if not re.fullmatch(r"[\w.-]+", name):
        raise ValueError(f"a screenshot's name is a file name of letters, digits, '_', '.' and '-', not {name!r}")
    path = artifacts() / "screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=path, full_page=True)
    return path


def script_bytes(page: Page) -> int:
    """The bytes of script the page has loaded from files so far, as the network carried them (compressed
    if the server compressed them, without headers; from the cache too): the sum of `encodedBodySize` over
    the Resource Timing entries that <script> elements and module imports started. Inline scripts are not
    counted (the UI's policy allows none), nor scripts from another origin that does not send
    Timing-Allow-Origin (their sizes read as 0)."""
    return page.evaluate("performance.getEntriesByType('resource')"
                         ".filter((entry) => entry.initiatorType === 'script')"
                         ".reduce((sum, entry) => sum + entry.encodedBodySize, 0)")
