"""The service image (scripts/build_image.py): built without Docker, pushed to a real registry on loopback,
pulled back and unpacked with umoci, and every entry point helm/corral runs started in it under runc, as the
chart's account with a read-only root. Envoy in the image also accepts the chart's configs with the image's
descriptor set. Slow (`-m slow`): a first build fetches Debian and every wheel (about 2 minutes here); later
builds reuse the cached base layer (~/.cache/corral-image) and take seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from services.common.tls import DevCertificateAuthority
from services.registry.server import RegistryServer
from services.up import free_port
from tests.helm.chart import CHART, REPO, VALUE_SETS, manifests
from tests.helm.test_chart import commands

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

TAG = "corral:test"


def chart_entry_points() -> list[list[str]]:
    """Each distinct program the chart runs (a container's command or an exec probe), asked for its help."""
    seen: dict[str, list[str]] = {}
    for name in VALUE_SETS:
        for _, command in commands(manifests(name)):
            # `python -m services.X`, `corral db migrate`; any other program by its name alone.
            program = command[:3] if command[0] in ("python", "corral") else command[:1]
            seen.setdefault(" ".join(program), [*program, "--help"])
    return list(seen.values())


def run_in(bundle: Path, args: list[str], mounts: list[dict] = ()) -> subprocess.CompletedProcess[str]:
    """`args` in the unpacked image under runc, as the image's user, root file system read-only."""
    config_path = bundle / "config.json"
    config = json.loads(config_path.read_text())
    config["process"]["args"] = args
    config["process"]["terminal"] = False
    config["root"]["readonly"] = True
    config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/tmp"] + [
        {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "size=64m"]},
        *mounts]
    config_path.write_text(json.dumps(config))
    container = f"corral-image-{uuid.uuid4().hex[:8]}"
    try:
        return subprocess.run(["runc", "run", "--bundle", str(bundle), container], capture_output=True, text=True,
                              timeout=120, check=False, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run(["runc", "delete", "--force", container], capture_output=True, check=False)


@pytest.fixture
def registry(tmp_path: Path):  # type: ignore[no-untyped-def]
    server = RegistryServer(tmp_path / "registry", free_port())
    server.start()
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def test_the_image_builds_and_its_entry_points_start(tmp_path: Path, registry: RegistryServer) -> None:
    if os.geteuid() != 0 or shutil.which("runc") is None:
        pytest.skip("building and running the image needs root and runc")
    layout = tmp_path / "layout"
    built = subprocess.run([sys.executable, str(REPO / "scripts" / "build_image.py"), "--tag", TAG,
                            "--layout", str(layout), "--push", registry.address, "--plain-http"],
                           capture_output=True, text=True, timeout=1500, check=False)
    assert built.returncode == 0, built.stderr[-4000:]
    assert f"pushed: {registry.address}/{TAG}" in built.stdout

    # What a node would run: the image as the registry has it.
    pulled = tmp_path / "pulled"
    subprocess.run(["skopeo", "copy", "--quiet", "--src-tls-verify=false", f"docker://{registry.address}/{TAG}",
                    f"oci:{pulled}:test"], check=True, capture_output=True, timeout=300)
    bundle = tmp_path / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{pulled}:test", str(bundle)], check=True, capture_output=True,
                   timeout=600)
    config = json.loads((bundle / "config.json").read_text())
    assert config["process"]["user"]["uid"] == 10001  # the chart's runAsUser

    entry_points = chart_entry_points()
    assert {" ".join(e[:3]) for e in entry_points} >= {
        "python -m services.auth", "python -m services.frontend", "python -m services.driver",
        "python -m services.health", "corral db migrate", "envoy --help"}
    for args in entry_points:
        done = run_in(bundle, args)
        assert done.returncode == 0, f"{' '.join(args)}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        assert "usage" in (done.stdout + done.stderr).lower(), args

    # The chart's gateway configs, as its pods mount them, against the image's Envoy and descriptor set.
    tls = tmp_path / "tls"
    issued = DevCertificateAuthority(tmp_path / "ca").issue("gateway")
    tls.mkdir()
    for source, target in ((issued.ca_cert, "ca.pem"), (issued.cert, "gateway.pem"), (issued.key, "gateway.key")):
        (tls / target).write_bytes(source.read_bytes())
        (tls / target).chmod(0o644)  # the container's account reads them, as fsGroup lets it in a pod
    tls.chmod(0o755)
    mounts = [{"destination": "/etc/corral/tls", "type": "bind", "source": str(tls), "options": ["rbind", "ro"]},
              {"destination": "/etc/corral/envoy", "type": "bind", "source": str(CHART / "files"),
               "options": ["rbind", "ro"]},
              {"destination": "/var/run/corral", "type": "tmpfs", "source": "tmpfs", "options": ["size=1m"]}]
    for name in ("public", "internal"):
        done = run_in(bundle, ["envoy", "--mode", "validate", "-c", f"/etc/corral/envoy/envoy-{name}.yaml",
                               "--log-level", "warn"], mounts)
        assert done.returncode == 0, f"envoy-{name}.yaml: {done.stdout[-2000:]} {done.stderr[-2000:]}"
