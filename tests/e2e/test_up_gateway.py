"""`corral up --gateway` as a real process, with the real Envoy: people reach corral only through the
public gateway (the printed address, the CLI's profile, the Python client, REST), which keeps its
address across a restart; workers reach the leading driver only through the internal gateway, and
follow a new leader through it when the leader is killed."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import ssl
import stat
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import corral
from services.common.processes import PidFiles
from services.gateway.envoy_process import admin_get
from services.up.ports import free_port
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually, processes

pytestmark = pytest.mark.timeout(240)

BATCH = """
billing_project: default
jobs:
  - name: a
    image: busybox
    command: [echo, hello]
  - image: busybox
    command: [echo, after]
    parents: [a]
"""


def failed_login_from(cluster: Cluster, source: str, username: str) -> int:
    """POST a wrong password to the gateway's REST login from the loopback address `source`: the status."""
    host, _, port = cluster.endpoints["gateway"].rpartition(":")
    context = ssl.create_default_context(cafile=cluster.endpoints["ca_cert"])
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=30,
                                             source_address=(source, 0))
    try:
        connection.request("POST", "/api/v1/auth/login", json.dumps({"username": username, "password": "x"}),
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


def own_ports(cluster: Cluster) -> set[int]:
    """Every port the services listen on themselves (their ports files)."""
    found = set()
    for ports_file in (cluster.data_dir / "run").glob("*.ports"):
        found |= {int(port) for port in json.loads(ports_file.read_text()).values() if isinstance(port, int)}
    return found


def rest_get(cluster: Cluster, path: str) -> dict:
    """GET https://GATEWAY/PATH as the administrator, verifying the gateway with DATA/ca.pem."""
    context = ssl.create_default_context(cafile=cluster.endpoints["ca_cert"])
    request = urllib.request.Request(f"https://{cluster.endpoints['gateway']}{path}",
                                     headers={"Authorization": f"Bearer {cluster.admin_token}"})
    with urllib.request.urlopen(request, context=context, timeout=30) as answer:  # noqa: S310 - the test's gateway
        return json.loads(answer.read())


def workers_driver_addresses(cluster: Cluster) -> dict[int, str]:
    """pid -> the --driver-addresses of each of the cluster's workers."""
    argvs = processes()
    return {pid: argvs[pid][argvs[pid].index("--driver-addresses") + 1]
            for pid in cluster.worker_pids().values() if pid in argvs}


def test_people_reach_corral_through_the_public_gateway(tmp_path: Path) -> None:
    began = time.monotonic()
    cluster = up.start(tmp_path, "--gateway", "--gateway-port", "0", "--internal-gateway-port", "0", "--metrics")
    print(f"corral up --gateway was up in {time.monotonic() - began:.1f} s")
    try:
        gateway = cluster.endpoints["gateway"]
        assert cluster.said(f"corral's address: {gateway}")
        assert cluster.endpoints["frontend"] == cluster.endpoints["auth"] == gateway
        assert gateway.startswith("localhost:") and int(gateway.split(":")[1]) not in own_ports(cluster)
        profile = json.loads((tmp_path / "cli.json").read_text())["profiles"]["admin"]
        assert profile["frontend"] == profile["auth"] == gateway

        # The CLI, through the profile corral up wrote.
        batch_file = tmp_path / "batch.yaml"
        batch_file.write_text(BATCH)
        submitted = cluster.cli("submit", str(batch_file))
        assert submitted.returncode == 0, submitted.stderr
        waited = cluster.cli("wait", "1")
        assert waited.returncode == 0, waited.stdout + waited.stderr
        assert cluster.cli("logs", "1", "2").stdout.strip() == "after"

        # The Python client.
        builder = corral.BatchBuilder("default")
        first = builder.job("busybox", "echo one", cores=1)
        builder.job("busybox", "echo two", cores=1, parents=[first])
        with cluster.client() as client:
            batch_id = client.submit(builder).batch_id
            assert client.wait(batch_id).counts.n_succeeded == 2
            assert client.job_log(batch_id, 2).decode().strip() == "two"

        # REST, with the same bearer token.
        listed = rest_get(cluster, "/api/v1/batches")
        assert {b["batchId"] for b in listed["batches"]} == {"1", str(batch_id)}

        # Logins through the gateway are limited per client, not per gateway: one address's failures
        # (auth's default: 10 free) do not lock another's.
        assert [failed_login_from(cluster, "127.0.0.2", f"nobody{i}") for i in range(11)] == [401] * 10 + [429]
        assert failed_login_from(cluster, "127.0.0.3", "nobody") == 401

        # The workers were given the internal gateway's address, and nothing else.
        assert set(workers_driver_addresses(cluster).values()) == {cluster.endpoints["workers_gateway"]}
        access_log = (cluster.data_dir / "logs" / "gateway-access.log").read_text()
        assert "/corral.batch.v1.BatchService/SubmitBatch" in access_log and '"gateway":"internal"' in access_log

        # With --metrics, each gateway's statistics are a scrape target too, on a listener of their own that
        # asks for the scraper's certificate and forwards /stats/prometheus alone to the admin interface.
        targets = {t["labels"]["part"]: t for t in json.loads(Path(cluster.endpoints["metrics"]).read_text())}
        public_stats = targets["gateway-public"]
        assert public_stats["labels"]["__metrics_path__"] == "/stats/prometheus" and "gateway-internal" in targets
        stats = public_stats["targets"][0]
        assert 'envoy_cluster_upstream_rq_total{envoy_cluster_name="frontend"}' in cluster.scrape(
            stats, "/stats/prometheus")
        with pytest.raises(urllib.error.HTTPError, match="404"):
            cluster.scrape(stats, "/quitquitquit")
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
            cluster.scrape(stats, "/stats/prometheus", with_certificate=False)
        # The admin interfaces themselves are Unix sockets only Envoy's account may open, in DATA/run (0700).
        for name in ("public", "internal"):
            admin = cluster.data_dir / "run" / f"gateway-{name}.admin"
            assert stat.S_ISSOCK(admin.stat().st_mode) and stat.S_IMODE(admin.stat().st_mode) == 0o600
        assert stat.S_IMODE((cluster.data_dir / "run").stat().st_mode) == 0o700
        # The secret the public gateway shows auth is private to corral's account, as is the config holding it.
        for secret in (cluster.data_dir / "certs" / "auth" / "gateway.token",
                       cluster.data_dir / "gateway" / "envoy-public.yaml"):
            assert stat.S_IMODE(secret.stat().st_mode) == 0o600, secret

        # A gateway is a supervised part: killed, it is started again on the same address.
        record = PidFiles(cluster.data_dir / "run" / "pids").read("gateway-public")
        assert record is not None and record.alive()
        os.kill(record.pid, signal.SIGKILL)

        def serves_again() -> bool:
            return any(line.startswith("gateway-public (pid ") and "serves again" in line
                       for line in list(cluster.output))

        eventually(serves_again, timeout_s=30, what="the public gateway to serve again")
        assert cluster.said(f"gateway-public (pid {record.pid}) exited with -9 (killed by SIGKILL)")
        assert {b["batchId"] for b in rest_get(cluster, "/api/v1/batches")["batches"]} == {"1", str(batch_id)}

        if os.geteuid() == 0:  # the process runtime isolates jobs (a uid of their own) only as root
            metrics_targets = [t["targets"][0] for t in targets.values()]
            reached, refused = probe_from_a_job(cluster, metrics_targets)
            assert reached == [] and refused == 2 + 3 * len(metrics_targets)
    except BaseException:
        cluster.stop()
        raise
    assert cluster.stop() == 0
    assert cluster.said("waiting for gateway-public") and cluster.said("waiting for gateway-internal")


PROBE = """
import socket, ssl, sys, urllib.request
reached = []
for path in sys.argv[1].split(","):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.sendall(b"GET /ready HTTP/1.0\\r\\n\\r\\n")
        if s.recv(100):
            reached.append(path)
    except OSError as e:
        print("refused", path, e)
    finally:
        s.close()
context = ssl.create_default_context()
context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
for target in sys.argv[2].split(","):
    for scheme, path in (("https", "/metrics"), ("https", "/stats/prometheus"), ("http", "/metrics")):
        try:
            urllib.request.urlopen(f"{scheme}://{target}{path}", timeout=5, context=context).read()
            reached.append(f"{scheme}://{target}{path}")
        except Exception as e:
            print("refused", scheme, target, path, repr(e))
print("reached:", ",".join(reached))
"""


def probe_from_a_job(cluster: Cluster, metrics_targets: list[str]) -> tuple[list[str], int]:
    """What a job of the process runtime (the host's network) reached of the gateways' admin sockets and
    of the metrics ports (each place that answered it), and how many places refused it."""
    sockets = ",".join(str(cluster.data_dir / "run" / f"gateway-{name}.admin") for name in ("public", "internal"))
    builder = corral.BatchBuilder("default")
    builder.job("busybox", ["/usr/bin/python3", "-c", PROBE, sockets, ",".join(metrics_targets)], cores=0.25)
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
        assert client.wait(batch_id).counts.n_succeeded == 1
        log = client.job_log(batch_id, 1).decode()
    [line] = [entry for entry in log.splitlines() if entry.startswith("reached:")]
    reached = [place for place in line.removeprefix("reached:").strip().split(",") if place]
    return reached, sum(entry.startswith("refused ") for entry in log.splitlines())


def test_the_public_address_is_the_same_after_a_restart(tmp_path: Path) -> None:
    ports = ("--gateway-port", str(free_port()), "--internal-gateway-port", str(free_port()))
    began = time.monotonic()
    cluster = up.start(tmp_path, "--gateway", *ports)
    try:
        address = cluster.endpoints["gateway"]
        assert address == f"localhost:{ports[1]}"
        batch_file = tmp_path / "batch.yaml"
        batch_file.write_text(BATCH)
        assert cluster.cli("submit", str(batch_file)).returncode == 0
        shutil.copy(tmp_path / "cli.json", tmp_path / "saved.json")  # a CLI config saved by someone
        services_before = own_ports(cluster)
    finally:
        assert cluster.stop() == 0
    cluster = up.start(tmp_path, "--gateway", *ports)
    print(f"two starts and a stop of corral up --gateway took {time.monotonic() - began:.1f} s")
    try:
        assert cluster.endpoints["gateway"] == address
        assert own_ports(cluster) != services_before  # the services moved (new free ports); the gateway did not
        # The saved configuration still reaches corral.
        listed = cluster.cli("ls", env={"CORRAL_CONFIG": str(tmp_path / "saved.json")})
        assert listed.returncode == 0 and "batch 1" in listed.stdout, listed.stderr
    finally:
        assert cluster.stop() == 0


def sessions_by_driver(cluster: Cluster) -> dict[str, int]:
    """'localhost:PORT' of each driver -> requests (worker sessions, calls) the internal gateway has open
    with it now, from its admin interface's cluster stats."""
    lines = admin_get(cluster.data_dir / "run" / "gateway-internal.admin", "/clusters").splitlines()
    active = {}
    for line in lines:
        parts = line.split("::")  # driver::127.0.0.1:PORT::rq_active::N
        if len(parts) == 4 and parts[0] == "driver" and parts[2] == "rq_active":
            active[f"localhost:{parts[1].rpartition(':')[2]}"] = int(parts[3])
    return active


def leader(cluster: Cluster) -> tuple[str, int]:
    """The leading driver's address and the epoch."""
    [row] = cluster.query("SELECT leader_name, epoch FROM leader_epoch")
    return row["leader_name"], int(row["epoch"])


def test_workers_follow_a_killed_leader_through_the_internal_gateway(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, "--gateway", "--gateway-port", "0", "--internal-gateway-port", "0",
                       "--worker-cores", "2", "--max-workers", "1", "--idle-timeout", "120")
    try:
        drivers = cluster.endpoints["drivers"].split(",")
        builder = corral.BatchBuilder("default")
        builder.job("busybox", "sleep 6; echo survived", cores=1)
        with cluster.client() as client:
            running_id = client.submit(builder).batch_id
            eventually(lambda: cluster.query("SELECT 1 FROM attempts WHERE batch_id = %s AND start_time_ms IS NOT "
                                             "NULL AND end_time_ms IS NULL", (running_id,)),
                       timeout_s=45, what="the job to run")
            killed, epoch = leader(cluster)
            eventually(lambda: sessions_by_driver(cluster).get(killed), timeout_s=20,
                       what="the worker's session with the leader, through the gateway")
            workers = workers_driver_addresses(cluster)
            assert set(workers.values()) == {cluster.endpoints["workers_gateway"]}
            record = PidFiles(cluster.data_dir / "run" / "pids").read(f"driver-{drivers.index(killed)}")
            assert record is not None and record.alive()
            killed_pid = record.pid

            os.kill(killed_pid, signal.SIGKILL)
            killed_at = time.monotonic()

            def session_with_new_leader() -> str | None:
                name, new_epoch = leader(cluster)
                return name if new_epoch > epoch and sessions_by_driver(cluster).get(name) else None

            new_leader = eventually(session_with_new_leader, timeout_s=45, interval_s=0.1,
                                    what="the worker's session with the new leader")
            moved_s = time.monotonic() - killed_at
            print(f"the worker's session reached the new leader ({new_leader}) through the internal gateway "
                  f"{moved_s:.2f} s after the leader ({killed}) was killed")

            builder = corral.BatchBuilder("default")
            builder.job("busybox", "echo after the failover", cores=1)
            after_id = client.submit(builder).batch_id
            assert client.wait(running_id).counts.n_succeeded == 1
            assert client.job_log(running_id, 1).decode().strip() == "survived"
            assert client.wait(after_id).counts.n_succeeded == 1
        # The same worker processes, told nothing new.
        assert workers_driver_addresses(cluster) == workers
    except BaseException:
        cluster.stop()
        raise
    assert cluster.stop() == 0
