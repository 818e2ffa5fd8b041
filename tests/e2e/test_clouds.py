"""corral on a cloud's machines, end to end (issue 16): `corral up --provider gcp|azure` runs the whole system,
and its drivers make their workers' machines through the cloud's real SDK (google-cloud-compute's REST
transport; azure-mgmt-compute and azure-mgmt-network's asyncio clients) against a loopback server that speaks
the cloud's REST API and checks every request against the documented shapes (tests/clouds/gcp_api.py,
azure_api.py). The drivers authenticate as they would in the cloud: a service account's key through
Application Default Credentials (its self-signed JWTs are verified here), a managed identity's token
from the metadata service.

Each machine the cloud "boots" starts a real `python -m services.worker --cloud gcp|azure`, which reads its
boot data from that machine's metadata server, makes its key, enrolls through the internal gateway with its
one-time token and activates; deleting the machine stops that process. The test submits a batch of short
jobs and checks:
- autoscaling up: the autoscaler asked the cloud for Spot machines through the SDK, and their workers
  enrolled and activated;
- every job succeeds; one machine reclaimed by the cloud (`preempt`) in the middle of a long job: its
  worker leaves saying so, and that job runs again as a new attempt on another machine;
- scale-down: once the batch is done, idle workers deactivate themselves and the driver deletes their
  machines through the SDK, until the cloud runs none.

Each cloud's test takes about 20 s here.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import google.auth.jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

import corral
from services.common.tls import DevCertificateAuthority
from services.driver.providers.worker_metadata import METADATA_KEY, METADATA_URL_ENV, WorkerBootstrap
from tests.clouds.azure_api import AzureApiServer
from tests.clouds.gcp_api import GcpApi
from tests.clouds.gcp_billing_api import GcpBillingApi
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")
SPOT_POOL = "standard"
MACHINES = 4
"""Most machines of the pool at once (2 cores each)."""
LONG_JOB_S = 6
"""The job whose machine is reclaimed under it runs this long."""
CLOUD_ENV = ("GOOGLE_APPLICATION_CREDENTIALS", "AZURE_POD_IDENTITY_AUTHORITY_HOST")
"""The driver's credentials: never in a worker's environment."""


class Machines:
    """What a cloud machine does when it boots and when it is deleted: a worker process per machine, started
    as its startup script would (`--cloud`, its metadata root), stopped by its pid as a deleted machine's
    shutdown stops it."""

    def __init__(self, root: Path, cloud: str):
        self._root = root
        self._cloud = cloud
        self._lock = threading.Lock()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def boot(self, name: str, metadata_url: str) -> None:
        home = self._root / name
        home.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORRAL_", "AZURE_")) and k not in CLOUD_ENV}
        env[METADATA_URL_ENV] = metadata_url
        with open(home / "worker.log", "wb") as log:
            # The machine's own disk: its key and certificate, its scratch space (the image's paths, here).
            process = subprocess.Popen(
                [sys.executable, "-m", "services.worker", "--cloud", self._cloud, "--certs-dir", str(home / "certs"),
                 "--scratch-dir", str(home / "scratch")],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        with self._lock:
            self.processes[name] = process

    def delete(self, name: str) -> None:
        """The machine is gone: its worker is stopped (in a thread: the cloud's server is not held)."""
        threading.Thread(target=self._stop, args=(name,), daemon=True).start()

    def _stop(self, name: str) -> None:
        with self._lock:
            process = self.processes.get(name)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def running(self) -> set[str]:
        with self._lock:
            return {name for name, process in self.processes.items() if process.poll() is None}

    def log(self, name: str) -> str:
        path = self._root / name / "worker.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop_all(self) -> None:
        with self._lock:
            names = list(self.processes)
        for name in names:
            self._stop(name)


@dataclasses.dataclass
class Cloud:
    """One loopback cloud as the test sees it, whichever it is."""

    name: str
    region: str
    """Its first configured region: where the autoscaler asks for machines."""
    machines: Machines
    preempt: Callable[[str], None]
    created: Callable[[], list[str]]
    """Machines the SDK asked to create, in order."""
    deleted: Callable[[], set[str]]
    """Machines the SDK asked to delete."""
    live: Callable[[], set[str]]
    """Machines the cloud runs now."""
    problems: Callable[[], list[str]]
    """Requests that did not fit the documented shapes (or carried no valid credential)."""
    boot_data: Callable[[], list[WorkerBootstrap]]
    """What each machine was created with (GCP's metadata item, Azure's userData)."""
    spot_product: str
    """The cpu product its Spot machines in `region` are billed to."""
    price_source: str
    """Where that product's price comes from: its catalogue (GCP's loopback Cloud Billing Catalog lists it)
    or the price file (Azure's Retail Prices API is unreachable here: the file's price stays)."""


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spot_pool(cluster: Cluster) -> None:
    """The operator makes the standard pool a Spot pool of at most MACHINES machines, two at a time."""
    cluster.execute("UPDATE instance_collections SET preemptible = TRUE, max_instances = %s, max_live_instances = %s, "
                    "max_new_instances_per_loop = 2 WHERE name = %s", [MACHINES, MACHINES, SPOT_POOL])


def start_cluster(tmp_path: Path, cloud: str, config: dict[str, Any]) -> Cluster:
    config_file = tmp_path / f"{cloud}.json"
    config_file.write_text(json.dumps(config))
    return up.start(tmp_path / "up", "--gateway", "--gateway-port", "0", "--internal-gateway-port", "0",
                    "--provider", cloud, "--provider-config", str(config_file), "--drivers", "1",
                    "--idle-timeout", "4", "--heartbeat-timeout", "15")


def run_batch(cluster: Cluster, cloud: Cloud, n_jobs: int) -> None:
    spot_pool(cluster)
    builder = corral.BatchBuilder("default", attributes={"test": f"{cloud.name}-e2e"})
    builder.job("busybox", f"sleep {LONG_JOB_S}", max_attempts=3)  # the one its machine is reclaimed under
    for _ in range(n_jobs - 1):
        builder.job("busybox", "true", max_attempts=3)
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id

        # Autoscaling up, through the SDK: machines are made, boot, enroll and activate.
        def victim() -> str | None:
            rows = cluster.query(
                "SELECT a.instance_name FROM attempts a JOIN instances i ON i.name = a.instance_name "
                "WHERE a.batch_id = %s AND a.job_id = 1 AND a.start_time_ms IS NOT NULL AND a.end_time_ms IS NULL "
                "AND i.state = 'active'", [batch_id])
            return rows[0]["instance_name"] if rows else None
        name = eventually(victim, 120, 0.1, "the long job running on a machine")
        assert name in cloud.created(), (name, cloud.created())
        cloud.preempt(name)  # the cloud reclaims it mid-job
        complete = lambda: cluster.query("SELECT state FROM batches WHERE batch_id = %s", [batch_id])[0]["state"] \
            == "complete"
        try:
            eventually(complete, 180, 0.5, f"batch {batch_id} complete")
        except AssertionError:
            raise AssertionError(diagnosis(cluster, cloud, batch_id)) from None
        done = client.wait(batch_id)
    assert (done.counts.n_succeeded, done.counts.n_jobs) == (n_jobs, n_jobs), done

    tries = cluster.query("SELECT instance_name, reason FROM attempts WHERE batch_id = %s AND job_id = 1 "
                          "ORDER BY start_time_ms", [batch_id])
    assert [t["reason"] for t in tries] == ["preempted", "exited"], (tries, cloud.machines.log(name))
    assert tries[0]["instance_name"] == name and tries[1]["instance_name"] != name
    # Every attempt was billed to the Spot machines' products in that region, at the price then in force.
    billed = cluster.query(
        "SELECT DISTINCT r.product, l.source FROM attempt_resources ar "
        "JOIN resources r ON r.resource_id = ar.resource_id JOIN latest_product_versions l ON l.product = r.product "
        "WHERE ar.batch_id = %s", [batch_id])
    memory_product = cloud.spot_product.replace("cpu/", "memory/", 1)
    assert {(b["product"], b["source"]) for b in billed} == {(cloud.spot_product, cloud.price_source),
                                                             (memory_product, cloud.price_source)}
    unbilled = cluster.query(
        "SELECT COUNT(*) AS n FROM attempts a WHERE a.batch_id = %s AND a.start_time_ms IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM attempt_resources ar WHERE ar.batch_id = a.batch_id "
        "AND ar.job_id = a.job_id AND ar.attempt_id = a.attempt_id)", [batch_id])
    assert unbilled[0]["n"] == 0
    reclaimed = cluster.query("SELECT state, deactivation_reason FROM instances WHERE name = %s", [name])[0]
    assert (reclaimed["state"], reclaimed["deactivation_reason"]) == ("inactive", "the cloud reclaimed the machine")

    created = cloud.created()
    rows = cluster.query("SELECT name, preemptible, time_enrolled_ms, time_activated_ms, region FROM instances "
                         "WHERE inst_coll = %s", [SPOT_POOL])
    assert {r["name"] for r in rows} == set(created), "every machine asked for was recorded, and only those"
    assert len(created) >= 2, "the autoscaler scaled up"
    # Each machine was told to enroll and find the drivers at the internal gateway, and the deployment's CA.
    ca = (cluster.data_dir / "ca.pem").read_text()
    for boot in cloud.boot_data():
        assert (boot.enroll_address, boot.driver_addresses, boot.ca_cert_pem) == (
            cluster.endpoints["workers_enroll"], (cluster.endpoints["workers_gateway"],), ca)
        assert boot.worker_args[boot.worker_args.index("--region") + 1] == cloud.region
    ran = {r["instance_name"] for r in cluster.query("SELECT DISTINCT instance_name FROM attempts WHERE batch_id = %s",
                                                     [batch_id])}
    for row in rows:
        assert row["preemptible"] and row["region"] == cloud.region, row
        if row["name"] in ran:  # its worker enrolled with its one-time token and activated
            assert row["time_enrolled_ms"] is not None and row["time_activated_ms"] is not None, row

    # Scale-down: the idle workers leave, and their machines are deleted through the SDK.
    eventually(lambda: not cloud.live(), 90, 0.5, f"every {cloud.name} machine deleted")
    assert set(created) - {name} <= cloud.deleted(), (created, cloud.deleted())
    eventually(lambda: not cloud.machines.running(), 30, 0.2, "every worker process gone")
    states = cluster.query("SELECT name, state, deactivation_reason FROM instances WHERE inst_coll = %s", [SPOT_POOL])
    assert all(s["state"] in ("inactive", "deleted") for s in states), states
    assert cloud.problems() == []


def diagnosis(cluster: Cluster, cloud: Cloud, batch_id: int) -> str:
    """What a stuck batch's machines and jobs were doing."""
    jobs = cluster.query("SELECT job_id, state, n_attempts FROM jobs WHERE batch_id = %s AND state <> 'Success' "
                         "LIMIT 20", [batch_id])
    instances = cluster.query("SELECT name, state, deactivation_reason, free_cores_mcpu FROM instances")
    attempts = cluster.query("SELECT job_id, attempt_id, instance_name, start_time_ms, end_time_ms, reason "
                             "FROM attempts WHERE batch_id = %s AND (end_time_ms IS NULL OR reason <> 'exited')",
                             [batch_id])
    logs = {name: cloud.machines.log(name)[-3000:] for name in cloud.machines.running()}
    driver = (cluster.data_dir / "logs" / "driver-0.log")
    return (f"jobs not done: {jobs}\ninstances: {instances}\nopen or odd attempts: {attempts}\n"
            f"cloud runs {cloud.live()}; created {cloud.created()}; deleted {cloud.deleted()}\n"
            f"driver log: {driver.read_text()[-6000:] if driver.exists() else ''}\nworkers running: {logs}")


# -- GCP ---------------------------------------------------------------------------------------------------


def service_account(path: Path, project: str) -> str:
    """A service account key file for Application Default Credentials; returns its public key (PEM)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": project, "private_key_id": "e2e-key", "private_key": private,
        "client_email": f"corral-driver@{project}.iam.gserviceaccount.com", "client_id": "1",
        # Never called: the Compute client sends self-signed JWTs. Loopback, so a call would fail here.
        "token_uri": "http://127.0.0.1:9/token"}))
    path.chmod(0o600)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def unsigned_calls(api: GcpApi, public_key: str) -> list[str]:
    """Compute Engine calls without a valid JWT of the driver's service account."""
    bad = []
    for recorded in api.requests:
        header = {k.lower(): v for k, v in recorded.headers.items()}.get("authorization", "")
        try:
            claims = google.auth.jwt.decode(header.removeprefix("Bearer "), certs=public_key,
                                            audience="https://compute.googleapis.com/")
            assert claims["iss"].startswith("corral-driver@")
        except Exception as e:  # noqa: BLE001 - each bad one is listed
            bad.append(f"{recorded.method}: {e}")
    return bad


@pytest.fixture
def gcp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, Cluster]]:
    api = GcpApi(termination_delay_s=5.0)  # Spot: about 30 s of notice in the real cloud
    api.start()
    machines = Machines(tmp_path / "machines", "gcp")
    api.on_create = lambda name, url, items: machines.boot(name, url)
    api.on_delete = machines.delete
    public_key = service_account(tmp_path / "driver-sa.json", api.project)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "driver-sa.json"))
    billing = GcpBillingApi()
    billing.start()
    config = {"project": api.project, "deployment": "e2e", "api_endpoint": api.endpoint,
              "billing_api_endpoint": billing.endpoint,
              "boot_image": f"projects/{api.project}/global/images/family/corral-worker",
              "regions": [{"name": region, "zones": list(zones)} for region, zones in api.regions.items()],
              "call_timeout_s": 20, "operation_timeout_s": 60}
    cloud = Cloud("gcp", "us-central1", machines, api.preempt,
                  lambda: [r.body["name"] for r in api.calls("instances.insert")],
                  lambda: {r.path.rsplit("/", 1)[-1] for r in api.calls("instances.delete")},
                  lambda: set(api.instances()),
                  lambda: api.violations + unsigned_calls(api, public_key),
                  lambda: [WorkerBootstrap.from_json(next(i["value"] for i in r.body["metadata"]["items"]
                                                          if i["key"] == METADATA_KEY))
                           for r in api.calls("instances.insert")],
                  "cpu/gcp/n2-spot/us-central1", "gcp-catalog")
    try:
        cluster = start_cluster(tmp_path, "gcp", config)
        try:
            yield cloud, cluster
        finally:
            cluster.stop()
    finally:
        machines.stop_all()
        api.stop()
        billing.stop()


# -- Azure -------------------------------------------------------------------------------------------------

SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
GROUP = "corral-workers"
ARM_TOKEN = "e2e-managed-identity-token"


class LoopThread:
    """An event loop in a thread of its own, for the Azure server (aiohttp) beside the blocking test."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="azure-api", daemon=True)
        self._thread.start()

    def run(self, make: Callable[[], Any]) -> Any:
        """`make()` called in the loop (awaited if it is a coroutine)."""
        async def call() -> Any:
            result = make()
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(30)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture
def azure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Cloud, Cluster]]:
    tls = DevCertificateAuthority(tmp_path / "azure-ca").issue("azure-api")
    machines = Machines(tmp_path / "machines", "azure")
    loop = LoopThread()
    server: AzureApiServer = loop.run(lambda: AzureApiServer(
        tls.cert, tls.key, tls.ca_cert, SUBSCRIPTION, ARM_TOKEN, polls=1, page_size=50,
        on_create=lambda name, url, user_data, custom_data: machines.boot(name, url),
        on_delete=machines.delete, resource_groups={GROUP}).start())
    # The driver's machine has a managed identity: azure-identity asks its metadata service for a token.
    monkeypatch.setenv("AZURE_POD_IDENTITY_AUTHORITY_HOST", server.identity_host("driver"))
    config = {"subscription_id": SUBSCRIPTION, "resource_group": GROUP, "locations": ["westeurope", "northeurope"],
              "subnet_id": f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/Microsoft.Network/"
                           "virtualNetworks/corral/subnets/workers",
              "image": {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server"},
              "admin_username": "corral", "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAITestKeyOnly",
              "deployment": "e2e", "base_url": server.base_url, "connection_verify": str(server.ca_file),
              "poll_interval_s": 0.05, "operation_timeout_s": 60, "retry_total": 1,
              # No Retail Prices API here: a port nothing listens on (the price file's prices stay).
              "retail_prices_endpoint": f"https://127.0.0.1:{closed_port()}/api/retail/prices"}

    def names(method: str) -> list[str]:
        return [r.path.rsplit("/", 1)[-1] for r in loop.run(lambda: server.recorded(method, "/virtualMachines/"))]

    def problems() -> list[str]:
        tokens = loop.run(lambda: server.recorded("GET", "/identity/oauth2/token"))
        return loop.run(lambda: list(server.invalid)) + ([] if tokens else ["no managed identity token asked for"])

    cloud = Cloud("azure", "westeurope", machines, lambda name: loop.run(lambda: server.preempt(name, notice_s=20.0)),
                  lambda: names("PUT"), lambda: set(names("DELETE")), lambda: loop.run(lambda: set(server.vms)),
                  problems,
                  lambda: [WorkerBootstrap.from_json(base64.b64decode(r.body["properties"]["userData"]))
                           for r in loop.run(lambda: server.recorded("PUT", "/virtualMachines/"))],
                  "cpu/azure/standard_d2s_v5-spot/westeurope", "file")
    try:
        cluster = start_cluster(tmp_path, "azure", config)
        try:
            yield cloud, cluster
        finally:
            cluster.stop()
    finally:
        machines.stop_all()
        with contextlib.suppress(Exception):
            loop.run(server.close)
        loop.close()


# -- the tests ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_200_jobs_on_gcp_machines(gcp: tuple[Cloud, Cluster]) -> None:
    cloud, cluster = gcp
    run_batch(cluster, cloud, 200)


@pytest.mark.timeout(300)
def test_200_jobs_on_azure_machines(azure: tuple[Cloud, Cluster]) -> None:
    cloud, cluster = azure
    run_batch(cluster, cloud, 200)
