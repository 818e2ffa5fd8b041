"""Workers as real `python -m services.worker` processes: started by the test
or by the driver's autoscaler through the local provider; idle exit, SIGTERM,
and SIGKILL of a worker mid-job (the dead-worker detector deactivates it and
the job runs again as a new attempt)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from services.db.invariants import check_invariants
from services.driver.servicer import SessionSettings
from services.worker.runtime import can_isolate
from tests.job_processes import marked, processes_marked, processes_with
from tests.service.test_worker import Cluster, ClusterFactory, eventually, script
from tests.service.test_worker import cluster, make_cluster  # noqa: F401 - fixtures shared with test_worker.py

pytestmark = pytest.mark.timeout(90)


@contextlib.asynccontextmanager
async def worker_process(cluster: Cluster, name: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """`python -m services.worker` for a new instance, as the local provider starts it; killed if it outlives
    the block."""
    config = await cluster.instance(name)
    log = open(cluster.tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed below
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.worker", "--instance-name", name, "--cores-mcpu", str(config.cores_mcpu),
        "--driver-addresses", ",".join(config.driver_addresses), "--certs-dir", str(config.certs_dir),
        "--scratch-dir", str(config.scratch_dir), "--log-root-url", config.log_root_url,
        "--usage-interval-s", "0.5", *(["--unisolated-dev"] if config.unisolated_dev else []),
        env={**os.environ, "CORRAL_ACTIVATION_TOKEN": config.activation_token},
        stdout=log, stderr=asyncio.subprocess.STDOUT)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        log.close()


async def test_a_worker_process_runs_a_job_then_exits_0_when_idle(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0,
                                                 idle_timeout_s=2.0))
    # The job sees neither the worker's environment nor its command line (nor its activation token there).
    batch_id, [job_id] = await cluster.submit(script(
        "echo from a process; env | grep -c CORRAL_ACTIVATION_TOKEN; ps -eo args | grep -c '[a]ctivate-w1'; true"))
    async with worker_process(cluster, "w1") as process:
        job = await cluster.final(batch_id, job_id)
        assert job["state"] == "Success"
        assert await asyncio.wait_for(process.wait(), 30) == 0
    row = await cluster.instance_row("w1")
    assert (row["state"], row["deactivation_reason"]) == ("inactive", "worker deactivated itself")
    assert row["ip_address"].startswith("127.0.0.1:")
    [attempt] = await cluster.attempts(batch_id, job_id)
    log = cluster.blobs / "logs" / str(batch_id) / str(job_id) / attempt["attempt_id"] / "main.log"
    assert log.read_bytes() == b"from a process\n0\n0\n"
    assert await check_invariants(cluster.driver.db) == []


async def test_sigterm_stops_a_worker_process_and_its_job_goes_back_to_ready(cluster: Cluster) -> None:
    job_spec, mark = marked(script("sleep 60 & wait"))
    batch_id, [job_id] = await cluster.submit(job_spec)
    async with worker_process(cluster, "w1") as process:
        first = await cluster.started(batch_id, job_id)
        await eventually(lambda: len(processes_marked(mark)) == 2, what="the job's processes")
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    await eventually(lambda: not processes_marked(mark), what="job processes gone")
    assert (await cluster.job(batch_id, job_id))["state"] == "Ready"
    [attempt] = await cluster.attempts(batch_id, job_id)
    assert (attempt["attempt_id"], attempt["reason"]) == (first["attempt_id"], "worker_lost")
    assert (await cluster.instance_row("w1"))["state"] == "inactive"
    assert await check_invariants(cluster.driver.db) == []


async def test_the_autoscaler_starts_a_worker_process_that_runs_the_job(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0,
                                                 idle_timeout_s=1.0), autoscale=True, autoscaler_period_s=0.5)
    batch_id, [job_id] = await cluster.submit(script("echo scaled"))
    job = await cluster.final(batch_id, job_id)
    assert job["state"] == "Success"
    [attempt] = await cluster.attempts(batch_id, job_id)
    instance = await cluster.instance_row(attempt["instance_name"])
    assert instance["inst_coll"] == "standard" and instance["ip_address"].startswith("127.0.0.1:")
    log = cluster.blobs / "logs" / str(batch_id) / str(job_id) / attempt["attempt_id"] / "main.log"
    assert log.read_bytes() == b"scaled\n"
    # Idle, it deactivates itself and its process ends.
    await eventually(lambda: _state(cluster, attempt["instance_name"], "inactive"), what="idle deactivation")
    await eventually(lambda: _no_processes(cluster), what="worker processes gone")
    assert await check_invariants(cluster.driver.db) == []


async def test_a_killed_worker_is_detected_and_its_job_runs_again(make_cluster: ClusterFactory) -> None:
    cluster = await make_cluster(SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=1.0,
                                                 idle_timeout_s=30.0), autoscale=True, autoscaler_period_s=0.5)
    # Each attempt waits to be told (a file in its own working directory) whether it is the second.
    job_spec, mark = marked(script(
        "while [ ! -f decide ]; do sleep 0.05; done; if [ $(cat decide) = second ]; then echo second; exit 0; fi; "
        "sleep 60 & wait"))
    batch_id, [job_id] = await cluster.submit(job_spec)
    first = await cluster.started(batch_id, job_id)
    (local_work_dir(cluster, first) / "decide").write_text("first")
    await eventually(lambda: len(processes_with(TEST_MARK=mark, CORRAL_ATTEMPT_ID=first["attempt_id"])) >= 2,
                     what="the first attempt's processes")
    worker_pid = cluster.driver.provider.pid(first["instance_name"])
    assert worker_pid is not None
    # Its activation token is in no command line (the local provider passed it in the environment).
    token = (await cluster.instance_row(first["instance_name"]))["activation_token"]
    assert token and token.encode() not in Path(f"/proc/{worker_pid}/cmdline").read_bytes()
    os.kill(worker_pid, signal.SIGKILL)
    if can_isolate():  # isolated, its processes die with their worker
        await eventually(lambda: not processes_with(TEST_MARK=mark, CORRAL_ATTEMPT_ID=first["attempt_id"]),
                         what="the first attempt's processes gone with their worker")

    async def second_started() -> dict | None:
        rows = [a for a in await cluster.attempts(batch_id, job_id)
                if a["attempt_id"] != first["attempt_id"] and a["start_time_ms"] is not None]
        return rows[0] if rows else None

    try:
        second = await eventually(second_started, 60, "a second attempt")
        (local_work_dir(cluster, second) / "decide").write_text("second")
        job = await cluster.final(batch_id, job_id, timeout_s=60)
        assert job["state"] == "Success"
    finally:
        # Unisolated, the first attempt's processes outlive their worker: stop them here.
        for pid in processes_marked(mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    dead, second = await cluster.attempts(batch_id, job_id)
    assert (dead["attempt_id"], dead["reason"]) == (first["attempt_id"], "worker_lost")
    assert second["instance_name"] != first["instance_name"] and second["exit_code"] == 0
    row = await cluster.instance_row(first["instance_name"])
    assert (row["state"], row["deactivation_reason"]) == ("inactive", "missed heartbeats")
    log = cluster.blobs / "logs" / str(batch_id) / str(job_id) / second["attempt_id"] / "main.log"
    assert log.read_bytes() == b"second\n"
    assert await check_invariants(cluster.driver.db) == []


def local_work_dir(cluster: Cluster, attempt: dict) -> Path:
    """The working directory of an attempt on a worker the driver's local provider started."""
    return cluster.work_dir(cluster.driver_data_dir / "workers" / attempt["instance_name"], attempt)


async def _state(cluster: Cluster, name: str, state: str) -> bool:
    return (await cluster.instance_row(name))["state"] == state


async def _no_processes(cluster: Cluster) -> bool:
    return not await cluster.driver.provider.alive()
