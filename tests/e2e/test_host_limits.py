"""Issue 33, part 2, on a real `corral up`: one tenant's eight fork bombs
cannot take the host's process ids, and another tenant's batch completes
meanwhile; a job writing past its storage request ends Failed naming it,
and `corral job` says so.

The caps are small so that the host is never in danger (others work on it
too): a job's share of a 2-core worker's 100 + 100 x 2 = 300 processes is
150 (the per-job cap is 200), and the deployment's cgroup holds at most
1,200. The test samples the deployment's cgroup (pids.current) and every
worker's while the bombs run, and counts the host's threads
(/proc/*/task) for the report.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_state_pb2
from services.common.worker_limits import deployment_of_data_dir
from services.worker.oci.cgroups import Hierarchies
from services.worker.worker_cgroup import host_pid_max
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster

pytestmark = [pytest.mark.timeout(420),
              pytest.mark.skipif(os.geteuid() != 0, reason="the process runtime isolates jobs, in cgroups, as root")]

MIB = 2**20
DEPLOYMENT_CAP = 1200
WORKER_CAP = 300
BOMB = "b() { b | b & }; b; sleep 120"
LIMITS = ("--max-processes-per-job", "200", "--max-processes-per-core", "100", "--max-processes-base", "100",
          "--deployment-max-processes", str(DEPLOYMENT_CAP), "--process-check-interval", "1",
          "--storage-check-interval", "0.2")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    yield from up.running(up.start(tmp_path_factory.mktemp("limits"), "--idle-timeout", "20", *LIMITS))


class Sampler:
    """The most processes the deployment's cgroup and any worker's held, and the host's threads, sampled in a
    thread every few milliseconds until stopped."""

    def __init__(self, deployment: Path):
        self.deployment = deployment
        self.deployment_peak = self.worker_peak = self.host_peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.01):
            self.deployment_peak = max(self.deployment_peak, _read(self.deployment / "pids.current"))
            workers = [d for d in self.deployment.iterdir() if d.is_dir()] if self.deployment.is_dir() else []
            self.worker_peak = max([self.worker_peak, *(_read(d / "pids.current") for d in workers)])
            if self.samples % 20 == 0:
                self.host_peak = max(self.host_peak, _host_threads())
            self.samples += 1


def _read(path: Path) -> int:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return 0


def _host_threads() -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


def test_eight_fork_bombs_stay_in_their_caps_while_another_tenants_batch_completes(cluster: Cluster) -> None:
    deployment = Hierarchies.of_host().by_controller["pids"] / "corral" / deployment_of_data_dir(cluster.data_dir)
    mallory, bob = cluster.user("mallory"), cluster.user("bob")
    baseline = _host_threads()
    with Sampler(deployment) as sampler, cluster.client(mallory) as attacker, cluster.client(bob) as tenant:
        bombs = corral.BatchBuilder("default", attributes={"test": "fork-bombs"})
        for _ in range(8):
            bombs.job("busybox", BOMB, timeout_s=150)
        bombs_id = attacker.submit(bombs).batch_id
        batch = corral.BatchBuilder("default", attributes={"test": "neighbour"})
        for _ in range(6):
            batch.job("busybox", "for i in $(seq 20); do sleep 0.1 & done; wait; echo ok")
        batch_id = tenant.submit(batch).batch_id
        done = tenant.wait(batch_id)
        bombed = attacker.wait(bombs_id)
        # Their own caps were in place before any bomb ran.
        assert (deployment / "pids.max").read_text().strip() == str(DEPLOYMENT_CAP)
    assert done.counts.n_succeeded == 6, done
    assert [tenant_log.decode() for tenant_log in (tenant_log_of(cluster, bob, batch_id, j) for j in range(1, 7))] \
        == ["ok\n"] * 6
    assert bombed.counts.n_failed == 8, bombed
    with cluster.client(mallory) as attacker:
        for job_id in range(1, 9):
            job = attacker.get_job(bombs_id, job_id)
            assert job.state == job_state_pb2.JOB_STATE_FAILED
            assert job.attempts[-1].error_message == (
                "hit its process limit: the kernel refused a fork at its limit of 150 processes and threads (the "
                "cgroup's pids.max); its processes were killed"), job
    shown = cluster.cli("job", str(bombs_id), "1", env={"CORRAL_TOKEN": mallory})
    assert "hit its process limit" in shown.stdout, shown
    print(f"peaks: deployment {sampler.deployment_peak}, a worker {sampler.worker_peak}, host threads "
          f"{sampler.host_peak} (before: {baseline}; kernel.pid_max {host_pid_max()}), {sampler.samples} samples")
    assert sampler.samples > 100
    assert 0 < sampler.deployment_peak <= DEPLOYMENT_CAP and 0 < sampler.worker_peak <= WORKER_CAP
    assert sampler.host_peak < host_pid_max()


def tenant_log_of(cluster: Cluster, token: str, batch_id: int, job_id: int) -> bytes:
    with cluster.client(token) as client:
        return client.job_log(batch_id, job_id)


def test_a_job_writing_past_its_storage_request_ends_failed_naming_it(cluster: Cluster) -> None:
    with cluster.client() as admin:
        builder = corral.BatchBuilder("default", attributes={"test": "storage"})
        builder.job("busybox", "for i in 1 2 3 4 5 6 7 8; do head -c 4194304 /dev/zero > f$i; done; sleep 120",
                    storage_bytes=16 * MIB, timeout_s=150)
        batch_id = admin.submit(builder).batch_id
        admin.wait(batch_id)
        job = admin.get_job(batch_id, 1)
    assert job.state == job_state_pb2.JOB_STATE_FAILED
    message = job.attempts[-1].error_message
    assert message.startswith("wrote more than its storage request of 16 MiB (storage_bytes): "), message
    assert message.endswith(" in its scratch when checked; its processes were killed"), message
    shown = cluster.cli("job", str(batch_id), "1")
    assert "wrote more than its storage request of 16 MiB (storage_bytes)" in shown.stdout, shown


def test_the_deployments_cgroup_goes_with_its_last_worker(cluster: Cluster) -> None:
    deployment = Hierarchies.of_host().by_controller["pids"] / "corral" / deployment_of_data_dir(cluster.data_dir)
    cluster.stop()
    assert cluster.process.returncode == 0
    up.eventually(lambda: not deployment.exists(), timeout_s=30, what="the deployment's cgroup removed")
