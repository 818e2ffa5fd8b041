"""Issue 33, part 2, in the process runtime with real processes (as root:
jobs isolated, in cgroups of their own): fork bombs are held to their
cores' share of their worker's process cap and end Failed saying so while
a neighbour succeeds; the worker's cgroup never holds more than its cap; a
job writing past its storage request ends Failed naming it."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.logs import LogSink
from services.worker.oci.cgroups import Hierarchies
from services.worker.runtime import JobOutcome, JobRun, ProcessRuntime, ProcessRuntimeConfig, can_isolate

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not can_isolate(), reason="the process runtime's cgroups need root on Linux")]

MIB = 2**20
BOMB = "b() { b | b & }; b; sleep 60"


def spec(script: str) -> js.JobSpec:
    return js.JobSpec(image="ubuntu", script=script, network_mode=js.NETWORK_MODE_NONE)


def job(tmp_path: Path, script: str, attempt_id: str, cores_mcpu: int = 1000, storage_bytes: int = 0) -> JobRun:
    return JobRun(batch_id=7, job_id=3, attempt_id=attempt_id, spec=spec(script), cores_mcpu=cores_mcpu,
                  memory_bytes=0, scratch=tmp_path / "scratch", storage_bytes=storage_bytes)


async def run(runtime: ProcessRuntime, run_job: JobRun) -> tuple[JobOutcome, str]:
    async def nothing(pid: int) -> None:
        pass

    log = LogSink(run_job.log_path)
    outcome = await runtime.run(run_job, log, nothing)
    return outcome, log.read().decode(errors="replace")


def runtime_of_its_own(tmp_path: Path, **settings) -> ProcessRuntime:
    deployment = f"test-{uuid.uuid4().hex[:8]}"
    return ProcessRuntime(ProcessRuntimeConfig(deployment=deployment, cgroup_claims_dir=tmp_path / "claims",
                                               kill_grace_s=1.0, **settings))


async def test_fork_bombs_fill_only_their_share_and_end_failed_while_a_neighbour_succeeds(tmp_path: Path) -> None:
    # A 2-core worker: pids.max 100 + 100 x 2 = 300; a half-core job's share is 75.
    runtime = runtime_of_its_own(tmp_path, cores_mcpu=2000, max_processes_per_core=100, max_processes_base=100,
                                 max_processes=200, deployment_max_processes=1000, process_check_interval_s=0.2)
    pids = Hierarchies.of_host().by_controller["pids"]
    worker = deployment = Path()
    peak = 0
    watching = True

    async def watch_worker() -> None:
        nonlocal peak
        while watching:
            if (worker / "pids.current").exists():
                peak = max(peak, int((worker / "pids.current").read_text()))
            await asyncio.sleep(0.005)

    try:
        await asyncio.gather(*(asyncio.to_thread(runtime.cgroups.start) for _ in range(4)))  # as attempts do
        assert runtime.cgroups.why_not == ""
        deployment = pids / "corral" / runtime.config.deployment
        [worker] = [d for d in deployment.iterdir() if d.is_dir()]
        assert ((worker / "pids.max").read_text().strip(), (deployment / "pids.max").read_text().strip()) == (
            "300", "1000")
        watcher = asyncio.create_task(watch_worker())
        try:
            neighbour = asyncio.create_task(run(runtime, job(
                tmp_path, "for i in $(seq 30); do sleep 0.2 & done; wait; sleep 3; echo done=yes", "n1", 500)))
            bombs = await asyncio.gather(*(run(runtime, job(tmp_path, BOMB, f"b{i}", 500)) for i in range(3)))
            neighbour_outcome, neighbour_log = await neighbour
        finally:
            watching = False
            await watcher
        for outcome, log in bombs:
            assert (outcome.state, outcome.end_reason) == ("Failed", "exited"), (outcome, log)
            assert outcome.error_message == (
                "hit its process limit: the kernel refused a fork at its limit of 75 processes and threads (the "
                "cgroup's pids.max); its processes were killed")
        assert (neighbour_outcome.state, neighbour_log) == ("Success", "done=yes\n"), neighbour_outcome
        assert 75 <= peak <= 300, peak  # a bomb filled its share at least, and the worker never held more
    finally:
        await runtime.close()
    assert not deployment.exists()  # the worker's cgroup, and the deployment's with no other worker in it


async def test_a_job_writing_files_past_its_storage_request_is_killed(tmp_path: Path) -> None:
    runtime = runtime_of_its_own(tmp_path, storage_check_interval_s=0.2)
    try:
        run_job = job(tmp_path, "for i in 1 2 3 4 5 6 7 8; do head -c 4194304 /dev/zero > f$i; done; "
                                "echo written; sleep 60", "s1", storage_bytes=16 * MIB)
        assert "at most its storage request of 16 MiB" in runtime.isolation(run_job)
        began = time.monotonic()
        outcome, log = await run(runtime, run_job)
        assert time.monotonic() - began < 30
        assert (outcome.state, outcome.end_reason) == ("Failed", "exited"), (outcome, log)
        assert outcome.error_message.startswith("wrote more than its storage request of 16 MiB (storage_bytes): ")
        assert outcome.error_message.endswith(" in its scratch when checked; its processes were killed")
    finally:
        await runtime.close()
    # One file past it: the kernel stops it at 16 MiB (RLIMIT_FSIZE); the job exits 0 and still fails. On a
    # runtime that checks only when the job ends: a check every 0.2 s could kill it (the file is at its request)
    # before its last line on a loaded machine, as it once did in CI.
    (tmp_path / "ended").mkdir()
    runtime = runtime_of_its_own(tmp_path / "ended", storage_check_interval_s=3600)
    try:
        outcome, log = await run(runtime, job(tmp_path, "head -c 67108864 /dev/zero > big; echo head=$?; "
                                                        "wc -c < big", "s2", storage_bytes=16 * MIB))
        assert log.endswith(f"head={128 + 25}\n{16 * MIB}\n"), log  # after the shell's "File size limit exceeded"
        assert (outcome.state, outcome.exit_code) == ("Failed", 0)
        assert outcome.error_message.endswith(" in its scratch when it ended; the command exited with code 0")
    finally:
        await runtime.close()


async def test_a_bomb_filling_its_deployments_cap_is_killed_and_a_small_neighbour_is_not(tmp_path: Path) -> None:
    """Two 2-core workers of one deployment (300 each) under a deployment cap of 120, less than theirs
    together and less than a job's own (150): a bomb is refused by the deployment's cap, never its own, and
    is killed for holding at least its share of the full deployment (each worker's part is 60, a 1-core
    job's 30); a neighbour on the other worker, holding one process meanwhile, is not to blame, and forks
    and succeeds once the bomb is gone."""
    deployment = f"test-{uuid.uuid4().hex[:8]}"
    caps = dict(deployment=deployment, cgroup_claims_dir=tmp_path / "claims", kill_grace_s=1.0, cores_mcpu=2000,
                max_processes_per_core=100, max_processes_base=100, deployment_max_processes=120,
                process_check_interval_s=0.2)
    first, second = (ProcessRuntime(ProcessRuntimeConfig(**caps)) for _ in range(2))
    pids = Hierarchies.of_host().by_controller["pids"] / "corral" / deployment
    try:
        neighbour_job = job(tmp_path, "sleep 4; for i in $(seq 10); do sleep 0.1 & done; wait; echo done=yes", "n1")
        neighbour_log = LogSink(neighbour_job.log_path)
        started = asyncio.Event()

        async def on_started(pid: int) -> None:
            started.set()

        neighbour = asyncio.create_task(second.run(neighbour_job, neighbour_log, on_started))
        await asyncio.wait_for(started.wait(), 30)
        outcome, log = await run(first, job(tmp_path, BOMB, "b1"))
        assert (outcome.state, outcome.end_reason) == ("Failed", "exited"), (outcome, log)
        assert outcome.error_message == (
            "hit its process limit: the deployment's 120 processes and threads (pids.max) were all taken, and it "
            "held at least its share of them, 30; its processes were killed"), outcome
        neighbour_outcome = await neighbour
        assert (neighbour_outcome.state, neighbour_log.read()) == ("Success", b"done=yes\n"), neighbour_outcome
        assert int((pids / "pids.peak").read_text()) <= 120
    finally:
        await first.close()
        await second.close()
    assert not pids.exists()
