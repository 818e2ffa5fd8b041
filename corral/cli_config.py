"""The CLI's configuration file: named profiles, each a server and a token.

    {"current": "alice",
     "profiles": {"admin": {"frontend": "localhost:7443", "auth": "localhost:7444",
                            "ca_cert": "/home/me/.local/share/corral/ca.pem", "token": "..."},
                  "alice": {"frontend": "localhost:7443", ...}}}

The file is `~/.config/corral/config.json`, or `$CORRAL_CONFIG`, written
0600 since it holds tokens. `corral login` writes one profile (named after
the user unless `--profile` names it) and makes it current; `corral up`
writes only its `admin` profile and moves the other profiles of its own
server (those trusting its CA) to its new addresses, so that a restart logs
nobody out. A file in the older flat form (one server and token) reads as
one profile, `default`.

A command uses the profile `--profile` names, else the current one, and the
token in `$CORRAL_TOKEN`, else the profile's.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from corral.errors import Unauthenticated, UsageError

CONFIG_VARIABLE = "CORRAL_CONFIG"
"""Names the configuration file instead of `DEFAULT_PATH`."""
DEFAULT_PATH = "~/.config/corral/config.json"
TOKEN_VARIABLE = "CORRAL_TOKEN"
"""A token that overrides the profile's, for scripts and for a token you were given."""
ADMIN_PROFILE = "admin"
"""The profile `corral up` writes."""
FLAT_PROFILE = "default"
"""What a file in the older flat form (one server, one token) is read as."""


@dataclasses.dataclass
class Profile:
    """One server and who the CLI is there."""

    frontend: str = "localhost:7443"
    """host:port of the frontend."""
    auth: str = "localhost:7444"
    """host:port of the auth service."""
    ca_cert: str | None = None
    """The CA certificate to trust (None: the system's roots)."""
    token: str | None = None
    """The bearer token (None: not logged in)."""
    user: str | None = None
    """Whose token it is, as the server said when it was saved (for `corral profile list`)."""
    billing_project: str | None = None
    """The pipeline library's billing project when ServiceBackend() names none (`corral profile set`)."""
    remote_tmpdir: str | None = None
    """The pipeline library's scratch URL when ServiceBackend() names none (`corral profile set`)."""


SETTINGS = ("billing_project", "remote_tmpdir")
"""The profile's fields `corral profile set` writes: the pipeline library's defaults (corral.pipeline)."""


@dataclasses.dataclass
class Config:
    """The whole file."""

    profiles: dict[str, Profile] = dataclasses.field(default_factory=dict)
    current: str | None = None
    """The profile commands use without `--profile` (None: none yet)."""

    @staticmethod
    def path() -> Path:
        return Path(os.environ.get(CONFIG_VARIABLE, DEFAULT_PATH)).expanduser()

    @classmethod
    def load(cls, path: Path | None = None) -> Config:
        """The file at `path` (default: `path()`); an empty configuration if there is none."""
        path = path or cls.path()
        if not path.exists():
            return cls()
        try:
            document = json.loads(path.read_text())
            if "profiles" not in document:  # the flat form, from before profiles
                return cls({FLAT_PROFILE: Profile(**document)}, FLAT_PROFILE)
            return cls({name: Profile(**fields) for name, fields in document["profiles"].items()},
                       document.get("current"))
        except (ValueError, TypeError, AttributeError) as e:
            raise UsageError(f"not a corral configuration ({e}); fix or remove it", location=str(path)) from None

    def save(self, path: Path | None = None) -> None:
        path = path or self.path()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds tokens
        with os.fdopen(fd, "w") as f:
            json.dump({"current": self.current,
                       "profiles": {name: dataclasses.asdict(p) for name, p in self.profiles.items()}}, f, indent=2)

    def profile(self, name: str | None = None) -> Profile:
        """The profile `name`, else the current one, else the defaults (no token)."""
        name = name or self.current
        if name is None:
            return Profile()
        if name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none yet"
            raise UsageError(f"no profile {name!r} in {self.path()} (profiles: {known}); `corral login` makes one")
        return self.profiles[name]


def connection(profile_name: str | None = None) -> Profile:
    """What a command connects with: the profile (`--profile`, else the current one) with `$CORRAL_TOKEN`
    in place of its token if set."""
    profile = dataclasses.replace(Config.load().profile(profile_name))
    profile.token = os.environ.get(TOKEN_VARIABLE) or profile.token
    if not profile.token:
        raise Unauthenticated(f"not logged in: run `corral login` (or set ${TOKEN_VARIABLE})")
    return profile


def write_server_profile(profile: Profile, name: str = ADMIN_PROFILE, path: Path | None = None) -> str:
    """Save `profile` as `name` for `corral up`, which starts on new ports each time: every other profile
    trusting the same CA is of the same server and moves to its new addresses, keeping its token. The
    current profile stays current; `name` becomes current only when none is. Returns the current profile."""
    config = Config.load(path)
    if (earlier := config.profiles.get(name)) is not None:  # what the user set stays theirs
        for setting in SETTINGS:
            setattr(profile, setting, getattr(earlier, setting) or getattr(profile, setting))
    if profile.ca_cert is not None:
        for other in config.profiles.values():
            if other.ca_cert == profile.ca_cert:
                other.frontend, other.auth = profile.frontend, profile.auth
    config.profiles[name] = profile
    if config.current not in config.profiles:
        config.current = name
    config.save(path)
    return config.current or name
