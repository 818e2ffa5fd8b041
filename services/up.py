"""`corral up`: the whole system on one machine, each service its own process.

Starts (or connects to) MariaDB, applies migrations, gives each service its
own database account, keeps a development CA and gives each service its own
certificate directory, starts auth, the frontend, a leading driver and a
standby on loopback, makes sure an administrator and a `default` billing
project exist, writes the CLI configuration, prints the endpoints and an
admin token, and stops every process it started, by pid, on Ctrl-C or
SIGTERM. State lives in the data directory and survives restarts.

The data directory (docs/security.md):

    DATA/            0711: other accounts may pass through (to a job's own directory), not list
      ca.pem         the CA certificate, for clients
      ca/            0700: the CA and its key; only this process reads it
      certs/NAME/    0700: one per service: ca.pem and its own certificate and key
      secrets/       0700: the database passwords (admin and one per service)
      mariadb/       0700: the private server, its data and its socket
      blobs/ logs/ run/ workers/ ...   created by the services, private to them (umask 077)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from services.auth.store import AuthStore
from services.common.entry import DATABASE_URL_VARIABLE
from services.common.files import write_atomically
from services.common.tls import SERVICE_IDENTITIES, WORKER_ISSUER, DevCertificateAuthority
from services.db.accounts import grant_service_accounts, service_passwords
from services.db.database import Database, DatabaseConfig
from services.db.migrations import migrate
from services.db.server import PrivateMariaDB
from services.db.store import JobStore

ADMIN = "admin"


@dataclasses.dataclass(frozen=True)
class UpConfig:
    """What `corral up` runs."""

    data_dir: Path
    """Database, certificates, blobs and logs (kept across restarts)."""
    database_url: str | None = None
    """Use this database instead of a private MariaDB in the data directory."""
    n_drivers: int = 2
    """One leads, the others stand by."""
    client_config: Path | None = None
    """Where to write the CLI configuration (default: the CLI's own default)."""
    worker_cores: int | None = None
    """Cores each local worker declares, in every local pool (None: keep the stored setting, 2 at first)."""
    max_workers: int | None = None
    """Most local workers of each pool at once (None: keep the stored setting)."""
    heartbeat_timeout_s: float | None = None
    """Seconds without a session or heartbeat before a worker is declared dead (None: the driver's default)."""
    idle_timeout_s: float | None = None
    """Seconds a worker stays up with nothing to run (None: the driver's default)."""
    trace: bool = False
    """Trace every service to `<data_dir>/traces/<service>-<pid>.jsonl` (OpenTelemetry spans as JSON lines)."""
    storage_roots: tuple[str, ...] | None = None
    """URL templates jobs' files must lie under (`{project}`: the billing project); None: one per project
    in the data directory, `file://<data_dir>/storage/{project}/`."""
    callback_allow_networks: tuple[str, ...] = ()
    """Networks (CIDR) completion callbacks may reach although they are not public (e.g. 127.0.0.0/8)."""
    unisolated_dev: bool = False
    """When not root, let local workers run jobs unisolated as this user instead of refusing them
    (development only: a job can then read everything the services can)."""


def _ephemeral_ports() -> range:
    """The kernel's range for port-0 binds and outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range.

    The service binds it a moment later. A port the kernel handed out (port 0)
    could by then be the source port of any outgoing connection on the
    machine, and a driver died on exactly that; ports below the ephemeral
    range are only ever taken by a listener that asks for one by number. If
    one does, the service reports it and `corral up` stops with its log named.
    """
    ephemeral = _ephemeral_ports()
    candidates = [port for port in range(10000, 32768) if port not in ephemeral]
    for port in random.sample(candidates, min(200, len(candidates))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclasses.dataclass
class Running:
    """What `corral up` started, in start order."""

    processes: list[tuple[str, subprocess.Popen[bytes]]] = dataclasses.field(default_factory=list)
    mariadb: PrivateMariaDB | None = None
    endpoints: dict[str, str] = dataclasses.field(default_factory=dict)
    admin_token: str = ""

    def stop(self) -> None:
        """SIGTERM each process (newest first) by pid and wait; then the database."""
        for name, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for name, process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.mariadb is not None:
            self.mariadb.stop()


def _spawn(running: Running, name: str, args: list[str], log_dir: Path, env: dict[str, str]) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT, env=env)
    running.processes.append((name, process))


def _certificates(data: Path) -> tuple[DevCertificateAuthority, dict[str, Path]]:
    """The CA (kept in DATA/ca, 0700) and a directory per service holding only its own key and
    certificate; the drivers' also holds the worker issuer. A data directory from before keeps its CA:
    DATA/certs, which held the CA's key beside every service's, becomes DATA/ca."""
    ca_dir, certs = data / "ca", data / "certs"
    if not ca_dir.exists() and (certs / "ca.key").exists():
        certs.rename(ca_dir)
    ca = DevCertificateAuthority(ca_dir)
    ca.ensure()
    certs.mkdir(exist_ok=True)
    certs.chmod(0o700)
    dirs = {}
    for identity in SERVICE_IDENTITIES:
        dirs[identity] = ca.provision(identity, certs / identity).key.parent
    ca.provision(WORKER_ISSUER, dirs["driver"])
    write_atomically(data / "ca.pem", ca.ca_cert_path.read_bytes(), 0o644)
    return ca, dirs


def _service_databases(admin_url: str, data: Path) -> dict[str, str]:
    """Each service's own database account (created or updated now) and its URL."""
    configs = grant_service_accounts(DatabaseConfig.from_url(admin_url), service_passwords(data / "secrets"))
    return {service: config.to_url() for service, config in configs.items()}


def _wait_for(path: Path, running: Running, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        for name, process in running.processes:
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}; see its log")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path.name} did not appear in {timeout_s} s")
        time.sleep(0.05)
    return json.loads(path.read_text())


async def _bootstrap(database_url: str) -> str:
    """An administrator with a fresh token, and a default billing project."""
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        _, token = await AuthStore(db).ensure_admin(ADMIN)
        if await db.fetchone("SELECT 1 AS x FROM billing_projects WHERE name = 'default'") is None:
            await JobStore(db).create_billing_project("default", [ADMIN])
        return token
    finally:
        await db.close()


async def _configure_pools(database_url: str, worker_cores: int | None, max_workers: int | None) -> None:
    """Store the shape of the local pools (operator settings, kept across restarts): each
    worker's cores (its memory scaled to keep the pool's memory per core) and the most
    workers per pool."""
    if worker_cores is None and max_workers is None:
        return
    db = await Database.connect(DatabaseConfig.from_url(database_url))
    try:
        local_pools = "WHERE is_pool AND provider = 'local'"
        if worker_cores is not None:
            # MySQL assigns left to right: memory is scaled by the old core count.
            await db.execute(f"UPDATE instance_collections SET worker_memory_bytes = worker_memory_bytes DIV "
                             f"worker_cores * %s, worker_cores = %s {local_pools}",
                             (worker_cores, worker_cores), name="up_pool_cores")
        if max_workers is not None:
            await db.execute(f"UPDATE instance_collections SET max_instances = %s, max_live_instances = %s "
                             f"{local_pools}", (max_workers, max_workers), name="up_pool_size")
    finally:
        await db.close()


def _storage_roots(config: UpConfig, data: Path) -> tuple[str, ...]:
    """The storage root templates; by default each project's directory under `data/storage`, which
    only this account may enter (workers create the project directories in it as outputs arrive)."""
    if config.storage_roots is not None:
        return config.storage_roots
    storage = (data / "storage").resolve()
    storage.mkdir(mode=0o700, parents=True, exist_ok=True)
    storage.chmod(0o700)
    return (f"file://{storage}/{{project}}/",)


def start(config: UpConfig) -> Running:
    """Bring everything up; on failure, stop what was started and re-raise."""
    data = config.data_dir.expanduser()
    os.umask(0o077)  # everything created here is private to this account, unless made otherwise on purpose
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o711)
    running = Running()
    try:
        if config.database_url:
            database_url = config.database_url
        else:
            running.mariadb = PrivateMariaDB(data / "mariadb", fast_unsafe=False)
            server = running.mariadb.start()
            database_url = dataclasses.replace(server, database="corral").to_url()
        migrate(DatabaseConfig.from_url(database_url), create_database=True)
        service_urls = _service_databases(database_url, data)
        ca, certs = _certificates(data)
        run_dir = data / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob("*.ports"):
            stale.unlink()
        logs, blobs = data / "logs", f"file://{data / 'blobs'}"
        urls = [*(a for root in _storage_roots(config, data) for a in ("--storage-root", root)),
                "--callback-allow-networks", ",".join(config.callback_allow_networks)]
        asyncio.run(_configure_pools(database_url, config.worker_cores, config.max_workers))
        env = dict(os.environ)
        env.pop(DATABASE_URL_VARIABLE, None)
        if config.trace:
            # Every service, and every worker a driver starts (they inherit it), writes its own file.
            env["CORRAL_TRACE_EXPORTER"] = f"file:{data / 'traces'}/{{service}}-{{pid}}.jsonl"

        def service_env(service: str) -> dict[str, str]:
            """The environment of one service: its own database URL (never on the command line)."""
            return {**env, DATABASE_URL_VARIABLE: service_urls[service]}

        session = []
        if config.heartbeat_timeout_s is not None:
            session += ["--heartbeat-timeout", str(config.heartbeat_timeout_s),
                        "--heartbeat-interval", str(min(5.0, config.heartbeat_timeout_s / 3))]
        if config.idle_timeout_s is not None:
            session += ["--idle-timeout", str(config.idle_timeout_s)]
        if config.unisolated_dev:
            session += ["--unisolated-dev-workers"]

        auth_public, auth_internal = free_port(), free_port()
        _spawn(running, "auth", ["services.auth", "--certs-dir", str(certs["auth"]),
                                 "--public-address", f"127.0.0.1:{auth_public}",
                                 "--internal-address", f"127.0.0.1:{auth_internal}",
                                 "--ports-file", str(run_dir / "auth.ports")], logs, service_env("auth"))
        driver_ports = [free_port() for _ in range(config.n_drivers)]
        driver_addresses = ",".join(f"localhost:{p}" for p in driver_ports)
        for i, port in enumerate(driver_ports):
            _spawn(running, f"driver-{i}", ["services.driver", "--certs-dir", str(certs["driver"]),
                                            "--spec-root-url", blobs,
                                            "--data-dir", str(data), "--internal-address", f"127.0.0.1:{port}",
                                            "--driver-addresses", driver_addresses, *session, *urls,
                                            "--ports-file", str(run_dir / f"driver-{i}.ports")], logs,
                   service_env("driver"))
        frontend = free_port()
        _spawn(running, "frontend", ["services.frontend", "--certs-dir", str(certs["frontend"]),
                                     "--auth-address", f"localhost:{auth_internal}",
                                     "--spec-root-url", blobs, "--public-address", f"127.0.0.1:{frontend}",
                                     "--driver-addresses", driver_addresses, *urls,
                                     "--ports-file", str(run_dir / "frontend.ports")], logs, service_env("frontend"))
        for name in ["auth", *(f"driver-{i}" for i in range(config.n_drivers)), "frontend"]:
            _wait_for(run_dir / f"{name}.ports", running)
        running.admin_token = asyncio.run(_bootstrap(database_url))
        running.endpoints = {"frontend": f"localhost:{frontend}", "auth": f"localhost:{auth_public}",
                             "drivers": driver_addresses, "database": _without_password(database_url),
                             "ca_cert": str(data / "ca.pem"), "logs": str(logs)}
        _write_client_config(config, running)
        return running
    except BaseException:
        running.stop()
        raise


def _without_password(url: str) -> str:
    """A database URL fit to print: the administrator's password is in DATA/mariadb/admin.password."""
    parsed = DatabaseConfig.from_url(url)
    return dataclasses.replace(parsed, password="").to_url() if parsed.password else url


def _write_client_config(config: UpConfig, running: Running) -> None:
    from corral.cli_batches import Settings  # the CLI's own file format

    if config.client_config is not None:
        os.environ["CORRAL_CONFIG"] = str(config.client_config)
    Settings(frontend=running.endpoints["frontend"], auth=running.endpoints["auth"],
             ca_cert=running.endpoints["ca_cert"], token=running.admin_token).save()


class DatabaseWatch:
    """Restarts the private MariaDB when it dies (out of memory, killed), with a growing pause
    between attempts (1 s, doubling, at most 60 s). The services keep running meanwhile: their
    health says NOT_SERVING and calls fail UNAVAILABLE until it is back."""

    def __init__(self, mariadb: PrivateMariaDB | None, clock: Callable[[], float] = time.monotonic):
        self._mariadb = mariadb
        self._clock = clock
        self._next_try = 0.0
        self._pause_s = 1.0
        self.restarts = 0

    def check(self) -> None:
        """Restart the server if it died and its pause is over; log what happened."""
        mariadb = self._mariadb
        if mariadb is None or mariadb.alive() or self._clock() < self._next_try:
            return
        code = mariadb.process.returncode if mariadb.process is not None else None
        print(f"mariadb exited with {code}; restarting it ({mariadb.error_log().strip().splitlines()[-1:]})",
              file=sys.stderr, flush=True)
        try:
            mariadb.start()
        except Exception as e:  # noqa: BLE001 - reported, tried again after the pause
            print(f"mariadb did not restart: {e}; trying again in {self._pause_s:g} s", file=sys.stderr, flush=True)
            self._next_try = self._clock() + self._pause_s
            self._pause_s = min(60.0, self._pause_s * 2)
            return
        self.restarts += 1
        self._pause_s = 1.0
        print("mariadb is back", file=sys.stderr, flush=True)


def serve_forever(config: UpConfig) -> int:
    """Start, print the endpoints, wait for Ctrl-C or SIGTERM, stop everything."""
    running = start(config)
    stop = {"now": False}

    def request_stop(signum: int, frame: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    print("corral is up.")
    for name, value in running.endpoints.items():
        print(f"  {name:<9} {value}")
    print(f"  admin token: {running.admin_token}")
    print("The CLI is configured as the administrator (billing project 'default'); Ctrl-C stops everything.",
          flush=True)
    database = DatabaseWatch(running.mariadb)
    with contextlib.suppress(KeyboardInterrupt):
        while not stop["now"]:
            for name, process in running.processes:
                if process.poll() is not None:
                    print(f"{name} exited with {process.returncode}; stopping", file=sys.stderr)
                    stop["now"] = True
            database.check()
            time.sleep(0.2)
    running.stop()
    print("corral stopped.")
    return 0
