"""Prometheus metrics of every process (issue 14, acceptance 6): with `corral up --metrics`, a scrape of
each target during a run shows the metrics docs/operations.md names, moving, and the scheduled-jobs
counter equals the jobs that ran."""

from __future__ import annotations

import json
import ssl
import urllib.error
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import corral
from tests.e2e import cluster as up
from tests.e2e.cluster import eventually
from tests.oci.host import WHY_NOT

pytestmark = pytest.mark.usefixtures("host_ip_forwarding")

N_JOBS = 12
JOB_S = 8

EVERY_SERVICE = {"corral_rpc_requests_total", "corral_rpc_duration_seconds_count"}
DRIVER = {"corral_driver_loop_cycle_seconds_count", "corral_driver_jobs_scheduled_total",
          "corral_driver_jobs_cancelled_total", "corral_driver_fair_share_seconds_count",
          "corral_driver_ready_jobs", "corral_driver_ready_cores", "corral_driver_running_jobs",
          "corral_driver_running_cores", "corral_driver_workers"}
WORKER = {"corral_worker_running_attempts", "corral_worker_image_pulls_total", "corral_worker_image_cache_bytes",
          "corral_worker_log_upload_bytes_total"}


def samples_of(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of one scrape, by sample name."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def targets(metrics_dir: Path) -> dict[str, str]:
    """The file_sd targets corral up keeps: part -> host:port."""
    return {t["labels"]["part"]: t["targets"][0] for t in json.loads((metrics_dir / "targets.json").read_text())}


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(value for found, value in samples.get(name, []) if all(found.get(k) == v for k, v in labels.items()))


def test_every_process_serves_its_metrics_and_they_move(tmp_path: Path) -> None:
    # In containers where this machine can run them, so that the workers pull their image.
    runtime = "process" if WHY_NOT else "oci"
    cluster = up.start(tmp_path, "--metrics", "--idle-timeout", "30", "--worker-cores", "4",
                       "--worker-runtime", runtime)

    def scrape(target: str) -> dict[str, list[tuple[dict[str, str], float]]]:
        return samples_of(cluster.scrape(target))

    try:
        metrics_dir = Path(cluster.endpoints["metrics"]).parent
        assert set(targets(metrics_dir)) == {"auth", "driver-0", "driver-1", "frontend"}
        before = {part: scrape(target) for part, target in targets(metrics_dir).items()}
        # A caller without the scraper's certificate (a job of the process runtime, on the host's network)
        # is refused by every process, before any metric is read.
        for target in targets(metrics_dir).values():
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
                cluster.scrape(target, with_certificate=False)

        builder = corral.BatchBuilder("default")
        for i in range(N_JOBS):
            # Long enough for the leader's gauges (read every 5 s) to see them run.
            builder.job("busybox", ["sh", "-c", f"echo job {i}; sleep {JOB_S}"], cores=0.25)
        with cluster.client() as client:
            batch = client.submit(builder)
            # While the jobs run, the leader's gauges see them (read every few seconds).

            def leader_sees_running() -> dict | None:
                for part, target in targets(metrics_dir).items():
                    if part.startswith("driver-"):
                        samples = scrape(target)
                        if total(samples, "corral_driver_running_jobs") > 0 \
                                and total(samples, "corral_driver_workers", state="active") > 0:
                            return samples
                return None

            running = eventually(leader_sees_running, timeout_s=60, what="the leader's gauges of running jobs")
            assert {labels["user"] for labels, _ in running["corral_driver_running_jobs"]} == {"admin"}
            done = client.wait(batch.batch_id)
            assert done.counts.n_succeeded == N_JOBS
            with pytest.raises(corral.NotFound):
                client.get_batch(10**12)  # counted with its status
            workers = eventually(lambda: {p: t for p, t in targets(metrics_dir).items() if p.startswith("worker-")}
                                 or None, timeout_s=10, what="a worker's metrics target")
            for target in workers.values():
                with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionResetError)):
                    cluster.scrape(target, with_certificate=False)
        after = {part: scrape(target) for part, target in targets(metrics_dir).items()}
    finally:
        cluster.stop()

    # A standby driver and a worker may have served no RPC to its end (the workers' sessions are streams to
    # the leader; a worker is called only for ListImages): the others have.
    for part in ("auth", "frontend"):
        assert EVERY_SERVICE <= set(after[part]), part
    assert any(EVERY_SERVICE <= set(after[p]) for p in after if p.startswith("driver-"))
    # Each service served RPCs during the run; the frontend's SubmitBatch among them, counted as OK.
    for part in ("auth", "frontend"):
        assert total(after[part], "corral_rpc_requests_total") > total(before[part], "corral_rpc_requests_total")
    assert total(after["frontend"], "corral_rpc_requests_total", method="SubmitBatch", code="OK") == 1
    assert total(after["frontend"], "corral_rpc_requests_total", service="corral.batch.v1.BatchService",
                 method="GetBatch", code="NOT_FOUND") == 1
    assert total(after["frontend"], "corral_rpc_duration_seconds_count", method="GetBatch") >= 1
    drivers = [after[p] for p in after if p.startswith("driver-")]
    # Every job that ran was scheduled once, by the driver that led (the gauges are the leader's alone, and
    # were seen above while the jobs ran).
    [leader] = [s for s in drivers if total(s, "corral_driver_jobs_scheduled_total") > 0]
    assert total(leader, "corral_driver_jobs_scheduled_total") == N_JOBS
    assert DRIVER - {"corral_driver_ready_jobs", "corral_driver_ready_cores"} <= set(running) | set(leader)
    assert total(leader, "corral_driver_fair_share_seconds_count") > 0
    assert all(total(s, "corral_driver_loop_cycle_seconds_count", loop="scheduler") > 0 for s in drivers)
    for part in workers:
        samples = after[part]
        assert WORKER <= set(samples), part
    assert sum(total(after[p], "corral_worker_log_upload_bytes_total") for p in workers) \
        >= sum(len(f"job {i}\n") for i in range(N_JOBS))
    if runtime == "oci":  # busybox, pulled from corral up's registry once by each worker that ran a job
        # (the autoscaler may start a second worker that the jobs, a quarter core each, never reach)
        ran = [p for p in workers if total(after[p], "corral_worker_log_upload_bytes_total") > 0]
        assert ran and all(total(after[p], "corral_worker_image_pulls_total", outcome="pulled") == 1 for p in ran)
        assert all(total(after[p], "corral_worker_image_pulls_total", outcome="pulled") <= 1 for p in workers)
        assert all(total(after[p], "corral_worker_image_cache_bytes") > 0 for p in ran)


@pytest.mark.parametrize("address", ["nonsense", "127.0.0.1", "127.0.0.1:notaport"])
def test_a_bad_metrics_address_is_refused(address: str) -> None:
    from services.common.metrics import MetricsServer
    from services.common.tls import TlsFiles

    with pytest.raises(ValueError, match="HOST:PORT"):
        MetricsServer(address, TlsFiles(Path("ca.pem"), Path("x.pem"), Path("x.key")))
