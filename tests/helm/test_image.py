"""The service image (scripts/build_image.py): built without Docker, pushed to a real registry on loopback,
pulled back and unpacked with umoci; every entry point helm/corral runs starts in it under runc, as the chart's
account with a read-only root; Envoy in the image accepts the chart's configs with the image's descriptor set;
and the migrations, auth, the frontend and a driver run in it against a real MariaDB until the chart's own
readiness probe passes inside each container (the driver's: only once it leads), and the web UI until it answers
the gateway's certificate. Slow (`-m slow`): a first build fetches Debian and every wheel (about 2 minutes here);
later builds reuse the cached base layer (~/.cache/corral-image) and take seconds."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.common.tls import WORKER_ISSUER, DevCertificateAuthority
from services.db.database import DatabaseConfig
from services.db.server import PrivateMariaDB
from services.registry.server import RegistryServer
from services.up.ports import free_port
from tests.helm.chart import CHART, REPO, VALUE_SETS, find, manifests
from tests.helm.test_chart import commands

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TAG = "corral:test"
USER_ID = 10001
"""The image's account, and the chart's runAsUser."""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image built, pushed to a loopback registry, pulled back as a node would, and unpacked (a runc bundle)."""
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("building and running the image needs root and runc")
    work = tmp_path_factory.mktemp("image")
    registry = RegistryServer(work / "registry", free_port())
    registry.start()
    try:
        registry.wait_ready()
        built = subprocess.run([sys.executable, str(REPO / "scripts" / "build_image.py"), "--tag", TAG,
                                "--layout", str(work / "layout"), "--push", registry.address, "--plain-http"],
                               capture_output=True, text=True, timeout=1500, check=False)
        assert built.returncode == 0, built.stderr[-4000:]
        assert f"pushed: {registry.address}/{TAG}" in built.stdout
        subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry.address}/{TAG}",
                        f"oci:{work / 'pulled'}:test"], check=True, capture_output=True, timeout=300)
    finally:
        registry.stop()
    subprocess.run(["umoci", "unpack", "--image", f"{work / 'pulled'}:test", str(work / "bundle")], check=True,
                   capture_output=True, timeout=600)
    return work / "bundle"


def configure(bundle: Path, args: list[str], mounts: list[dict] = (), env: dict[str, str] | None = None) -> None:
    """Make the bundle run `args` as the image's user, root file system read-only, /tmp a tmpfs (as the chart's
    emptyDir), with `mounts` and `env` added."""
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    config["process"]["args"] = args
    config["process"]["terminal"] = False
    config["process"]["env"] = [e for e in config["process"]["env"] if not e.startswith("CORRAL_")] + [
        f"{name}={value}" for name, value in (env or {}).items()]
    config["root"]["readonly"] = True
    config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/tmp"] + [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=64m"]},
        *mounts]
    config_path.write_text(json.dumps(config))


def run_in(bundle: Path, args: list[str], mounts: list[dict] = ()) -> subprocess.CompletedProcess[str]:
    """`args` in the image, to the end."""
    configure(bundle, args, mounts)
    container = f"corral-image-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(["runc", "run", "--bundle", str(bundle), container], capture_output=True, text=True,
                              timeout=120, check=False, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["runc", "delete", "--force", container], capture_output=True, check=False)


def chart_entry_points() -> list[list[str]]:
    """Each distinct program the chart runs (a container's command or an exec probe), asked for its help."""
    seen: dict[str, list[str]] = {}
    for name in VALUE_SETS:
        for _, command in commands(manifests(name)):
            # `python -m services.X`, `corral db migrate`; any other program by its name alone.
            program = command[:3] if command[0] in ("python", "corral") else command[:1]
            seen.setdefault(" ".join(program), [*program, "--help"])
    return list(seen.values())


def readable_tls(ca: DevCertificateAuthority, identity: str, directory: Path) -> Path:
    """`identity`'s certificate directory as the chart mounts it, readable by the container's account (in a pod,
    fsGroup gives it the files); the driver's also holds the worker issuer."""
    files = ca.provision(identity, directory)
    if identity == "driver":
        ca.provision(WORKER_ISSUER, directory)
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)
    return files.ca_cert.parent


def test_every_entry_point_starts_and_envoy_takes_the_charts_configs(bundle: Path, tmp_path: Path) -> None:
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["user"]["uid"] == USER_ID
    entry_points = chart_entry_points()
    assert {" ".join(e[:3]) for e in entry_points} >= {
        "python -m services.auth", "python -m services.frontend", "python -m services.driver",
        "python -m services.health", "corral db migrate", "envoy --help"}
    for args in entry_points:
        done = run_in(bundle, args)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        assert "usage" in (done.stdout + done.stderr).lower(), args

    # The chart's gateway configs, as its pods mount them, against the image's Envoy and descriptor set.
    tls = readable_tls(DevCertificateAuthority(tmp_path / "ca"), "gateway", tmp_path / "tls")
    mounts = [{"destination": "/etc/corral/tls", "type": "bind", "source": str(tls), "options": ["rbind", "ro"]},
              {"destination": "/etc/corral/envoy", "type": "bind", "source": str(CHART / "files"),
               "options": ["rbind", "ro"]},
              {"destination": "/var/run/corral", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}]
    for name in ("public", "internal"):
        done = run_in(bundle, ["envoy", "--mode", "validate", "-c", f"/etc/corral/envoy/envoy-{name}.yaml",
                               "--log-level", "warn"], mounts)
        assert done.returncode == 0, f"envoy-{name}.yaml: {done.stdout[-2000:]} {done.stderr[-2000:]}"


@pytest.fixture
def mariadb(tmp_path: Path) -> Iterator[tuple[PrivateMariaDB, DatabaseConfig]]:
    """A private MariaDB (socket only) and its administrator's settings; stopped afterwards."""
    server = PrivateMariaDB(tmp_path / "db")
    admin = server.start()
    try:
        yield server, admin
    finally:
        server.stop()


SOCKET = "/run/corral-db.sock"
"""Where the containers see the test's MariaDB socket (bind-mounted: they have no network but their own)."""


def chart_container(component: str) -> tuple[list[str], list[str]]:
    """The command line and readiness probe the chart gives `component`'s container (default values)."""
    workload = find(manifests("default"), "Deployment", f"corral-{component}")
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return [*container["command"], *container["args"]], container["readinessProbe"]["exec"]["command"]


def test_the_services_run_in_the_image_until_the_charts_probe_passes(
        bundle: Path, mariadb: tuple[PrivateMariaDB, DatabaseConfig], tmp_path: Path) -> None:
    server, admin = mariadb
    url = dataclasses.replace(admin, unix_socket=SOCKET, database="corral").to_url()
    database = {"destination": SOCKET, "type": "bind", "source": server.socket, "options": ["bind"]}
    job = find(manifests("default"), "Job", "corral-migrations")["spec"]["template"]["spec"]["containers"][0]
    command = [*job["command"], *(a for a in job["args"] if a != "--no-create")]  # this database is new
    configure(bundle, command, [database], {"CORRAL_DATABASE_URL": url})
    migrate = subprocess.run(["runc", "run", "--bundle", str(bundle), f"corral-migrate-{uuid.uuid4().hex[:6]}"],
                             capture_output=True, text=True, timeout=300, check=False, stdin=subprocess.DEVNULL)
    assert migrate.returncode == 0, migrate.stdout[-2000:] + migrate.stderr[-2000:]

    ca = DevCertificateAuthority(tmp_path / "ca")
    for component in ("auth", "frontend", "driver"):
        command, probe = chart_container(component)
        # The chart's command, but with blobs on the container's own disk and no external storage.
        command = [("file:///tmp/blobs" if word.startswith("gs://") else word) for word in command]
        tls = readable_tls(ca, component, tmp_path / component / "tls")
        mounts = [database, {"destination": "/etc/corral/tls", "type": "bind", "source": str(tls),
                             "options": ["rbind", "ro"]},
                  {"destination": "/var/lib/corral/driver", "type": "tmpfs", "source": "tmpfs", "options": ["size=8m"]},
                  {"destination": "/var/run/corral", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}]
        if component == "auth":
            mounts.append(gateway_token_mount(tmp_path / "auth" / "gateway-token"))
        configure(bundle, command, mounts, {"CORRAL_DATABASE_URL": url})
        run_until_passes(bundle, component, probe, tmp_path / f"{component}.log")


def gateway_token_mount(directory: Path) -> dict:
    """The gateway's token, as the chart mounts it (readable by the container's account)."""
    directory.mkdir(parents=True)
    (directory / "gateway.token").write_text("t" * 48)
    (directory / "gateway.token").chmod(0o644)
    directory.chmod(0o755)
    return {"destination": "/etc/corral/gateway-token", "type": "bind", "source": str(directory),
            "options": ["rbind", "ro"]}


def run_until_passes(bundle: Path, component: str, check: list[str], log: Path) -> None:
    """Start the bundle as configured (its output in `log`), run `check` in it until it exits 0 (at most 90 s),
    then kill it."""
    container = f"corral-{component}-{uuid.uuid4().hex[:6]}"
    with open(log, "w") as out:
        subprocess.run(["runc", "run", "--detach", "--bundle", str(bundle), container], stdout=out, stderr=out,
                       stdin=subprocess.DEVNULL, timeout=60, check=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            done = subprocess.run(["runc", "exec", container, *check], capture_output=True, text=True,
                                  timeout=30, check=False)
            if done.returncode == 0:
                break
            assert time.monotonic() < deadline, f"{component}: {done.stderr} {log.read_text()[-3000:]}"
            time.sleep(1)
    finally:
        subprocess.run(["runc", "kill", container, "KILL"], capture_output=True, check=False)
        subprocess.run(["runc", "delete", "--force", container], capture_output=True, check=False)


def test_the_web_runs_in_the_image_and_answers_the_gateway(bundle: Path, tmp_path: Path) -> None:
    """The web UI with the chart's arguments and mounts starts in the image (its templates and static files are
    there) and answers GET /healthz to the gateway's certificate, as the public gateway's health check asks it
    (the chart's own probes are TCP: the web answers no other certificate)."""
    workload = find(manifests("default"), "Deployment", "corral-web")
    [container] = workload["spec"]["template"]["spec"]["containers"]
    command = [*container["command"], *container["args"]]
    port = container["ports"][0]["containerPort"]
    ca = DevCertificateAuthority(tmp_path / "ca")
    web_tls = readable_tls(ca, "web", tmp_path / "tls")
    mounts = [{"destination": "/etc/corral/tls", "type": "bind", "source": str(web_tls), "options": ["rbind", "ro"]},
              # Only for the check below: the gateway's certificate, which the web answers alone.
              {"destination": "/etc/corral/gateway", "type": "bind",
               "source": str(readable_tls(ca, "gateway", tmp_path / "gateway")), "options": ["rbind", "ro"]},
              gateway_token_mount(tmp_path / "gateway-token"),
              {"destination": "/var/run/corral", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}]
    configure(bundle, command, mounts)
    # As Envoy checks it: the chain to the CA, not the name (the bundle has no /etc/hosts: 127.0.0.1, not localhost).
    as_gateway = ("import http.client, ssl, sys\n"
                  "context = ssl.create_default_context(cafile='/etc/corral/gateway/ca.pem')\n"
                  "context.check_hostname = False\n"
                  "context.load_cert_chain('/etc/corral/gateway/gateway.pem', '/etc/corral/gateway/gateway.key')\n"
                  f"connection = http.client.HTTPSConnection('127.0.0.1', {port}, context=context, timeout=3)\n"
                  "connection.request('GET', '/healthz')\n"
                  "answer = connection.getresponse()\n"
                  "sys.exit((answer.status, answer.read()) != (200, b'ok'))\n")
    run_until_passes(bundle, "web", ["python", "-c", as_gateway], tmp_path / "web.log")
