"""How an attempt in an OCI container ends (acceptance 3 and 4): exit codes;
out of memory read from the cgroup, never from the log; a memory limit even
when the job reserved none; timeouts and cancels that stop the whole
container within the grace period; the system's failures (an image that is
not there, a command runc cannot start, a spec it refuses) as Error naming
the step; cpu time and peak memory from the cgroup, the cpu quota and the
process limit enforced; the log streams while the job runs."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from corral.batch.v1 import job_spec_pb2 as js
from tests.job_processes import marked, processes_marked, processes_marked_soon
from tests.oci.host import OciHost, fields, needs_oci, run, spec, start

pytestmark = [pytest.mark.timeout(60), needs_oci]

MIB = 2**20
ALLOCATE_200_MIB = "head -c 200m /dev/zero | tail > /dev/null"
"""tail keeps its last line in memory, and /dev/zero has no newline: 200 MiB of it."""


async def test_exit_codes(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    ok, log = await run(runtime, oci_host.job(spec("echo 1; echo 2 >&2; echo 3; ls /nowhere; echo 5"), "a1"))
    assert (ok.state, ok.exit_code, ok.end_reason, ok.error_message) == ("Success", 0, "exited", "")
    # stdout and stderr are one pipe, in the order written (ls writes its complaint in several pieces)
    assert log == "1\n2\n3\nls: /nowhere: No such file or directory\n5\n"
    assert ok.start_time_ms is not None and ok.cpu_time_ms is not None and ok.peak_memory_bytes
    failed, _ = await run(runtime, oci_host.job(spec("exit 3"), "a2"))
    assert (failed.state, failed.exit_code, failed.end_reason, failed.error_message) == (
        "Failed", 3, "exited", "exited with code 3")
    # (PID 1 of a namespace ignores the signals it has no handler for, even from itself: a child dies.)
    killed, _ = await run(runtime, oci_host.job(spec("sh -c 'kill -SEGV $$'; exit $?"), "a3"))
    assert (killed.state, killed.exit_code, killed.error_message) == (
        "Failed", 139, "killed by SIGSEGV (exit code 139)")


async def test_a_job_over_its_memory_limit_is_out_of_memory_from_the_cgroup(oci_host: OciHost) -> None:
    outcome, log = await run(oci_host.runtime(), oci_host.job(spec(ALLOCATE_200_MIB), memory_bytes=32 * MIB))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "out_of_memory", 137), log
    assert outcome.error_message == ("ran out of memory: the kernel killed a process of the job at its cgroup's "
                                     "limit of 33554432 bytes; the command killed by SIGKILL (exit code 137)")
    assert outcome.peak_memory_bytes is not None and 16 * MIB < outcome.peak_memory_bytes <= 32 * MIB


async def test_killed_is_not_out_of_memory_and_the_log_is_not_believed(oci_host: OciHost) -> None:
    """A job that says 'out of memory' and is killed by SIGKILL, under its limit, just failed; a job that
    writes more than its memory to disk (page cache, which the kernel reclaims) succeeds."""
    runtime = oci_host.runtime()
    liar_script = "echo 'Cannot allocate memory: out of memory'; sh -c 'kill -KILL $$'; exit $?"
    liar, _ = await run(runtime, oci_host.job(spec(liar_script), "a1", memory_bytes=32 * MIB))
    assert (liar.state, liar.end_reason, liar.exit_code) == ("Failed", "exited", 137)
    writer, log = await run(runtime, oci_host.job(spec("dd if=/dev/zero of=/io/big bs=1M count=96 2>/dev/null; "
                                                       "echo size=$(wc -c < /io/big)"), "a2", memory_bytes=32 * MIB))
    assert (writer.state, fields(log)) == ("Success", {"size": str(96 * MIB)})


async def test_memory_0_is_limited_to_the_workers_memory_per_core(oci_host: OciHost) -> None:
    """A quarter-core job that reserved no memory gets a quarter of a core's memory, never 'no limit'."""
    runtime = oci_host.runtime(memory_per_core_bytes=64 * MIB)
    job = oci_host.job(spec("head -c 32m /dev/zero | tail > /dev/null"), memory_bytes=0, cores_mcpu=250)
    assert "0.25 cores, 16777216 bytes of memory with no swap" in runtime.isolation(job)
    outcome, _ = await run(runtime, job)
    assert (outcome.state, outcome.end_reason) == ("Failed", "out_of_memory")
    assert "limit of 16777216 bytes" in outcome.error_message


async def test_a_timeout_kills_the_whole_container(oci_host: OciHost) -> None:
    """The command is PID 1 and ignores SIGTERM; a child of it ignores it too: both die after the grace."""
    runtime = oci_host.runtime(kill_grace_s=1.0)
    job_spec = spec("trap '' TERM; sh -c \"trap '' TERM; sleep 30\" & sleep 30",
                    timeout=duration_pb2.Duration(nanos=500_000_000))
    began = time.monotonic()
    outcome, _ = await run(runtime, oci_host.job(job_spec))
    took = time.monotonic() - began
    assert (outcome.state, outcome.end_reason) == ("Failed", "timed_out")
    assert outcome.error_message == "timed out after 0.5 s; its container was killed"
    assert 1.4 < took < 4.0


async def test_cancel_stops_the_container_within_the_grace_period(oci_host: OciHost) -> None:
    runtime = oci_host.runtime(kill_grace_s=1.5)
    # One job leaves at SIGTERM (every process of the container gets it), one ignores it. Each says when
    # its trap is set: runc reports a container started a moment before the command runs.
    polite = oci_host.job(spec("trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done"),
                          "a1", job_id=1)
    stubborn = oci_host.job(spec("trap '' TERM; echo ready; while :; do sleep 0.05; done"), "a2", job_id=2)
    runs = [start(runtime, job) for job in (polite, stubborn)]
    await asyncio.gather(*(started.wait() for _, _, started in runs))
    deadline = time.monotonic() + 10
    while not all(b"ready" in log.recent for _, log, _ in runs):
        assert time.monotonic() < deadline, "the jobs did not set their traps in 10 s"
        await asyncio.sleep(0.01)
    began = time.monotonic()
    for job in (polite, stubborn):
        await runtime.cancel(job.attempt_id)
    (first, first_log, _), (second, _, _) = runs
    polite_outcome = await first
    polite_took = time.monotonic() - began
    stubborn_outcome = await second
    stubborn_took = time.monotonic() - began
    for outcome in (polite_outcome, stubborn_outcome):
        assert (outcome.state, outcome.end_reason) == ("Cancelled", "cancelled")
    assert "got TERM" in first_log.read().decode()
    assert polite_took < 1.0 and 1.4 < stubborn_took < 3.0


async def test_cancel_before_the_container_starts(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    job = oci_host.job(spec("echo ran"))
    task, log, _ = start(runtime, job)
    await asyncio.sleep(0)  # the attempt begins: it is being prepared when the cancel comes
    await runtime.cancel(job.attempt_id)
    outcome = await task
    assert (outcome.state, outcome.end_reason, outcome.start_time_ms) == ("Cancelled", "cancelled", None)
    assert log.read() == b""


async def test_the_log_streams_while_the_job_runs(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    task, log, _ = start(runtime, oci_host.job(spec("echo first; sleep 0.5; echo second")))
    chunks = log.follow()
    first = await asyncio.wait_for(anext(chunks), 5)
    assert first == b"first\n" and not task.done()
    rest = b"".join([chunk async for chunk in chunks])
    assert rest == b"second\n" and (await task).state == "Success"


async def test_the_cpu_quota_holds_and_cpu_time_is_counted(oci_host: OciHost) -> None:
    """A quarter-core job spinning for a second gets about a quarter second of cpu."""
    runtime = oci_host.runtime()
    outcome, _ = await run(runtime, oci_host.job(spec("timeout 1 sh -c 'while :; do :; done'; true"),
                                                 cores_mcpu=250))
    assert outcome.state == "Success"
    assert outcome.cpu_time_ms is not None and 100 < outcome.cpu_time_ms < 400


async def test_the_process_limit_holds(oci_host: OciHost) -> None:
    """A job that reaches its process limit gets no more processes, and is killed for it: Failed, saying so
    (from the cgroup's pids.events, not from what the job printed)."""
    runtime = oci_host.runtime(max_processes=16, process_check_interval_s=0.1)
    outcome, log = await run(runtime, oci_host.job(spec(
        "sh -c 'for i in $(seq 40); do sleep 5 & done; wait' 2>/tmp/err; sleep 30")))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 137), log
    assert outcome.error_message == ("hit its process limit: the kernel refused a fork at its limit of 16 processes "
                                     "and threads (the cgroup's pids.max); its container was killed")
    liar, _ = await run(runtime, oci_host.job(spec("echo \"sh: can't fork: Resource temporarily unavailable\"; "
                                                   "exit 2"), "a2"))
    assert (liar.state, liar.error_message) == ("Failed", "exited with code 2")


async def test_failures_around_the_job_are_errors_naming_the_step(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    missing_image, _ = await run(runtime, oci_host.job(js.JobSpec(image="no-such-image", script="true",
                                                                  network_mode=js.NETWORK_MODE_NONE), "a1"))
    assert (missing_image.state, missing_image.end_reason) == ("Error", "system_error")
    assert missing_image.error_message == "image: could not get 'no-such-image': manifest unknown: no-such-image"
    no_program, log = await run(runtime, oci_host.job(spec("", "/no/such/program"), "a2"))
    assert (no_program.state, no_program.end_reason, no_program.start_time_ms) == ("Error", "system_error", None)
    assert no_program.error_message.startswith("the container did not start: ")
    assert "no such file or directory" in no_program.error_message.lower()  # runc says it in lower case, crun not
    into_proc, _ = await run(runtime, oci_host.job(spec("true", input_files=[
        js.InputFile(from_url="file:///etc/hostname", to_path="/proc/x")]), "a4"))
    assert (into_proc.state, into_proc.end_reason) == ("Error", "refused")


async def test_an_abandoned_attempt_is_killed_and_cleaned_up(oci_host: OciHost) -> None:
    """The worker cancels an attempt's task when it leaves (SIGTERM, a lost session): the container dies
    and nothing of it is left (the fixture checks), though `run` never returns."""
    runtime = oci_host.runtime()
    job_spec, mark = marked(spec("trap '' TERM; sleep 30"))
    task, _, started = start(runtime, oci_host.job(job_spec))
    await started.wait()
    assert await processes_marked_soon(mark)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not processes_marked(mark)


async def test_a_runc_that_never_starts_the_container_is_an_error(oci_host: OciHost, tmp_path: Path) -> None:
    stuck = tmp_path / "stuck-runc"
    stuck.write_text('#!/bin/sh\ncase " $* " in *" run "*) exec sleep 60;; *" list "*) echo null;; esac\n')
    stuck.chmod(0o755)
    runtime = oci_host.runtime(container_runtime=str(stuck), start_timeout_s=0.5, kill_grace_s=0.5)
    began = time.monotonic()
    outcome, _ = await run(runtime, oci_host.job(spec("true")))
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert outcome.error_message == "runc: the container did not start in 0.5 s (runc is stuck); it was killed"
    assert time.monotonic() - began < 3
    assert not [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                if str(stuck).encode() in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
