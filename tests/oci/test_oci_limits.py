"""Issue 33, part 2, on real runc: no job can take the host's process ids or
write past its storage request.

Fork bombs run under a worker of small caps beside an ordinary job: the
worker's cgroup (below its deployment's) has the pids.max of its cores'
formula and never holds more; each bomb gets its cores' share and ends
Failed saying it hit its process limit (read from the kernel); the ordinary
job, which forks too, succeeds. A job writing files past its storage
request is killed and ends Failed naming the limit; one file past it is
stopped at that size by the kernel (RLIMIT_FSIZE) and the job ends Failed
too; a job within its request succeeds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from services.worker.oci.cgroups import Hierarchies
from tests.oci.host import CGROUP_ROOT, OciHost, fields, needs_oci, run, spec, start

pytestmark = [pytest.mark.timeout(120), needs_oci]

MIB = 2**20
BOMB = "b() { b | b & }; b; sleep 60"
"""A fork bomb in busybox's sh: each call starts two more, in the background, forever."""


def worker_pids_dir(oci_host: OciHost, owner: str) -> Path:
    return Hierarchies.of_host().by_controller["pids"] / CGROUP_ROOT / oci_host.deployment / owner


async def test_fork_bombs_fill_only_their_share_and_end_failed_while_a_neighbour_succeeds(oci_host: OciHost) -> None:
    # A 2-core worker: pids.max 100 + 100 x 2 = 300; a half-core job's share is 75 (under the per-job 200).
    runtime = oci_host.runtime(cores_mcpu=2000, max_processes_per_core=100, max_processes_base=100,
                               max_processes=200, deployment_max_processes=1000, process_check_interval_s=0.2)
    await runtime.start()
    worker = worker_pids_dir(oci_host, runtime.config.owner)
    assert (worker / "pids.max").read_text().strip() == "300"
    assert (worker.parent / "pids.max").read_text().strip() == "1000"
    neighbour = oci_host.job(spec("for i in $(seq 30); do sleep 0.2 & done; wait; sleep 3; echo done=yes"),
                             "n1", job_id=1, cores_mcpu=500)
    bombs = [oci_host.job(spec(BOMB), f"b{i}", job_id=10 + i, cores_mcpu=500) for i in range(3)]
    peak = 0
    watching = True

    async def watch_worker() -> None:
        nonlocal peak
        while watching:
            peak = max(peak, int((worker / "pids.current").read_text()))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch_worker())
    try:
        neighbour_run = start(runtime, neighbour)
        outcomes = await asyncio.gather(*(run(runtime, bomb) for bomb in bombs))
        neighbour_outcome = await neighbour_run[0]
    finally:
        watching = False
        await watcher
    at_the_limit = "hit its process limit: the kernel refused a fork at its limit of 75 processes and threads " \
                   "(the cgroup's pids.max); "
    for outcome, log in outcomes:
        # The limit watch kills it, or, on a busy host, its shell gives up first when it cannot fork `sleep`
        # (busybox sh exits 2): either way it is Failed for its limit.
        assert outcome.state == "Failed", (outcome, log)
        assert (outcome.exit_code, outcome.error_message) in (
            (137, at_the_limit + "its container was killed"), (2, at_the_limit + "the command exited with code 2"),
        ), (outcome, log)
    assert neighbour_outcome.state == "Success", neighbour_outcome
    assert fields(neighbour_run[1].read().decode()) == {"done": "yes"}
    assert 75 <= peak <= 300, peak  # a bomb filled its share at least, and the worker never held more


async def test_a_job_writing_files_past_its_storage_request_is_killed(oci_host: OciHost) -> None:
    """Eight files of 4 MiB against 16 MiB: each is under the request, all together are not. The periodic
    measure finds them and kills the job, which would otherwise sleep for a minute."""
    runtime = oci_host.runtime(storage_check_interval_s=0.2)
    job = oci_host.job(spec("for i in 1 2 3 4 5 6 7 8; do dd if=/dev/zero of=/io/f$i bs=1M count=4 2>/dev/null; "
                            "done; echo written; sleep 60"), storage_bytes=16 * MIB)
    assert "at most its storage request of 16 MiB" in runtime.isolation(job)
    began = time.monotonic()
    outcome, log = await run(runtime, job)
    assert time.monotonic() - began < 30
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 137), log
    assert outcome.error_message.startswith("wrote more than its storage request of 16 MiB (storage_bytes): ")
    assert outcome.error_message.endswith(" in its scratch when checked; its container was killed")


async def test_one_file_past_the_storage_request_stops_at_it_and_the_job_fails(oci_host: OciHost) -> None:
    """A 64 MiB file against 16 MiB: the kernel stops the write at 16 MiB (SIGXFSZ kills dd), so the disk
    never holds more; the job goes on and exits 0, and still ends Failed naming the limit."""
    runtime = oci_host.runtime(storage_check_interval_s=30)  # only the kernel and the measure at the end
    outcome, log = await run(runtime, oci_host.job(spec(
        "dd if=/dev/zero of=/io/big bs=1M count=64 2>/dev/null; echo dd=$?; echo size=$(wc -c < /io/big)"),
        storage_bytes=16 * MIB))
    assert fields(log) == {"dd": str(128 + 25), "size": str(16 * MIB)}
    assert (outcome.state, outcome.exit_code) == ("Failed", 0), log
    assert outcome.error_message.startswith("wrote more than its storage request of 16 MiB (storage_bytes): ")
    assert outcome.error_message.endswith(" in its scratch when it ended; the command exited with code 0")


async def test_a_job_within_its_storage_request_succeeds(oci_host: OciHost) -> None:
    runtime = oci_host.runtime(storage_check_interval_s=0.1)
    outcome, log = await run(runtime, oci_host.job(spec(
        "dd if=/dev/zero of=/io/f bs=1M count=8 2>/dev/null; sleep 1; echo size=$(wc -c < /io/f)"),
        storage_bytes=64 * MIB))
    assert (outcome.state, fields(log)) == ("Success", {"size": str(8 * MIB)}), outcome
