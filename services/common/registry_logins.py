"""Registry logins as corral keeps and hands them to skopeo: never on a command line (which every local
account can read), always in files of the account running corral.

- A **login file** holds one login as JSON, `{"username": ..., "password": ...}`, 0600: `corral up`'s
  own registry's pull and push logins (services.registry.local), and the copy a local worker is
  given of the pull login (`--own-registry-login-file`). `read_login_file` refuses one that other
  accounts could read.
- An **auth file** is what skopeo reads (`--authfile`): Docker's `config.json`, the login under the
  registry's `host[:port]`. Whoever writes one writes it 0600 into a private directory and removes it
  after the run (`auth_file`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from services.common.files import write_atomically


@dataclasses.dataclass(frozen=True)
class Credentials:
    """A registry login for one pull or push."""

    username: str
    password: str = dataclasses.field(repr=False)


def new_login_file(path: Path, username: str) -> Credentials:
    """The login in `path`, made now (a random password) if the file is missing; the file is 0600."""
    if not path.exists():
        login = {"username": username, "password": secrets.token_urlsafe(32)}
        write_atomically(path, json.dumps(login).encode(), 0o600)
    return read_login_file(path)


def read_login_file(path: Path) -> Credentials:
    """The login in a login file; ValueError (naming the file, never what it holds) if other accounts could
    read it or it is not a login."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            raise ValueError(f"registry login file {path} must be readable by its owner only (chmod 600)")
        content = f.read()
    try:
        login = json.loads(content)
        credentials = Credentials(login["username"], login["password"])
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"registry login file {path} is not {{\"username\": ..., \"password\": ...}}") from None
    if not (isinstance(credentials.username, str) and isinstance(credentials.password, str)
            and credentials.username and credentials.password and ":" not in credentials.username):
        raise ValueError(f"registry login file {path} needs a user name (without ':') and a password")
    return credentials


def auth_file_contents(registry: str, credentials: Credentials) -> bytes:
    """An auth file (Docker's config.json) holding `credentials` for `registry` (host[:port])."""
    token = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
    return json.dumps({"auths": {registry: {"auth": token}}}).encode()


@contextlib.contextmanager
def auth_file(registry: str, credentials: Credentials, parent: Path | None = None) -> Iterator[Path]:
    """An auth file for skopeo holding `credentials` for `registry`: 0600, in a new 0700 directory under
    `parent` (the system's temporary directory by default), removed with it after the block."""
    directory = Path(tempfile.mkdtemp(prefix="auth-", dir=parent))  # 0700
    try:
        path = directory / "auth.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(auth_file_contents(registry, credentials))
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)
