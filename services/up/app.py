"""`corral up`'s wiring: the whole system on one machine, each service its own process (`start`), and the
order in which it is all stopped (`Running.stop`).

Starts (or connects to) MariaDB, applies migrations, gives each service its
own database account (services.up.database), keeps a development CA and gives
each service its own certificate directory (services.up.certificates), starts
auth, the frontend, a leading driver and a standby on loopback, an OCI
registry on loopback seeded with the images the quickstart and tests use
(services.registry; unless `--registry` names another), makes sure an
administrator and a `default` billing project exist and writes the CLI's
`admin` profile, with a new admin token. services.up.serve then prints the
endpoints and where that token is (never the token) and supervises
(services.up.supervisor: a part that dies is started again with back-off)
until Ctrl-C or SIGTERM, or until a part cannot be kept running;
`Running.stop` stops every process it started, by pid, saying what it waits
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
      registry/      0700: the loopback registry's two processes (pull: read-only, push), their ports.json (the
                     same at every start), storage/, logins/
                     (0700: the pull and push logins, only this account's) and seed/ (the seed images' build)
      imports/       0700: image archives the frontend is importing (`corral images import`), emptied at start
      run/           the ports files, up.lock (one `corral up` per data directory), pids/ (a pid file per process)
      blobs/ logs/ workers/ ...   created by the services, private to them (umask 077)
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path

from corral.cli_config import ADMIN_PROFILE, Config, Profile, write_server_profile
from services.common.entry import DATABASE_URL_VARIABLE
from services.common.files import write_atomically
from services.common.image_refs import DOCKER_HUB, Mirror
from services.common.lifeline import Lifeline
from services.common.parent_death import launcher
from services.common.prepull import to_args as prepull_args
from services.common.processes import PidFiles, Recorded, end_processes
from services.common.worker_limits import WorkerLimits, deployment_of_data_dir
from services.driver.leader import LeaseSettings
from services.registry.local import LocalRegistry
from services.registry.seed import seed
from services.up import database, gateway
from services.up.certificates import (GATEWAY_TOKEN_FILE, REGISTRY_LOGIN, REGISTRY_PUSH_LOGIN, WEB_IDENTITY,
                                      certificates, secrets_keys)
from services.up.config import UpConfig
from services.up.metrics import METRICS_IDENTITY, write_metrics_targets
from services.up.ports import free_port
from services.up.supervisor import (
    RestartPolicy,
    ServiceProcess,
    Supervisor,
    end_leftovers,
    exit_description,
    lock_data_dir,
)


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
    """The administrator's token, made at each start; kept in the CLI's `admin` profile, never printed."""
    cli_profile: str = ""
    """The CLI's current profile once the `admin` profile is written (the user's own, if they had one)."""
    cli_config_path: Path | None = None
    """The CLI's configuration file, which holds the `admin` profile (and so the admin token) once written."""
    gateway: str | None = None
    """The public gateway's address (`localhost:PORT`) with --gateway: corral's one address for people."""
    stopping_file: Path | None = None
    """Created first thing by `stop`: the drivers start no machine from then on (their --stopping-file)."""

    def stop(self) -> None:
        """Stop everything, each step saying what it waits for; then let go of the data directory."""
        supervisor, pid_files = self.supervisor, self.supervisor.pid_files
        names = [part.name for part in supervisor.parts]
        # No machine starts from now on: the workers stop before the drivers, and their jobs go back to Ready
        # while the drivers still lead, whose autoscaler would start a machine for them that the stop ends at
        # once, and whose instance a restart would wait for (issue 36). The drivers look before each start.
        if self.stopping_file is not None:
            try:
                self.stopping_file.touch()
            except OSError as e:
                supervisor.say(f"could not create {self.stopping_file} ({e}): a driver may start a machine as "
                               "everything stops")
        # The public gateway and the frontend first: no new work comes in.
        supervisor.end(["gateway-public", "web", "frontend"], SERVICE_GRACE_S)
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


STOPPING_FILE = "stopping"
"""In DATA/run: created when `corral up` begins to stop; its drivers start no machine while it exists."""
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


def _storage_roots(config: UpConfig, data: Path) -> tuple[str, ...]:
    """The storage root templates; by default each project's directory under `data/storage`, which
    only this account may enter (workers create the project directories in it as outputs arrive)."""
    if config.storage_roots is not None:
        return config.storage_roots
    storage = (data / "storage").resolve()
    storage.mkdir(mode=0o700, parents=True, exist_ok=True)
    storage.chmod(0o700)
    return (f"file://{storage}/{{project}}/",)


def registry_mirrors(config: UpConfig, registry_url: str) -> tuple[Mirror, ...]:
    """The workers' mirrors: the configured ones, and the own registry as docker.io's unless one is."""
    if any(mirror.registry == DOCKER_HUB for mirror in config.registry_mirrors):
        return config.registry_mirrors
    return (*config.registry_mirrors, Mirror.parse(f"{DOCKER_HUB}={registry_url}/{DOCKER_HUB}"))


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
    stopping_file = run_dir / STOPPING_FILE
    running = Running(supervisor, Lifeline(), lock_fd, stopping_file=stopping_file)
    try:
        end_leftovers(pid_files, supervisor.say)
        stopping_file.unlink(missing_ok=True)  # an earlier run's, which the drivers would obey
        # No worker runs now: the keys of those of an earlier run (that did not exit cleanly) go too.
        shutil.rmtree(data / "worker-certs", ignore_errors=True)
        database_url, service_urls = database.prepare(config.database_url or None, data, supervisor, config.restore)
        ca, certs = certificates(data)
        secrets_key, secrets_public_key = secrets_keys(data, certs)
        for stale in run_dir.glob("*.ports"):
            stale.unlink()
        logs, blobs = data / "logs", f"file://{data / 'blobs'}"
        urls = [*(a for root in _storage_roots(config, data) for a in ("--storage-root", root)),
                "--callback-allow-networks", ",".join(config.callback_allow_networks)]
        asyncio.run(database.configure_pools(database_url, config.worker_cores, config.max_workers))
        registry_login: list[str] = []
        registry_push: list[str] = []
        if config.registry_url is not None:
            registry, registry_url = None, config.registry_url
        else:
            # Started now and seeded while the services start: it adds little to the time to ready. Its ports
            # are the same at every start (DATA/registry/ports.json): users name its address.
            registry = LocalRegistry.prepare(data / "registry", free_port, launcher(), logs, config.registry_port)
            for server in registry.servers:
                supervisor.start(server)
            registry_url = registry.pull.url
            # The drivers hand the pull login to their workers (as they hand them certificates).
            write_atomically(certs["driver"] / REGISTRY_LOGIN, registry.pull_login_file.read_bytes(), 0o600)
            registry_login = ["--own-registry-login-file", str(certs["driver"] / REGISTRY_LOGIN)]
            # The frontend imports projects' images (`corral images import`) through the push registry.
            write_atomically(certs["frontend"] / REGISTRY_PUSH_LOGIN, registry.push_login_file.read_bytes(), 0o600)
            # Archives being imported wait on the data directory's disk (not a tmpfs /tmp); a frontend that was
            # killed mid-import left its directory there, and none runs now.
            imports = data / "imports"
            shutil.rmtree(imports, ignore_errors=True)
            imports.mkdir(mode=0o700)
            registry_push = ["--own-registry-push", registry.push.url,
                             "--own-registry-push-login-file", str(certs["frontend"] / REGISTRY_PUSH_LOGIN),
                             "--image-import-dir", str(imports)]
        allowed = ["--allowed-registries", ",".join(config.allowed_registries)]
        mirrors = [arg for mirror in registry_mirrors(config, registry_url)
                   for arg in ("--registry-mirror", str(mirror))]
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

        def service(name: str, module: str, account: str | None, args: list[str], lifeline: bool = False,
                    policy: RestartPolicy | None = None) -> None:
            """Start `python -m MODULE ARGS` as part NAME, with its own database URL in its environment
            (never on the command line; none without an `account`); with `lifeline`, it hands the lifeline on
            to its workers."""
            ports = run_dir / f"{name}.ports"
            if running.metrics_dir is not None:  # a port of its own, kept across restarts as its others are
                args = [*args, "--metrics-address", f"127.0.0.1:{free_port()}",
                        "--metrics-port-file", str(running.metrics_dir / f"{name}.port")]
            part_env = {**env, DATABASE_URL_VARIABLE: service_urls[account]} if account else dict(env)
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
        session += ["--own-registry", registry_url, *registry_login, *allowed, *mirrors,
                    "--worker-runtime", config.worker_runtime]
        if running.metrics_dir is not None and config.provider == "local":  # a cloud's workers are not here
            session += ["--worker-metrics-dir", str(running.metrics_dir)]
        session += prepull_args(config.prepull)

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
                     "--secrets-key-file", str(secrets_key), "--stopping-file", str(stopping_file),
                     *session, *urls, *config.storage_access.to_args(),
                     *worker_limits.to_args(), *cloud],
                    lifeline=True, policy=driver_policy)
        frontend = free_port()
        service("frontend", "services.frontend", "frontend",
                ["--certs-dir", str(certs["frontend"]), "--auth-address", f"localhost:{auth_internal}",
                 "--spec-root-url", blobs, "--public-address", f"127.0.0.1:{frontend}",
                 "--driver-addresses", driver_addresses, "--secrets-public-key-file", str(secrets_public_key),
                 # Behind the gateway, people's reflection reaches the frontend alone.
                 *(["--reflect-also", "corral.auth.v1.AuthService"] if config.gateway else []), *urls,
                 "--own-registry", registry_url, *registry_push, *allowed, *mirrors])
        if config.gateway:
            # The web UI, behind the public gateway: the users' own tokens, no database account. It tells auth
            # where a sign-in comes from with the gateway's token.
            web_certs = ca.provision(WEB_IDENTITY, data / "certs" / WEB_IDENTITY).key.parent
            write_atomically(web_certs / GATEWAY_TOKEN_FILE, (certs["auth"] / GATEWAY_TOKEN_FILE).read_bytes(), 0o600)
            web_port = free_port()
            service("web", "services.web", None,
                    ["--certs-dir", str(web_certs), "--address", f"127.0.0.1:{web_port}",
                     "--frontend-address", f"localhost:{frontend}", "--auth-address", f"localhost:{auth_public}",
                     "--login-source-token-file", str(web_certs / GATEWAY_TOKEN_FILE)])
        if registry is not None:
            registry.wait_ready()
            seed_dir = config.base_image_cache or data / "registry" / "seed"
            for seeded in seed(registry.push.address, seed_dir, login=registry.push_login, images=config.base_images,
                               say=supervisor.say, prune=config.base_image_cache is None):
                if seeded.pushed:  # pushed through the push registry; workers pull it from the other
                    image = seeded.reference.split("/", 1)[1]
                    supervisor.say(f"registry: seeded {registry.pull.address}/{image} ({seeded.digest})")
        for name in ["auth", *(f"driver-{i}" for i in range(config.n_drivers)), "frontend",
                     *(["web"] if config.gateway else [])]:
            _wait_for(run_dir / f"{name}.ports", supervisor)
        public = {"frontend": f"localhost:{frontend}", "auth": f"localhost:{auth_public}"}
        if config.gateway:
            plan = gateway.deployment(data, certs["gateway"], public_port=gateway_port,
                                      internal_port=internal_gateway_port, auth_port=auth_public,
                                      frontend_ports=[frontend], driver_ports=driver_ports,
                                      stats_ports=(free_port(), free_port()) if running.metrics_dir else None,
                                      auth_token=gateway_token, enroll_port=enroll_port,
                                      limits=config.gateway_limits, web_ports=[web_port])
            gateway.start_gateways(plan, supervisor, data, logs, lambda: _check_started(supervisor),
                                   running.metrics_dir)
            running.gateway = f"localhost:{gateway_port}"
            public = {"frontend": running.gateway, "auth": running.gateway, "gateway": running.gateway,
                      "web": f"https://{running.gateway}/",
                      "workers_gateway": workers_driver_addresses}
            if plan.enroll_listen is not None:  # cloud workers enroll here (local ones are given a certificate)
                public["workers_enroll"] = f"localhost:{plan.enroll_listen.port}"
        running.admin_token = asyncio.run(database.bootstrap(database_url))
        running.endpoints = {**public,
                             "drivers": driver_addresses, "database": database.without_password(database_url),
                             "registry": registry_url,
                             "ca_cert": str(data / "ca.pem"), "logs": str(logs)}
        if running.metrics_dir is not None:
            running.endpoints["metrics"] = str(write_metrics_targets(running.metrics_dir))
            running.endpoints["metrics_certs"] = str(metrics_certs)
        _write_client_config(config, running, _storage_roots(config, data))
        return running
    except BaseException:
        defer_stop_signals()
        running.stop()
        raise


def _write_client_config(config: UpConfig, running: Running, storage_roots: tuple[str, ...]) -> None:
    """The CLI's `admin` profile; the user's own profiles of this server follow its new ports, and the
    current profile stays current (corral.cli_config). The profile's pipeline defaults are the `default`
    project and a scratch directory under its storage root, unless the user set others."""
    running.cli_config_path = (config.client_config or Config.path()).absolute()
    roots = [root.replace("{project}", database.DEFAULT_PROJECT) for root in storage_roots]
    running.cli_profile = write_server_profile(
        Profile(frontend=running.endpoints["frontend"], auth=running.endpoints["auth"],
                ca_cert=running.endpoints["ca_cert"], token=running.admin_token, user=database.ADMIN,
                billing_project=database.DEFAULT_PROJECT,
                remote_tmpdir=f"{roots[0].rstrip('/')}/tmp" if roots else None),
        ADMIN_PROFILE, config.client_config)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""What asks `corral up` to stop (SIGHUP: its terminal went away)."""


def defer_stop_signals(requests: list[int] | None = None) -> None:
    """From now on a stop signal is only noted (in `requests`): it cannot cut a stop short."""

    def note(signum: int, frame: object) -> None:
        if requests is not None:
            requests.append(signum)

    for sig in STOP_SIGNALS:
        signal.signal(sig, note)
