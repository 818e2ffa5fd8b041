"""`corral up`: the whole system on one machine, each service its own process.

Starts (or connects to) MariaDB, applies migrations, gives each service its
own database account, keeps a development CA and gives each service its own
certificate directory, starts auth, the frontend, a leading driver and a
standby on loopback, an OCI registry on loopback seeded with the images the
quickstart and tests use (services.registry; unless `--registry` names
another), makes sure an administrator and a `default` billing project exist,
writes the CLI's `admin` profile, prints the endpoints and an admin token,
then supervises (services.up_supervisor: a part that dies is started again
with back-off) until Ctrl-C or SIGTERM, or until a part cannot be kept
running, and stops every process it started, by pid, saying what it waits
for. Nothing it started outlives it, however it ends: each part dies
with it (PR_SET_PDEATHSIG), each worker when its lifeline closes
(services.common.lifeline), and a restarted `corral up` ends what a killed
one left, from the pid files in DATA/run/pids. State lives in the data
directory and survives restarts.

The data directory (docs/security.md):

    DATA/            0711: other accounts may pass through (to a job's own directory), not list
      ca.pem         the CA certificate, for clients
      ca/            0700: the CA and its key; only this process reads it
      certs/NAME/    0700: one per service: ca.pem and its own certificate and key; the drivers' also the
                     key that opens job secrets, the frontend's its public half (which seals them)
      secrets/       0700: the database passwords (admin and one per service) and job-secrets.key, the key
                     pair job secrets are sealed for (made once: without it no stored secret opens)
      mariadb/       0700: the private server, its data and its socket
      registry/      0700: the loopback registry's two processes (pull: read-only, push), their storage/, logins/
                     (0700: the pull and push logins, only this account's) and seed/ (the seed images' build)
      run/           the ports files, up.lock (one `corral up` per data directory), pids/ (a pid file per process)
      blobs/ logs/ workers/ ...   created by the services, private to them (umask 077)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import socket
import sys
import time
from pathlib import Path

from corral.cli_config import ADMIN_PROFILE, Profile, write_server_profile
from services import up_gateway
from services.auth.store import AuthStore
from services.common.entry import DATABASE_URL_VARIABLE
from services.common.files import write_atomically
from services.common.lifeline import Lifeline
from services.common.parent_death import launcher
from services.common.processes import PidFiles, Recorded, end_processes
from services.common.sealing import ensure_key_files
from services.common.storage_access import StorageAccess
from services.common.worker_limits import WorkerLimits, deployment_of_data_dir
from services.common.tls import SERVICE_IDENTITIES, WORKER_ISSUER, DevCertificateAuthority
from services.db.accounts import grant_service_accounts, service_passwords
from services.db.database import Database, DatabaseConfig
from services.db.migrations import migrate
from services.db.store import JobStore
from services.driver.leader import LeaseSettings
from services.gateway.deployment import Limits
from services.registry.local import LocalRegistry
from services.registry.seed import seed
from services.up_supervisor import (
    DatabaseServer,
    RestartPolicy,
    ServiceProcess,
    Supervisor,
    end_leftovers,
    exit_description,
    lock_data_dir,
)
from services.worker.oci.runtime import host_refusals as oci_host_refusals

ADMIN = "admin"
DEFAULT_GATEWAY_PORT = 8443
"""Where people reach corral with --gateway (envoy/local.yaml's public_listen)."""
DEFAULT_INTERNAL_GATEWAY_PORT = 8444
"""Where workers reach the leading driver with --gateway (envoy/local.yaml's internal_listen)."""


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
    storage_access: StorageAccess = StorageAccess()
    """How workers reach gs:// and az:// storage roots: handed to the drivers, which hand it to each
    worker they start (paths of the secret files; only workers read them)."""
    unisolated_dev: bool = False
    """When not root, let local workers run jobs unisolated as this user instead of refusing them
    (development only: a job can then read everything the services can)."""
    restart_policy: RestartPolicy = RestartPolicy()
    """When a process that died is started again, and when `corral up` gives up and stops."""
    registry_url: str | None = None
    """The workers' default registry (`http://host:port` for plain HTTP, else HTTPS), instead of running
    and seeding one in the data directory."""
    allowed_registries: tuple[str, ...] = ()
    """Registries (`host[:port]`) jobs' images may come from although they are not public (the frontend's and
    the drivers' --allowed-registries); the default registry is allowed anyway."""
    worker_runtime: str = "auto"
    """How local workers run jobs: process, oci (runc containers) or auto (oci where the machine can)."""
    metrics: bool = False
    """Every service and worker serves Prometheus metrics on a loopback port; the scrape targets are kept in
    `<data_dir>/metrics/targets.json` (Prometheus file_sd), workers coming and going."""
    gateway: bool = False
    """Run the public and internal Envoy gateways (services.up_gateway): people (the CLI profile, the printed
    address) reach corral only through the public one, workers the leading driver only through the internal
    one."""
    gateway_port: int = DEFAULT_GATEWAY_PORT
    """The public gateway's port on 127.0.0.1, the same at each start (0: a free one, chosen at each start)."""
    internal_gateway_port: int = DEFAULT_INTERNAL_GATEWAY_PORT
    """The internal gateway's port on 127.0.0.1 (0: a free one, chosen at each start)."""
    provider: str = "local"
    """Who makes the workers' machines (the drivers' --provider): local, gcp or azure. A cloud's machines
    enroll and reach the drivers through the internal gateway, so they need `gateway`."""
    provider_config: Path | None = None
    """The cloud's JSON configuration (the drivers' --provider-config), with a cloud provider."""
    gateway_limits: Limits = Limits()
    """What the gateways hold clients to (connections, timeouts, sizes); the connection cap is lowered to what
    this process may give Envoy in file descriptors (services.gateway.envoy_process.fitting)."""
    worker_limits: WorkerLimits | None = None
    """What jobs may take of the workers' hosts (processes, how often storage is checked), handed to the drivers
    for every worker they start; None: the defaults, the deployment named after the data directory
    (services.common.worker_limits.deployment_of_data_dir)."""


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
    one does, the service reports it and `corral up` stops with its log named;
    a service keeps its port when it is restarted, and if something took it
    meanwhile, the restarts fail and `corral up` gives up (services.up_supervisor).
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
    """What `corral up` started."""

    supervisor: Supervisor
    """Every process it runs, as parts, in start order."""
    lifeline: Lifeline
    """Held until everything is stopped: workers end when it closes (services.common.lifeline)."""
    lock_fd: int
    """The data directory's lock, held while this `corral up` runs."""
    endpoints: dict[str, str] = dataclasses.field(default_factory=dict)
    metrics_dir: Path | None = None
    """Where every process writes its metrics port (`NAME.port`) and `targets.json` lists them; None: no
    metrics."""
    admin_token: str = ""
    cli_profile: str = ""
    """The CLI's current profile once the `admin` profile is written (the user's own, if they had one)."""
    gateway: str | None = None
    """The public gateway's address (`localhost:PORT`) with --gateway: corral's one address for people."""

    def stop(self) -> None:
        """Stop everything, each step saying what it waits for; then let go of the data directory."""
        supervisor, pid_files = self.supervisor, self.supervisor.pid_files
        names = [part.name for part in supervisor.parts]
        # The public gateway and the frontend first: no new work comes in.
        supervisor.end(["gateway-public", "frontend"], SERVICE_GRACE_S)
        # Every worker, while the drivers still serve, so that each deactivates itself cleanly: found
        # from their pid files, as some were started by a driver that has died since.
        workers = [Recorded(record) for record in pid_files.live("worker-")]
        if workers:
            end_processes(workers, WORKER_GRACE_S, supervisor.say)
        # The internal gateway once no worker needs it (they deactivate through it).
        supervisor.end(["gateway-internal"], SERVICE_GRACE_S)
        # The drivers (each stops any worker of its own still there), then auth.
        supervisor.end([name for name in names if name.startswith("driver-")], SERVICE_GRACE_S)
        supervisor.end(["auth"], SERVICE_GRACE_S)
        supervisor.end(["registry", "registry-push"], SERVICE_GRACE_S)  # no worker is left to pull from it
        # Whatever else a pid file names and still runs (a worker started during the steps above).
        leftovers = [Recorded(record) for record in pid_files.live() if record.name != "mariadb"]
        if leftovers:
            end_processes(leftovers, WORKER_GRACE_S, supervisor.say)
        # The database last: every service's last write reaches it.
        supervisor.end(["mariadb"], DATABASE_GRACE_S)
        self.lifeline.close()
        os.close(self.lock_fd)


SERVICE_GRACE_S = 20.0
"""How long a service may take to stop on SIGTERM before it is killed."""
WORKER_GRACE_S = 20.0
"""How long a worker may take to stop (it kills its jobs and deactivates) before it is killed."""
DATABASE_GRACE_S = 60.0
"""How long MariaDB may take to shut down cleanly before it is killed."""
DRIVER_FIRST_RESTART_S = 3 * LeaseSettings().renew_s
"""Pause before a dead driver is first started again, when there is a standby: three of the standbys'
looks. A dead leader's database connection closes with it, and a standby takes its lease over at its
next look (services.driver.leader), so the standby leads before the restarted driver campaigns, rather
than the two racing for the lease."""


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


GATEWAY_TOKEN_FILE = "gateway.token"
"""In auth's certificate directory: the secret the public gateway adds to the calls it forwards to auth, made
anew at each start (its config holds it too, in DATA/gateway, 0600)."""
REGISTRY_LOGIN = "registry-login.json"
"""In the drivers' certificate directory: the pull login of corral up's registry, which the local provider
copies into each worker's certificate directory (services.registry.local)."""
SECRETS_KEY = "job-secrets.key"
SECRETS_PUBLIC_KEY = "job-secrets.pub"


def _secrets_keys(data: Path, certs: dict[str, Path]) -> tuple[Path, Path]:
    """The key pair job secrets are sealed for: made once in DATA/secrets (never replaced: every stored secret
    needs it), its private half copied into the drivers' directory (they alone open secrets), its public half
    into the frontend's (it seals them and cannot open them). Returns (drivers' key, frontend's key)."""
    keys = data / "secrets"
    keys.mkdir(mode=0o700, exist_ok=True)
    private, public = certs["driver"] / SECRETS_KEY, certs["frontend"] / SECRETS_PUBLIC_KEY
    ensure_key_files(keys / SECRETS_KEY, public)
    write_atomically(private, (keys / SECRETS_KEY).read_bytes(), 0o600)
    return private, public


def _service_databases(admin_url: str, data: Path) -> dict[str, str]:
    """Each service's own database account (created or updated now) and its URL."""
    configs = grant_service_accounts(DatabaseConfig.from_url(admin_url), service_passwords(data / "secrets"))
    return {service: config.to_url() for service, config in configs.items()}


def _check_started(supervisor: Supervisor) -> None:
    """Raise if a part died while `corral up` starts (nothing is restarted before it is up)."""
    for part in supervisor.parts:
        status = part.exit_status()
        if status is not None:
            raise RuntimeError(f"{part.name} exited with {exit_description(status)}; {part.last_words()}")


def _wait_for(path: Path, supervisor: Supervisor, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        _check_started(supervisor)
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
    if problems := config.storage_access.problems():
        raise ValueError("object storage settings: " + "; ".join(problems))
    data = config.data_dir.expanduser()
    worker_limits = config.worker_limits or WorkerLimits(deployment=deployment_of_data_dir(data))
    if problems := worker_limits.problems():
        raise ValueError("job limits: " + "; ".join(problems))
    os.umask(0o077)  # everything created here is private to this account, unless made otherwise on purpose
    data.mkdir(parents=True, exist_ok=True)
    data.chmod(0o711)
    run_dir = data / "run"
    lock_fd = lock_data_dir(run_dir)
    pid_files = PidFiles(run_dir / "pids")
    supervisor = Supervisor(pid_files, config.restart_policy)
    running = Running(supervisor, Lifeline(), lock_fd)
    try:
        end_leftovers(pid_files, supervisor.say)
        # No worker runs now: the keys of those of an earlier run (that did not exit cleanly) go too.
        shutil.rmtree(data / "worker-certs", ignore_errors=True)
        if config.database_url:
            database_url = config.database_url
        else:
            database = DatabaseServer.in_data_dir(data / "mariadb")
            supervisor.start(database)
            assert database.admin is not None
            database_url = dataclasses.replace(database.admin, database="corral").to_url()
        migrate(DatabaseConfig.from_url(database_url), create_database=True)
        service_urls = _service_databases(database_url, data)
        ca, certs = _certificates(data)
        secrets_key, secrets_public_key = _secrets_keys(data, certs)
        for stale in run_dir.glob("*.ports"):
            stale.unlink()
        logs, blobs = data / "logs", f"file://{data / 'blobs'}"
        urls = [*(a for root in _storage_roots(config, data) for a in ("--storage-root", root)),
                "--callback-allow-networks", ",".join(config.callback_allow_networks)]
        asyncio.run(_configure_pools(database_url, config.worker_cores, config.max_workers))
        registry_login: list[str] = []
        if config.registry_url is not None:
            registry, registry_url = None, config.registry_url
        else:
            # Started now and seeded while the services start: it adds little to the time to ready.
            registry = LocalRegistry.prepare(data / "registry", free_port, launcher(), logs)
            for server in registry.servers:
                supervisor.start(server)
            registry_url = registry.pull.url
            # The drivers hand the pull login to their workers (as they hand them certificates).
            write_atomically(certs["driver"] / REGISTRY_LOGIN, registry.pull_login_file.read_bytes(), 0o600)
            registry_login = ["--default-registry-login-file", str(certs["driver"] / REGISTRY_LOGIN)]
        allowed = ["--allowed-registries", ",".join(config.allowed_registries)]
        env = dict(os.environ)
        env.pop(DATABASE_URL_VARIABLE, None)
        if config.trace:
            # Every service, and every worker a driver starts (they inherit it), writes its own file.
            env["CORRAL_TRACE_EXPORTER"] = f"file:{data / 'traces'}/{{service}}-{{pid}}.jsonl"

        if config.metrics:
            running.metrics_dir = data / "metrics"
            shutil.rmtree(running.metrics_dir, ignore_errors=True)  # an earlier run's ports
            running.metrics_dir.mkdir()
            # The scraper's client certificate: every metrics port answers only a certificate of the CA.
            metrics_certs = ca.provision(METRICS_IDENTITY, data / "certs" / METRICS_IDENTITY).key.parent

        def service(name: str, module: str, account: str, args: list[str], lifeline: bool = False,
                    policy: RestartPolicy | None = None) -> None:
            """Start `python -m MODULE ARGS` as part NAME, with its own database URL in its environment
            (never on the command line); with `lifeline`, it hands the lifeline on to its workers."""
            ports = run_dir / f"{name}.ports"
            if running.metrics_dir is not None:  # a port of its own, kept across restarts as its others are
                args = [*args, "--metrics-address", f"127.0.0.1:{free_port()}",
                        "--metrics-port-file", str(running.metrics_dir / f"{name}.port")]
            part_env = {**env, DATABASE_URL_VARIABLE: service_urls[account]}
            if lifeline:
                part_env.update(running.lifeline.environment())
            supervisor.start(ServiceProcess(name, [sys.executable, "-m", module, *args, "--ports-file", str(ports)],
                                            logs / f"{name}.log", part_env, ready_file=ports,
                                            pass_fds=(running.lifeline.read_fd,) if lifeline else ()),
                             policy)

        session = []
        if config.heartbeat_timeout_s is not None:
            session += ["--heartbeat-timeout", str(config.heartbeat_timeout_s),
                        "--heartbeat-interval", str(min(5.0, config.heartbeat_timeout_s / 3))]
        if config.idle_timeout_s is not None:
            session += ["--idle-timeout", str(config.idle_timeout_s)]
        if config.unisolated_dev:
            session += ["--unisolated-dev-workers"]
        session += ["--default-registry", registry_url, *registry_login, *allowed,
                    "--worker-runtime", config.worker_runtime]
        if running.metrics_dir is not None and config.provider == "local":  # a cloud's workers are not here
            session += ["--worker-metrics-dir", str(running.metrics_dir)]

        # Every part keeps its address across restarts: the others were told it once.
        auth_public, auth_internal = free_port(), free_port()
        gateway_token = None
        auth_args = ["--certs-dir", str(certs["auth"]), "--public-address", f"127.0.0.1:{auth_public}",
                     "--internal-address", f"127.0.0.1:{auth_internal}"]
        if config.gateway:
            # Auth counts logins through the gateway by the address the gateway saw, on calls with this token.
            gateway_token = secrets.token_urlsafe(32)
            write_atomically(certs["auth"] / GATEWAY_TOKEN_FILE, gateway_token.encode(), 0o600)
            auth_args += ["--gateway-token-file", str(certs["auth"] / GATEWAY_TOKEN_FILE)]
        service("auth", "services.auth", "auth", auth_args)
        driver_ports = [free_port() for _ in range(config.n_drivers)]
        driver_addresses = ",".join(f"localhost:{p}" for p in driver_ports)
        if config.gateway:
            # Port 0: a free port now, which a restarted gateway keeps (as every part keeps its ports).
            gateway_port = config.gateway_port or free_port()
            internal_gateway_port = config.internal_gateway_port or free_port()
            # The drivers hand this to the workers they start: workers find the leader through the internal
            # gateway alone. (The frontend still tells the drivers of new work directly.)
            workers_driver_addresses = f"localhost:{internal_gateway_port}"
            enroll_port = free_port()
        else:
            workers_driver_addresses = driver_addresses
        cloud = [] if config.provider == "local" else [
            # A cloud's machines enroll at the internal gateway's enrollment listener.
            "--provider", config.provider, "--provider-config", str(config.provider_config),
            "--workers-enroll-address", f"localhost:{enroll_port}"]
        # With a standby, a dead driver comes back once the standby leads: it then stands by in turn.
        driver_policy = (dataclasses.replace(config.restart_policy, first_restart_s=DRIVER_FIRST_RESTART_S)
                         if config.n_drivers > 1 else None)
        for i, port in enumerate(driver_ports):
            service(f"driver-{i}", "services.driver", "driver",
                    ["--certs-dir", str(certs["driver"]), "--spec-root-url", blobs, "--data-dir", str(data),
                     "--internal-address", f"127.0.0.1:{port}", "--driver-addresses", workers_driver_addresses,
                     "--secrets-key-file", str(secrets_key), *session, *urls, *config.storage_access.to_args(),
                     *worker_limits.to_args(), *cloud],
                    lifeline=True, policy=driver_policy)
        frontend = free_port()
        service("frontend", "services.frontend", "frontend",
                ["--certs-dir", str(certs["frontend"]), "--auth-address", f"localhost:{auth_internal}",
                 "--spec-root-url", blobs, "--public-address", f"127.0.0.1:{frontend}",
                 "--driver-addresses", driver_addresses, "--secrets-public-key-file", str(secrets_public_key),
                 # Behind the gateway, people's reflection reaches the frontend alone.
                 *(["--reflect-also", "corral.auth.v1.AuthService"] if config.gateway else []), *urls,
                 "--default-registry", registry_url, *allowed])
        if registry is not None:
            registry.wait_ready()
            for seeded in seed(registry.push.address, data / "registry" / "seed", login=registry.push_login):
                if seeded.pushed:  # pushed through the push registry; workers pull it from the other
                    image = seeded.reference.split("/", 1)[1]
                    supervisor.say(f"registry: seeded {registry.pull.address}/{image} ({seeded.digest})")
        for name in ["auth", *(f"driver-{i}" for i in range(config.n_drivers)), "frontend"]:
            _wait_for(run_dir / f"{name}.ports", supervisor)
        public = {"frontend": f"localhost:{frontend}", "auth": f"localhost:{auth_public}"}
        if config.gateway:
            plan = up_gateway.deployment(data, certs["gateway"], public_port=gateway_port,
                                         internal_port=internal_gateway_port, auth_port=auth_public,
                                         frontend_ports=[frontend], driver_ports=driver_ports,
                                         stats_ports=(free_port(), free_port()) if running.metrics_dir else None,
                                         auth_token=gateway_token, enroll_port=enroll_port,
                                         limits=config.gateway_limits)
            up_gateway.start_gateways(plan, supervisor, data, logs, lambda: _check_started(supervisor),
                                      running.metrics_dir)
            running.gateway = f"localhost:{gateway_port}"
            public = {"frontend": running.gateway, "auth": running.gateway, "gateway": running.gateway,
                      "workers_gateway": workers_driver_addresses}
            if plan.enroll_listen is not None:  # cloud workers enroll here (local ones are given a certificate)
                public["workers_enroll"] = f"localhost:{plan.enroll_listen.port}"
        running.admin_token = asyncio.run(_bootstrap(database_url))
        running.endpoints = {**public,
                             "drivers": driver_addresses, "database": _without_password(database_url),
                             "registry": registry_url,
                             "ca_cert": str(data / "ca.pem"), "logs": str(logs)}
        if running.metrics_dir is not None:
            running.endpoints["metrics"] = str(write_metrics_targets(running.metrics_dir))
            running.endpoints["metrics_certs"] = str(metrics_certs)
        _write_client_config(config, running)
        return running
    except BaseException:
        _defer_stop_signals()
        running.stop()
        raise


def _without_password(url: str) -> str:
    """A database URL fit to print: the administrator's password is in DATA/mariadb/admin.password."""
    parsed = DatabaseConfig.from_url(url)
    return dataclasses.replace(parsed, password="").to_url() if parsed.password else url


def _write_client_config(config: UpConfig, running: Running) -> None:
    """The CLI's `admin` profile; the user's own profiles of this server follow its new ports, and the
    current profile stays current (corral.cli_config)."""
    running.cli_profile = write_server_profile(
        Profile(frontend=running.endpoints["frontend"], auth=running.endpoints["auth"],
                ca_cert=running.endpoints["ca_cert"], token=running.admin_token, user=ADMIN),
        ADMIN_PROFILE, config.client_config)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What asks `corral up` to stop (SIGHUP: its terminal went away)."""

EXIT_STOPPED = 0
"""Stopped because it was asked to (Ctrl-C, SIGTERM, SIGHUP)."""
EXIT_FAILED = 1
"""Stopped because a part could not be kept running, or it could not start."""
EXIT_INTERRUPTED = 130
"""Asked to stop while still starting."""


def _defer_stop_signals(requests: list[int] | None = None) -> None:
    """From now on a stop signal is only noted (in `requests`): it cannot cut a stop short."""

    def note(signum: int, frame: object) -> None:
        if requests is not None:
            requests.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, note)


def jobs_runtime_line(worker_runtime: str) -> str:
    """Where the local workers' jobs run, in one line of `corral up`'s output."""
    if worker_runtime == "process":
        return "Jobs run in the process runtime (--worker-runtime process): as users of their own, not in containers."
    if why_not := oci_host_refusals():
        return f"Jobs run in the process runtime, not in containers: {'; '.join(why_not)}."
    return "Jobs run in OCI containers (runc) of their images, pulled from the registry."


TARGETS_FILE = "targets.json"
METRICS_IDENTITY = "metrics"
"""The scraper's certificate, in DATA/certs/metrics: every metrics port asks for a client certificate of the
CA. It names no service, so no gRPC service accepts it."""
METRICS_PATHS = {"gateway-": "/stats/prometheus"}
"""Where a part whose name starts with the key serves its metrics, if not at /metrics (a gateway's
statistics listener; Prometheus reads the `__metrics_path__` label)."""


def write_metrics_targets(metrics_dir: Path) -> Path:
    """`metrics_dir/targets.json`, in Prometheus' file_sd format: one target per process that wrote its
    metrics port (`NAME.port`), labelled with its part's name, https (`__scheme__`), and the path of its
    metrics where it is not /metrics (METRICS_PATHS); rewritten only when it changes."""
    targets = []
    for port_file in sorted(metrics_dir.glob("*.port")):
        try:
            port = int(port_file.read_text())
        except (OSError, ValueError):
            continue  # gone meanwhile
        labels = {"part": port_file.stem, "__scheme__": "https"}
        labels.update({"__metrics_path__": path for prefix, path in METRICS_PATHS.items()
                       if port_file.stem.startswith(prefix)})
        targets.append({"targets": [f"127.0.0.1:{port}"], "labels": labels})
    path = metrics_dir / TARGETS_FILE
    text = json.dumps(targets, indent=1)
    if not path.exists() or path.read_text() != text:
        write_atomically(path, text.encode())
    return path


def serve_forever(config: UpConfig) -> int:
    """Start, print the endpoints, supervise until asked to stop or a part cannot be kept running, stop
    everything; the exit code says which (EXIT_*)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # while starting: `start` stops what it started

    for sig in STOP_SIGNALS:
        signal.signal(sig, interrupt)
    try:
        running = start(config)
    except KeyboardInterrupt:
        print("corral up was interrupted while starting; what it had started is stopped.", file=sys.stderr)
        return EXIT_INTERRUPTED
    requests: list[int] = []
    _defer_stop_signals(requests)
    print("corral is up.")
    if running.gateway is not None:
        print(f"corral's address: {running.gateway} (the public gateway: gRPC, and REST at "
              f"https://{running.gateway}/api/v1/..., TLS verified with {running.endpoints['ca_cert']})")
    print(jobs_runtime_line(config.worker_runtime))
    for name, value in running.endpoints.items():
        print(f"  {name:<9} {value}")
    print(f"  admin token: {running.admin_token}")
    if running.cli_profile == ADMIN_PROFILE:
        print(f"The CLI is configured as the administrator (profile '{ADMIN_PROFILE}', billing project 'default'); "
              "Ctrl-C stops everything.", flush=True)
    else:
        print(f"The CLI is configured: profile '{ADMIN_PROFILE}' is the administrator (billing project 'default'), "
              f"'{running.cli_profile}' stays current (`corral profile use {ADMIN_PROFILE}` switches); "
              "Ctrl-C stops everything.", flush=True)
    if running.metrics_dir is not None:
        targets = json.loads((running.metrics_dir / TARGETS_FILE).read_text())
        print("Prometheus metrics: " + ", ".join(f"{t['labels']['part']} https://{t['targets'][0]}"
                                                  f"{t['labels'].get('__metrics_path__', '/metrics')}"
                                                  for t in targets) +
              f"; workers' too, as they come and go, in {running.endpoints['metrics']} (file_sd); "
              f"each asks for the client certificate in {running.endpoints['metrics_certs']}", flush=True)
    supervisor = running.supervisor
    while not requests and supervisor.failed is None:
        supervisor.check()
        if running.metrics_dir is not None:
            write_metrics_targets(running.metrics_dir)
        time.sleep(0.2)
    if requests:
        supervisor.say(f"{signal.Signals(requests[0]).name}: stopping everything")
    running.stop()
    if supervisor.failed is not None:
        print(f"corral stopped: {supervisor.failed}.", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print("corral stopped.", flush=True)
    return EXIT_STOPPED
