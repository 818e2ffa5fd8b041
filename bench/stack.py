"""corral's services as separate processes for a benchmark, the way
`corral up` (services/up/) runs them: a development CA in a temporary
directory, `python -m services.auth`, `python -m services.frontend` and, for
driver-memory, `python -m services.driver`, each bound to port 0 on loopback
and reporting its ports in a ports file. An administrator with a fresh API
token and a billing project are made through the real stores.

Every process is stopped by its pid (SIGTERM, then SIGKILL after a grace
period) on the way out, also on Ctrl-C or an exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from bench.common import REPO_DIR, progress
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore

ADMIN = "bench"
"""The administrator the benchmarks submit as."""
BILLING_PROJECT = "bench"
"""The billing project they submit to (the administrator is a member)."""
QUOTAS_LIFTED = ["--max-requests-per-user-per-s", "1000000", "--max-request-burst-per-user", "1000000",
                 "--max-concurrent-reads-per-user", "1000", "--max-submissions-per-user-per-minute", "1000000"]
"""The frontend's flags that lift each user's share of it (docs/security.md, *One user's share of a
replica*): a benchmark measures what the system can do, with one user, which the share would hide."""
START_TIMEOUT_S = 60.0
"""How long a service may take to report its ports (imports on a busy machine are slow)."""


@dataclasses.dataclass
class Service:
    """One service process."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self, n_chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:] if self.log_path.exists() else "(no log)"

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM by pid, wait, SIGKILL if it does not go."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def service(name: str, module_args: list[str], run_dir: Path) -> Iterator[tuple[Service, dict[str, Any]]]:
    """Start `python -m <module_args>` with `--ports-file`, wait for its
    ports, yield (service, ports); stop it on the way out."""
    ports_file, log_path = run_dir / f"{name}.ports", run_dir / f"{name}.log"
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen([sys.executable, "-m", *module_args, "--ports-file", str(ports_file)],
                                   cwd=REPO_DIR, stdout=log_file, stderr=subprocess.STDOUT)
    running = Service(name, process, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ports_file.exists():
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{running.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not report its ports in {START_TIMEOUT_S} s:\n{running.log_tail()}")
            time.sleep(0.05)
        yield running, json.loads(ports_file.read_text())
    finally:
        running.stop()


@dataclasses.dataclass(frozen=True)
class Stack:
    """What a benchmark needs to talk to the running services."""

    frontend_address: str
    """host:port of the frontend's public listener."""
    ca_cert: Path
    """The development CA the client trusts."""
    token: str
    """The administrator's API token."""
    user: str
    """The administrator's name (owner of what the benchmark submits)."""
    billing_project: str
    """A billing project the administrator may submit to."""
    frontend: Service
    """The frontend process (its pid, for a profiler)."""


@contextlib.contextmanager
def work_dir() -> Iterator[Path]:
    """A temporary directory for certificates, blobs, ports files and logs."""
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as path:
        yield Path(path)


def certificate_authority(root: Path) -> DevCertificateAuthority:
    """A development CA under `root`, created now."""
    return DevCertificateAuthority(root / "certs").issue_services()


@contextlib.asynccontextmanager
async def frontend_stack(db: Database, root: Path) -> AsyncIterator[Stack]:
    """Auth and a frontend on `db`'s schema, an administrator and a billing project."""
    certs = certificate_authority(root)
    database_url = db.config.to_url()
    common = ["--database-url", database_url, "--certs-dir", str(certs.directory)]
    progress("starting auth and frontend")
    with service("auth", ["services.auth", *common], root) as (_, auth_ports), \
            service("frontend", ["services.frontend", *common, "--auth-address",
                                 f"localhost:{auth_ports['internal']}", "--spec-root-url",
                                 f"file://{root / 'blobs'}", *QUOTAS_LIFTED], root) as (frontend, frontend_ports):
        _, token = await AuthStore(db).ensure_admin(ADMIN)
        await JobStore(db).create_billing_project(BILLING_PROJECT, [ADMIN])
        yield Stack(f"localhost:{frontend_ports['public']}", certs.ca_cert_path, token, ADMIN, BILLING_PROJECT,
                    frontend)
