"""`corral up`'s own registry: two `docker-registry` processes on loopback serving one storage, neither
of which any other local account can use.

distribution's htpasswd authentication is all or nothing (one password file, no read/write split),
so the roles are split between processes instead:

- **pull** (`registry`, the workers' own registry): read-only (every push and delete is 405),
  and it asks for the *pull login*. The drivers are given it (a copy in their certificate
  directory), and each hands it to the local workers it starts as it hands them their certificates
  (a file in the worker's own certificate directory): only the image cache reads it, for pulls of
  `localhost/...` and of docker.io's images, which it mirrors. Never on a command line, never in a job's reach.
- **push** (`registry-push`): writable, and it asks for the *push login*, which only `corral up`
  holds: the seed images go through it (and later `corral images import`).

Both listen on 127.0.0.1 only, on ports chosen at the first start of `corral up` and kept in
`ports.json`, so the registry's address (the pull one, which users and the workers' caches name) is the
same at every start on the same data directory; `corral up --registry-port PORT` moves it. If another
process holds the kept pull port, `corral up` stops, naming the port and that flag; the push port, which
only corral itself is told of, is chosen anew if it is taken. A local account other than corral's can connect to
either and is refused (401) whatever it asks, reads included: nothing without a login, and the logins
are in files only corral's account reads.

    DATA/registry/        0700
      storage/            blobs and manifests, served by both
      seed/               the seed images' build (services.registry.seed)
      pull/ push/         each process's configuration, HTTP secret and log position
      ports.json          the pull and push ports, kept across starts
      logins/             0700: pull.json and push.json (login files, 0600, made once), and the
                          htpasswd files made from them at each start (bcrypt)
"""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import Callable, Sequence
from pathlib import Path

import bcrypt

from services.common.files import write_atomically
from services.common.registry_logins import Credentials, new_login_file
from services.registry.server import RegistryServer

PULL_USER = "corral-pull"
PUSH_USER = "corral-push"
PORTS = "ports.json"
PULL_LOGIN = "pull.json"
PUSH_LOGIN = "push.json"
BCRYPT_ROUNDS = 6
"""The registry checks the password of every request: the passwords are 256 random bits, so a cheap hash
loses nothing to guessing, and every pull's many requests stay fast."""


class RegistryPortTaken(RuntimeError):
    """The registry's kept port is held by another process."""


def port_free(port: int) -> bool:
    """Whether a listener could bind 127.0.0.1:PORT now, as docker-registry binds it (SO_REUSEADDR: the
    connections an earlier registry left in TIME_WAIT do not hold the port)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def kept_ports(root: Path, free_port: Callable[[], int], pull_port: int | None = None) -> tuple[int, int]:
    """The pull and push ports of the registry in `root`: those kept in ROOT/ports.json (the pull one
    `pull_port` if given), chosen with `free_port` the first time, and kept for the next start.
    RegistryPortTaken if the pull port is held by another process (its address must not change silently)."""
    file = root / PORTS
    try:
        kept = json.loads(file.read_text())
        pull, push = int(kept["pull"]), int(kept["push"])
    except (OSError, ValueError, KeyError, TypeError):
        pull = push = 0
    pull = pull_port or pull or free_port()
    if not port_free(pull):
        raise RegistryPortTaken(
            f"the registry's port 127.0.0.1:{pull} is taken by another process; corral up keeps this port (in "
            f"{file}) so that the registry's address stays the same: stop that process, or move the registry "
            f"with `corral up --registry-port PORT`")
    if not push or push == pull or not port_free(push):
        push = free_port()
        while push == pull:
            push = free_port()
    write_atomically(file, json.dumps({"pull": pull, "push": push}).encode(), 0o600)
    return pull, push


def write_htpasswd(path: Path, credentials: Credentials) -> None:
    """An htpasswd file (bcrypt, as docker-registry wants) holding one login, 0600."""
    hashed = bcrypt.hashpw(credentials.password.encode(), bcrypt.gensalt(BCRYPT_ROUNDS))
    write_atomically(path, credentials.username.encode() + b":" + hashed + b"\n", 0o600)


@dataclasses.dataclass
class LocalRegistry:
    """The pull and push registries of one data directory."""

    root: Path
    """DATA/registry."""
    pull: RegistryServer
    push: RegistryServer
    pull_login: Credentials
    push_login: Credentials

    @classmethod
    def prepare(cls, root: Path, free_port: Callable[[], int], launcher: Sequence[str] = (),
                logs: Path | None = None, pull_port: int | None = None) -> LocalRegistry:
        """Make the logins (once) and this start's htpasswd files; each server's port is the one it had
        (`kept_ports`: chosen the first time; the pull one `pull_port` if given)."""
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)
        logins = root / "logins"
        logins.mkdir(mode=0o700, exist_ok=True)
        logins.chmod(0o700)
        pull_login = new_login_file(logins / PULL_LOGIN, PULL_USER)
        push_login = new_login_file(logins / PUSH_LOGIN, PUSH_USER)
        write_htpasswd(logins / "pull.htpasswd", pull_login)
        write_htpasswd(logins / "push.htpasswd", push_login)
        storage = root / "storage"
        pull_port, push_port = kept_ports(root, free_port, pull_port)
        pull = RegistryServer(root / "pull", pull_port, launcher=launcher, htpasswd=logins / "pull.htpasswd",
                              storage=storage, read_only=True, name="registry",
                              log_file=logs / "registry.log" if logs else None)
        push = RegistryServer(root / "push", push_port, launcher=launcher, htpasswd=logins / "push.htpasswd",
                              storage=storage, name="registry-push",
                              log_file=logs / "registry-push.log" if logs else None)
        return cls(root, pull, push, pull_login, push_login)

    @property
    def pull_login_file(self) -> Path:
        """The pull login's file (0600): what the drivers are given a copy of."""
        return self.root / "logins" / PULL_LOGIN

    @property
    def push_login_file(self) -> Path:
        """The push login's file (0600): what the frontend is given a copy of (`corral images import`)."""
        return self.root / "logins" / PUSH_LOGIN

    @property
    def servers(self) -> tuple[RegistryServer, RegistryServer]:
        """Both processes, pull first (the one the workers need)."""
        return self.pull, self.push

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until both answer (see RegistryServer.wait_ready)."""
        for server in self.servers:
            server.wait_ready(timeout_s)
