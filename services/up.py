"""`corral up`: the whole system on one machine, each service its own process.

Starts (or connects to) MariaDB, applies migrations, keeps a development CA,
starts auth, the frontend, a leading driver and a standby on loopback, makes
sure an administrator and a `default` billing project exist, writes the CLI
configuration, prints the endpoints and an admin token, and stops every
process it started, by pid, on Ctrl-C or SIGTERM. State lives in the data
directory and survives restarts.
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
from pathlib import Path

from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
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


def start(config: UpConfig) -> Running:
    """Bring everything up; on failure, stop what was started and re-raise."""
    data = config.data_dir.expanduser()
    running = Running()
    try:
        if config.database_url:
            database_url = config.database_url
        else:
            running.mariadb = PrivateMariaDB(data / "mariadb", fast_unsafe=False)
            server = running.mariadb.start()
            database_url = dataclasses.replace(server, database="corral").to_url()
        migrate(DatabaseConfig.from_url(database_url), create_database=True)
        certs = DevCertificateAuthority(data / "certs")
        certs.ensure()
        run_dir = data / "run"
        run_dir.mkdir(parents=True, exist_ok=True)
        for stale in run_dir.glob("*.ports"):
            stale.unlink()
        logs, blobs = data / "logs", f"file://{data / 'blobs'}"
        common = ["--database-url", database_url, "--certs-dir", str(certs.directory)]
        asyncio.run(_configure_pools(database_url, config.worker_cores, config.max_workers))
        env = dict(os.environ)
        if config.trace:
            # Every service, and every worker a driver starts (they inherit it), writes its own file.
            env["CORRAL_TRACE_EXPORTER"] = f"file:{data / 'traces'}/{{service}}-{{pid}}.jsonl"
        session = []
        if config.heartbeat_timeout_s is not None:
            session += ["--heartbeat-timeout", str(config.heartbeat_timeout_s),
                        "--heartbeat-interval", str(min(5.0, config.heartbeat_timeout_s / 3))]
        if config.idle_timeout_s is not None:
            session += ["--idle-timeout", str(config.idle_timeout_s)]
        if config.unisolated_dev:
            session += ["--unisolated-dev-workers"]

        auth_public, auth_internal = free_port(), free_port()
        _spawn(running, "auth", ["services.auth", *common, "--public-address", f"127.0.0.1:{auth_public}",
                                 "--internal-address", f"127.0.0.1:{auth_internal}",
                                 "--ports-file", str(run_dir / "auth.ports")], logs, env)
        driver_ports = [free_port() for _ in range(config.n_drivers)]
        driver_addresses = ",".join(f"localhost:{p}" for p in driver_ports)
        for i, port in enumerate(driver_ports):
            _spawn(running, f"driver-{i}", ["services.driver", *common, "--spec-root-url", blobs,
                                            "--data-dir", str(data), "--internal-address", f"127.0.0.1:{port}",
                                            "--driver-addresses", driver_addresses, *session,
                                            "--ports-file", str(run_dir / f"driver-{i}.ports")], logs, env)
        frontend = free_port()
        _spawn(running, "frontend", ["services.frontend", *common, "--auth-address", f"localhost:{auth_internal}",
                                     "--spec-root-url", blobs, "--public-address", f"127.0.0.1:{frontend}",
                                     "--driver-addresses", driver_addresses,
                                     "--ports-file", str(run_dir / "frontend.ports")], logs, env)
        for name in ["auth", *(f"driver-{i}" for i in range(config.n_drivers)), "frontend"]:
            _wait_for(run_dir / f"{name}.ports", running)
        running.admin_token = asyncio.run(_bootstrap(database_url))
        running.endpoints = {"frontend": f"localhost:{frontend}", "auth": f"localhost:{auth_public}",
                             "drivers": driver_addresses, "database": database_url,
                             "ca_cert": str(certs.ca_cert_path), "logs": str(logs)}
        _write_client_config(config, running)
        return running
    except BaseException:
        running.stop()
        raise


def _write_client_config(config: UpConfig, running: Running) -> None:
    from corral.cli_batches import Settings  # the CLI's own file format

    if config.client_config is not None:
        os.environ["CORRAL_CONFIG"] = str(config.client_config)
    Settings(frontend=running.endpoints["frontend"], auth=running.endpoints["auth"],
             ca_cert=running.endpoints["ca_cert"], token=running.admin_token).save()


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
    with contextlib.suppress(KeyboardInterrupt):
        while not stop["now"]:
            for name, process in running.processes:
                if process.poll() is not None:
                    print(f"{name} exited with {process.returncode}; stopping", file=sys.stderr)
                    stop["now"] = True
            time.sleep(0.2)
    running.stop()
    print("corral stopped.")
    return 0
