"""The chart's Envoy configs (helm/corral/files/envoy-*.yaml): what `python -m services.gateway` generates from
helm/corral/files/kubernetes.yaml, byte for byte, and accepted by the real Envoy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from services.common.identity import GATEWAY_TOKEN_HEADER
from services.common.tls import DevCertificateAuthority
from services.gateway.__main__ import main as regenerate
from services.gateway.descriptors import write_descriptor_set
from services.gateway.envoy_process import validate
from tests.helm.chart import CHART

DESCRIPTION = CHART / "files" / "kubernetes.yaml"


def test_the_charts_configs_are_current() -> None:
    assert regenerate(["--deployment", str(DESCRIPTION), "--check"]) == 0, (
        "run: python -m services.gateway --deployment helm/corral/files/kubernetes.yaml")


def test_the_check_sees_a_stale_chart_config(tmp_path: Path) -> None:
    for name in ("kubernetes.yaml", "envoy-public.yaml", "envoy-internal.yaml"):
        (tmp_path / name).write_bytes((CHART / "files" / name).read_bytes())
    assert regenerate(["--deployment", str(tmp_path / "kubernetes.yaml"), "--check"]) == 0
    stale = tmp_path / "envoy-internal.yaml"
    stale.write_text(stale.read_text().replace("corral-driver", "corral-drivers"))
    assert regenerate(["--deployment", str(tmp_path / "kubernetes.yaml"), "--check"]) == 1


# Where the pods hold what the configs name (the chart's mounts, the image's files), and a stand-in here.
POD_PATHS = ("/etc/corral/tls/", "/opt/corral/gateway/", "/var/run/corral/")


@pytest.mark.parametrize("name", ["public", "internal"])
def test_the_charts_configs_pass_envoy_validate(name: str, tmp_path: Path) -> None:
    """Envoy reads every file a config names, so the pod's paths are moved under tmp_path; all else is the
    config as the chart mounts it (the upstreams' Service names included: validation resolves no name)."""
    text = (CHART / "files" / f"envoy-{name}.yaml").read_text()
    assert "/etc/corral/tls/" in text
    for path in POD_PATHS:
        # Relative to Envoy's directory, tmp_path: a socket's path is at most 107 bytes.
        text = text.replace(path, path.lstrip("/"))
    issued = DevCertificateAuthority(tmp_path / "ca").issue("gateway")
    tls = tmp_path / "etc/corral/tls"
    tls.mkdir(parents=True)
    for source, target in ((issued.ca_cert, "ca.pem"), (issued.cert, "gateway.pem"), (issued.key, "gateway.key")):
        (tls / target).write_bytes(source.read_bytes())
    write_descriptor_set(tmp_path / "opt/corral/gateway/descriptors.binpb")
    (tmp_path / "var/run/corral").mkdir(parents=True)  # the pod's emptyDir
    config = tmp_path / f"envoy-{name}.yaml"
    config.write_text(text)
    validate(config, cwd=tmp_path)


def test_the_public_gateway_sends_auth_its_token_by_reference_only() -> None:
    """The description names the token as Envoy's %ENVIRONMENT(...)% (the chart sets the variable from a Secret):
    calls to auth carry it, calls to the frontends never do, and no value is in the config."""
    config = yaml.safe_load((CHART / "files" / "envoy-public.yaml").read_text())
    [listener] = [l for l in config["static_resources"]["listeners"] if l["name"] == "public"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = manager["route_config"]["virtual_hosts"][0]["routes"]
    to_auth = [r for r in routes if r.get("route", {}).get("cluster") == "auth"]
    to_frontend = [r for r in routes if r.get("route", {}).get("cluster") == "frontend"]
    assert to_auth and to_frontend
    for route in to_auth:
        [header] = route["request_headers_to_add"]
        assert header["header"] == {"key": GATEWAY_TOKEN_HEADER, "value": "%ENVIRONMENT(CORRAL_GATEWAY_TOKEN)%"}
    for route in to_frontend:
        assert route["request_headers_to_remove"] == [GATEWAY_TOKEN_HEADER]
    assert "ENVIRONMENT" not in (CHART / "files" / "envoy-internal.yaml").read_text()
