"""Debian's Chromium under Playwright, and how it comes to trust corral's development CA.

Playwright cannot download its own browsers here, so the web tier launches the Chromium that
scripts/setup.sh installs from Debian. The UI is served over HTTPS by Envoy with a certificate of the
development CA (DATA/ca.pem), and the tests verify that certificate as a user's browser would rather than
turning checks off (`ignore_https_errors`): `trusting` gives launch options under which Chromium trusts a
CA as a root, with its usual checks of names, dates and usages.

It does so through an NSS database in a HOME of the browser's own: Chromium on Linux reads the trust
anchors a user added from `$HOME/.pki/nssdb`, and NSS's certutil (Debian's libnss3-tools) adds one. The
other way, `--ignore-certificate-errors-spki-list` with a key's digest, was tried and not taken: it
ignores every error of a certificate whose chain holds that key (a wrong name too), and it names keys,
not a CA, so for the CA's key to count the server must send the CA in its chain, which corral's Envoy
does not (its certificate files hold the leaf alone); naming the leaf's key instead breaks whenever the
certificate is issued again with a new key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium")
"""Debian's Chromium (scripts/setup.sh --for test installs the package `chromium`), or None."""
CERTUTIL = shutil.which("certutil")
"""NSS's certutil (Debian's libnss3-tools), which writes the trust a browser is launched with, or None."""


def chromium() -> str:
    """The path of Chromium, failing the test when it is not installed: the web tier is part of CI, so a
    missing browser is a broken machine to be mended, not a reason to skip."""
    if CHROMIUM is None:
        pytest.fail("Chromium is not installed (no `chromium` on the PATH): run scripts/setup.sh --for test")
    return CHROMIUM


def trusting(ca_pem: Path, home: Path) -> dict[str, object]:
    """Options for `BrowserType.launch` under which Chromium trusts `ca_pem` (a CA's certificate, such as
    DATA/ca.pem) to issue servers' certificates: `home`, an empty directory, becomes the browser's HOME,
    with an NSS database there that holds the CA as a trusted root. Trust belongs to the browser process,
    not to a context, so each CA needs a browser of its own."""
    if CERTUTIL is None:
        pytest.fail("NSS's certutil is not installed (Debian's libnss3-tools): run scripts/setup.sh --for test")
    database = home / ".pki" / "nssdb"
    database.mkdir(parents=True)
    # "C,," trusts the certificate to issue servers' certificates (SSL), not mail's nor code's.
    for command in (["-N", "--empty-password"], ["-A", "-n", "corral-test-ca", "-t", "C,,", "-i", str(ca_pem)]):
        subprocess.run([CERTUTIL, "-d", f"sql:{database}", *command], check=True, capture_output=True)
    return {"env": {**os.environ, "HOME": str(home)}}
