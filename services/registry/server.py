"""A private OCI registry on loopback: `docker-registry serve CONFIG.yml` (Debian's package of the
CNCF distribution registry), with its storage, configuration and log under one directory.

    ROOT/             0700
      config.yml      generated at each start (0600: it holds the HTTP secret)
      http.secret     the secret that signs upload state, kept across restarts
      storage/        blobs and manifests (kept across restarts)
      registry.log    its output, unless a log file is given

It listens on `127.0.0.1:PORT` only, over plain HTTP (loopback: nothing to encrypt against), and is
stopped by its pid. With an htpasswd file it asks for basic authentication, on every request, reads
included (distribution's htpasswd is all or nothing); `read_only` refuses every write (405: its
storage's `maintenance.readonly`), so two registries may serve one storage, one to pull from and one
to push to, each with its own login (services.registry.local). It is a part `corral up` supervises
(services.up.supervisor.Part): `start` returns once the process runs, `ready` says whether `GET /v2/`
answers, `wait_ready` waits for that.
"""

from __future__ import annotations

import http.client
import secrets
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from services.common.files import write_atomically
from services.common.processes import Child, Ending, end_processes, last_log_line

PROGRAM = "docker-registry"


class RegistryServer:
    """One `docker-registry` process serving ROOT/storage on 127.0.0.1:PORT."""

    def __init__(self, root: Path, port: int, *, launcher: Sequence[str] = (), log_file: Path | None = None,
                 htpasswd: Path | None = None, storage: Path | None = None, read_only: bool = False,
                 name: str = "registry"):
        self.root = root
        self.port = port
        self.launcher = tuple(launcher)
        """An argv prefix, e.g. `corral up`'s, which makes the registry die with `corral up`
        (services.common.parent_death); with one, the registry gets a session of its own too."""
        self.log_file = log_file or root / "registry.log"
        self.htpasswd = htpasswd
        """Ask for basic authentication against this htpasswd file (bcrypt hashes)."""
        self.storage = storage or root / "storage"
        """Where blobs and manifests live; two registries may serve one storage (one with a login)."""
        self.read_only = read_only
        """Refuse pushes and deletes (405); also purge no uploads, which a writable registry on the same
        storage may have under way."""
        self.name = name
        """Its part's name under `corral up`'s supervisor (and its pid file's)."""
        self.process: subprocess.Popen[bytes] | None = None
        self._log_start = 0
        """Where this start's output begins in the log file."""

    @property
    def address(self) -> str:
        """host:port, as image references name it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        """`http://127.0.0.1:PORT`: how workers are told of it (services.common.image_refs.Registry)."""
        return f"http://{self.address}"

    def _config(self) -> dict:
        secret_file = self.root / "http.secret"
        if not secret_file.exists():
            write_atomically(secret_file, secrets.token_hex(32).encode(), 0o600)
        storage: dict = {"filesystem": {"rootdirectory": str(self.storage)}, "delete": {"enabled": not self.read_only}}
        if self.read_only:
            storage["maintenance"] = {"readonly": {"enabled": True}, "uploadpurging": {"enabled": False}}
        config: dict = {
            "version": 0.1,
            "log": {"level": "info", "formatter": "text"},
            "storage": storage,
            "http": {"addr": self.address, "secret": secret_file.read_text().strip(),
                     "headers": {"X-Content-Type-Options": ["nosniff"]}},
        }
        if self.htpasswd is not None:
            config["auth"] = {"htpasswd": {"realm": "corral", "path": str(self.htpasswd)}}
        return config

    def start(self) -> None:
        """Write the configuration and start the registry (see `wait_ready`)."""
        program = shutil.which(PROGRAM)
        if program is None:
            raise RuntimeError(f"{PROGRAM} not found: run scripts/setup.sh --for run "
                               "(it installs Debian's docker-registry)")
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        self.storage.mkdir(parents=True, exist_ok=True)
        config_file = self.root / "config.yml"
        write_atomically(config_file, yaml.safe_dump(self._config()).encode(), 0o600)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            self._log_start = out.tell()
            self.process = subprocess.Popen([*self.launcher, program, "serve", str(config_file)],
                                            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=bool(self.launcher))

    def ready(self) -> bool:
        """Whether it listens (it said so in its log: another process on the port would answer too) and
        `GET /v2/` answers as a registry does (200, or 401 with a login)."""
        if self.exit_status() is not None or self.process is None:
            return False
        try:
            with open(self.log_file, "rb") as log:
                log.seek(self._log_start)
                if b"listening on " not in log.read():
                    return False
        except OSError:
            return False
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1.0)
        try:
            connection.request("GET", "/v2/")
            response = connection.getresponse()
            response.read()
            return response.getheader("Docker-Distribution-Api-Version") is not None
        except OSError:
            return False
        finally:
            connection.close()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Wait until it answers; raises (naming its log's last line) if it exits or takes too long."""
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            status = self.exit_status()
            if status is not None:
                raise RuntimeError(f"the registry exited with {status}: {self.last_words()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the registry did not answer on {self.address} within {timeout_s:g} s: "
                                   f"{self.last_words()}")
            time.sleep(0.02)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def exit_status(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def last_words(self) -> str:
        return last_log_line(self.log_file)

    def ending(self) -> Ending | None:
        return Child(self.name, self.process) if self.process is not None else None

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM it by its pid (SIGKILL after `grace_s`) and wait."""
        ending = self.ending()
        if ending is not None and not ending.gone():
            end_processes([ending], grace_s, lambda line: None)
