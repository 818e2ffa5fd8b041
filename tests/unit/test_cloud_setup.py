"""The driver's choice of provider: which flag combinations it refuses at start-up, and the boot data it adds to
a cloud's configuration file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services.driver.providers.interface import InstanceRequest
from services.driver.providers import cloud_setup
from services.common.image_refs import Mirror
from services.driver.providers.cloud_setup import WorkerBootArgs, check_flags, cloud_worker_args, load

REPO = Path(__file__).resolve().parents[2]
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
BOOT = WorkerBootArgs("gw.internal:5443", ("gw.internal:5444",), CA,
                      cloud_worker_args("gs://corral-logs/", "oci", ["--gcs-token-file", "/etc/corral/gcs.json"],
                                        "https://registry.internal"))
GCP = {"project": "p", "deployment": "prod-1", "boot_image": "projects/p/global/images/family/corral",
       "regions": [{"name": "europe-west4", "zones": ["europe-west4-a"]},
                   {"name": "us-central1", "zones": ["us-central1-a"]}]}
AZURE = {"subscription_id": "s", "resource_group": "g", "locations": ["northeurope", "westeurope"],
         "subnet_id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Network/virtualNetworks/v/subnets/w",
         "image": {"id": "/subscriptions/s/resourceGroups/g/providers/Microsoft.Compute/images/corral"},
         "admin_username": "corral", "ssh_public_key": "ssh-ed25519 AAAA", "deployment": "prod-1"}


@pytest.mark.parametrize(("provider", "config", "enroll", "drivers", "local_only", "error"), [
    ("gcp", None, "e:1", ["d:1"], [], "needs --provider-config"),
    ("azure", Path("a.json"), None, ["d:1"], [], "needs --workers-enroll-address"),
    ("gcp", Path("g.json"), "e:1", [], [], "needs --driver-addresses"),
    ("gcp", Path("g.json"), "e:1", ["d:1"], ["--local-workers-enroll"], "--local-workers-enroll: about local"),
    ("local", Path("g.json"), None, [], [], "--provider-config is for --provider gcp or azure"),
    ("aws", None, None, [], [], "one of local, gcp, azure"),
])
def test_bad_combinations_are_refused(provider: str, config: Path | None, enroll: str | None, drivers: list[str],
                                      local_only: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        check_flags(provider, config, enroll, drivers, local_only)


def test_good_combinations_pass() -> None:
    check_flags("local", None, None, [], ["--local-workers-enroll"])
    check_flags("gcp", Path("g.json"), "e:1", ["d:1"], [])


def test_gcp_machines_are_told_the_deployment_and_their_size_and_region(tmp_path: Path) -> None:
    (tmp_path / "gcp.json").write_text(json.dumps(GCP))
    setup = load("gcp", tmp_path / "gcp.json", BOOT)
    assert setup.region == "europe-west4"  # the first: where the autoscaler asks first
    worker = setup.config.worker
    assert (worker.enroll_address, worker.driver_addresses, worker.ca_cert_pem) == (
        "gw.internal:5443", ("gw.internal:5444",), CA)
    args = list(worker.worker_args(InstanceRequest("standard-1", "standard", 2000, 8 << 30, "us-central1", "t")))
    assert args[args.index("--region") + 1] == "us-central1"
    assert args[args.index("--cores-mcpu") + 1] == "2000"
    assert args[args.index("--log-root-url") + 1] == "gs://corral-logs/"
    assert args[args.index("--runtime") + 1] == "oci"
    assert args[args.index("--scratch-dir") + 1] == cloud_setup.CLOUD_SCRATCH_DIR
    assert args[args.index("--own-registry") + 1] == "https://registry.internal"
    assert "--gcs-token-file" in args
    assert not {"--certs-dir", "--driver-addresses", "--instance-name"} & set(args)  # from the boot data itself


def test_azure_boot_data_comes_from_the_deployment_not_the_file(tmp_path: Path) -> None:
    (tmp_path / "azure.json").write_text(json.dumps(AZURE))
    setup = load("azure", tmp_path / "azure.json", BOOT)
    assert setup.region == "northeurope"
    assert (setup.config.boot.enroll_address, setup.config.boot.worker_args) == ("gw.internal:5443", BOOT.worker_args)
    (tmp_path / "azure.json").write_text(json.dumps({**AZURE, "boot": {"enroll_address": "elsewhere:1"}}))
    with pytest.raises(ValueError, match="`boot` comes from the deployment"):
        load("azure", tmp_path / "azure.json", BOOT)


@pytest.mark.parametrize(("kind", "text", "error"), [
    ("gcp", json.dumps({**GCP, "regions": []}), "regions must be a list of 1 to"),
    ("gcp", "{", "not JSON"),
    ("azure", json.dumps({**AZURE, "locations": "westeurope", "colour": "blue"}), r"unknown field\(s\) \['colour'\]"),
    ("azure", "[]", "not a JSON object"),
    ("azure", " " * (cloud_setup.MAX_CONFIG_BYTES + 1), "at most"),
])
def test_a_bad_file_is_refused_naming_it(tmp_path: Path, kind: str, text: str, error: str) -> None:
    path = tmp_path / f"{kind}.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=error) as refused:
        load(kind, path, BOOT)
    assert str(path) in str(refused.value)


def test_the_driver_refuses_a_bad_combination_at_start_up(tmp_path: Path) -> None:
    """Before it touches the database: the flags are checked first, with argparse's usage error."""
    (tmp_path / "certs").mkdir()
    done = subprocess.run([sys.executable, "-m", "services.driver", "--database-url", "mysql://nobody@localhost/x",
                           "--certs-dir", str(tmp_path / "certs"), "--spec-root-url", "file:///tmp/x",
                           "--data-dir", str(tmp_path / "data"), "--provider", "gcp"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert "--provider gcp needs --provider-config, --workers-enroll-address, --driver-addresses" in done.stderr


def test_cloud_workers_are_told_which_registries_they_may_pull_from() -> None:
    """Issue 33 part 6: a cloud worker checks its pulls against the same registries as the frontend."""
    mirrors = [Mirror.parse("docker.io=https://registry.internal/docker.io"), Mirror.parse("ghcr.io=https://m.corp")]
    args = cloud_worker_args("gs://logs/", "oci", [], "https://registry.internal", ["10.0.0.5:5000", "reg.corp"],
                             mirrors=mirrors)
    assert args[args.index("--own-registry") + 1] == "https://registry.internal"
    assert args[args.index("--allowed-registries") + 1] == "10.0.0.5:5000,reg.corp"
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--registry-mirror"] == [
        "docker.io=https://registry.internal/docker.io", "ghcr.io=https://m.corp"]
    assert "--allowed-registries" not in cloud_worker_args("gs://logs/", "oci")
    assert "--registry-mirror" not in cloud_worker_args("gs://logs/", "oci")
