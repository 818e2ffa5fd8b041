"""The process runtime (services/worker/runtime.py) and job logs
(services/worker/logs.py), with real subprocesses: outcomes, environment,
timeouts and cancels that kill the whole process tree, the memory limit,
refusals, following and uploading the log.

These run as a worker here would: isolated when the tests run as root (jobs
as users of their own, in namespaces), unisolated otherwise. What isolation
itself guarantees is tested in test_job_isolation.py."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import shutil
import stat
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from google.protobuf import duration_pb2

from corral.batch.v1 import job_spec_pb2 as js
from services.worker import runtime as runtime_module
from services.worker.image_tools import Credentials
from services.worker.logs import RECENT_BYTES, LogSink
from services.worker.runtime import JobOutcome, JobRun, ProcessRuntime, ProcessRuntimeConfig, can_isolate
from tests.job_processes import marked, processes_marked

pytestmark = pytest.mark.timeout(30)


def runs_for_anyone(path: str) -> bool:
    """Whether any user may run the program at `path` (every directory on its real path passable by others)."""
    real = os.path.realpath(path)
    parts = real.split("/")
    dirs = ["/".join(parts[:i]) or "/" for i in range(1, len(parts))]
    return all(os.stat(d).st_mode & stat.S_IXOTH for d in dirs) and bool(os.stat(real).st_mode & stat.S_IXOTH)


def job_python() -> str | None:
    """A Python the job's own user can run (the tests' interpreter may live where only root can reach)."""
    for candidate in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        if candidate and (not can_isolate() or runs_for_anyone(candidate)):
            return candidate
    return None


PY = job_python() or sys.executable
needs_py = pytest.mark.skipif(job_python() is None, reason="no Python that the jobs' unprivileged users may run")


def process_runtime(**settings) -> ProcessRuntime:
    """The process runtime as a worker here runs it: isolated when root, else unisolated (allowed)."""
    return ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True, **settings))


def spec(*argv: str, script: str = "", **fields) -> js.JobSpec:
    out = js.JobSpec(image="docker.io/library/ubuntu:24.04", **fields)
    if argv:
        out.argv.args.extend(argv)
    else:
        out.script = script
    return out


def job(tmp_path: Path, job_spec: js.JobSpec, memory_bytes: int = 0, attempt_id: str = "a1") -> JobRun:
    return JobRun(batch_id=7, job_id=3, attempt_id=attempt_id, spec=job_spec, cores_mcpu=1000,
                  memory_bytes=memory_bytes, scratch=tmp_path / "scratch")


async def run(runtime: ProcessRuntime, run_job: JobRun,
              on_started: Callable[[int], Awaitable[None]] | None = None) -> tuple[JobOutcome, bytes]:
    async def nothing(pid: int) -> None:
        pass

    log = LogSink(run_job.log_path)
    outcome = await runtime.run(run_job, log, on_started or nothing)
    assert log.closed
    return outcome, log.read()


async def eventually(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


def gone(pid: int) -> bool:
    """The process no longer runs (absent, or a zombie its new parent has yet to reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:  # no /proc (macOS): a zombie would still count as running here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def pids_in(log: LogSink) -> list[int]:
    first_line = log.read().split(b"\n")[0]
    return [int(p) for p in first_line.split()]


# ---------------------------------------------------------------- outcomes


async def test_success_captures_stdout_and_stderr_interleaved(tmp_path: Path) -> None:
    before_ms = int(time.time() * 1000)
    runtime = process_runtime()
    run_job = job(tmp_path, spec(script="echo out1; echo err1 >&2; echo out2; echo err2 >&2"))
    outcome, output = await run(runtime, run_job)
    after_ms = int(time.time() * 1000)
    assert output == b"out1\nerr1\nout2\nerr2\n"
    assert (outcome.state, outcome.end_reason, outcome.exit_code, outcome.error_message) == \
        ("Success", "exited", 0, "")
    assert outcome.start_time_ms is not None
    assert before_ms <= outcome.start_time_ms <= outcome.end_time_ms <= after_ms
    assert "no container isolated this job" in outcome.isolation
    assert "ubuntu:24.04" in outcome.isolation
    assert runtime.isolation(run_job) == outcome.isolation  # what the worker reports at the start
    # What the worker writes is its own: the scratch root and attempt directory 0700, the log 0600.
    assert [stat.S_IMODE(p.stat().st_mode) for p in (run_job.scratch, run_job.attempt_dir, run_job.log_path)] == \
        [0o700, 0o700, 0o600]
    assert outcome.peak_memory_bytes and outcome.peak_memory_bytes > 0
    assert outcome.cpu_time_ms is not None and outcome.cpu_time_ms >= 0


@needs_py
async def test_env_and_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CORRAL_TEST_WORKER_ONLY", "must not leak")
    run_job = job(tmp_path, spec(PY, "-c", "import json, os; print(json.dumps({'cwd': os.getcwd(), "
                                 "'env': dict(os.environ)}))",
                                 env={"GREETING": "hello", "CORRAL_JOB_ID": "999"}))
    outcome, output = await run(process_runtime(), run_job)
    assert outcome.state == "Success", output
    seen = json.loads(output)
    work = str(run_job.attempt_dir / "work")
    assert seen["cwd"] == work
    env = seen["env"]
    assert env["HOME"] == work
    assert env["GREETING"] == "hello"
    # The job's identity comes from the runtime, not from the spec.
    assert (env["CORRAL_BATCH_ID"], env["CORRAL_JOB_ID"], env["CORRAL_ATTEMPT_ID"]) == ("7", "3", "a1")
    assert "CORRAL_TEST_WORKER_ONLY" not in env
    assert env["PATH"] == ProcessRuntimeConfig().base_path
    assert not (run_job.attempt_dir / "work").exists()  # removed after the run; the log stays
    assert run_job.log_path.exists()


@needs_py
async def test_nonzero_exit_fails_with_its_code(tmp_path: Path) -> None:
    outcome, output = await run(process_runtime(), job(tmp_path, spec(PY, "-c",
                                                                    "import sys; print('bye'); sys.exit(3)")))
    assert output == b"bye\n"
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 3)
    assert "exited with code 3" in outcome.error_message


async def test_script_form_runs_in_sh(tmp_path: Path) -> None:
    outcome, output = await run(process_runtime(), job(tmp_path, spec(script="x=$((1 + 2)); echo \"$x\"; exit 4")))
    assert output == b"3\n"
    assert (outcome.state, outcome.exit_code) == ("Failed", 4)


async def test_killed_by_a_signal_we_did_not_send(tmp_path: Path) -> None:
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(script="kill -USR1 $$")))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 128 + 10)
    assert "SIGUSR1" in outcome.error_message


async def test_command_not_found_is_an_error(tmp_path: Path) -> None:
    started: list[int] = []

    async def on_started(pid: int) -> None:
        started.append(pid)

    outcome, output = await run(process_runtime(), job(tmp_path, spec("no-such-command-corral")), on_started)
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Error", "system_error", None)
    assert "no-such-command-corral" in outcome.error_message
    assert outcome.start_time_ms is None
    assert started == [] and output == b""


async def test_on_started_gets_the_pid_before_completion(tmp_path: Path) -> None:
    log = LogSink(tmp_path / "main.log")
    calls: list[tuple[int, bool]] = []

    async def on_started(pid: int) -> None:
        calls.append((pid, log.closed))

    run_job = job(tmp_path, spec(script="echo $$"))
    outcome = await process_runtime().run(run_job, log, on_started)
    assert outcome.state == "Success"
    assert calls == [(int(log.read()), False)]


# ---------------------------------------------------------------- stopping a job

# A child that starts a grandchild, prints both pids (as it sees them), and waits.
TREE = ("import os, subprocess; p = subprocess.Popen(['sleep', '100']); "
        "print(os.getpid(), p.pid, flush=True); p.wait()")


@needs_py
async def test_timeout_kills_the_whole_tree(tmp_path: Path) -> None:
    timeout = duration_pb2.Duration(nanos=800_000_000)
    tree, mark = marked(spec(PY, "-c", TREE, timeout=timeout))
    started = time.monotonic()
    outcome, output = await run(process_runtime(), job(tmp_path, tree))
    assert time.monotonic() - started < 10
    assert len(output.split()) == 2  # both ran
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "timed_out", None)
    assert "timed out after 0.8 s" in outcome.error_message
    await eventually(lambda: not processes_marked(mark))


@needs_py
async def test_cancel_while_running_kills_the_whole_tree(tmp_path: Path) -> None:
    runtime = process_runtime()
    tree, mark = marked(spec(PY, "-c", TREE))
    run_job = job(tmp_path, tree)
    log = LogSink(run_job.log_path)

    async def nothing(pid: int) -> None:
        pass

    task = asyncio.create_task(runtime.run(run_job, log, nothing))
    await eventually(lambda: len(pids_in(log)) == 2)
    assert len(processes_marked(mark)) == 2
    await runtime.cancel("a1")
    outcome = await task
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Cancelled", "cancelled", None)
    await eventually(lambda: not processes_marked(mark))
    await runtime.cancel("a1")  # no longer running: nothing happens


async def test_cancel_escalates_to_sigkill_after_the_grace_period(tmp_path: Path) -> None:
    runtime = process_runtime(kill_grace_s=0.5)
    stubborn, mark = marked(spec(script="trap '' TERM; sleep 100 & echo $$ $!; wait"))
    run_job = job(tmp_path, stubborn)
    log = LogSink(run_job.log_path)

    async def nothing(pid: int) -> None:
        pass

    task = asyncio.create_task(runtime.run(run_job, log, nothing))
    await eventually(lambda: len(pids_in(log)) == 2)
    asked = time.monotonic()
    await runtime.cancel("a1")
    outcome = await task
    assert time.monotonic() - asked >= 0.5  # SIGTERM was ignored; SIGKILL came after the grace
    assert outcome.state == "Cancelled"
    await eventually(lambda: not processes_marked(mark))


@needs_py
async def test_cancelling_the_run_task_leaves_nothing_running(tmp_path: Path) -> None:
    tree, mark = marked(spec(PY, "-c", TREE))
    run_job = job(tmp_path, tree)
    log = LogSink(run_job.log_path)

    async def nothing(pid: int) -> None:
        pass

    task = asyncio.create_task(process_runtime().run(run_job, log, nothing))
    await eventually(lambda: len(pids_in(log)) == 2)
    assert len(processes_marked(mark)) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert log.closed
    await eventually(lambda: not processes_marked(mark))


async def test_unisolated_a_process_that_left_the_group_does_not_hold_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unisolated, setsid escapes the group kill (a documented limit of that mode); the run still ends
    once the output drain gives up on the pipe the escaped process holds open. (Isolated, the escaped
    process dies with the attempt: test_job_isolation.py.)"""
    monkeypatch.setattr(runtime_module, "can_isolate", lambda: False)
    runtime = process_runtime(output_drain_s=0.3)
    pid_file = tmp_path / "escaped.pid"
    escape = f"import os, time; os.setsid(); open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(30)"
    script = f"{sys.executable} -c \"{escape}\" & until [ -s {pid_file} ]; do sleep 0.02; done; echo done"
    outcome, output = await run(runtime, job(tmp_path, spec(script=script)))
    escaped = int(pid_file.read_text())
    try:
        assert (outcome.state, output) == ("Success", b"done\n")
        assert "UNISOLATED" in outcome.isolation
    finally:
        os.kill(escaped, 9)
    await eventually(lambda: gone(escaped))


# ---------------------------------------------------------------- memory


@needs_py
async def test_memory_limit(tmp_path: Path) -> None:
    limit = 512 * 2**20
    runtime = process_runtime()
    small = job(tmp_path, spec(PY, "-c", "b = bytearray(32 * 2**20); print(len(b))"), limit, "small")
    outcome, output = await run(runtime, small)
    assert (outcome.state, output) == ("Success", b"33554432\n")
    assert "memory limited only approximately" in outcome.isolation

    big = job(tmp_path, spec(PY, "-c", "b = bytearray(2 * 2**30); print('allocated')"), limit, "big")
    outcome, output = await run(runtime, big)
    assert b"allocated" not in output
    assert outcome.state != "Success"
    assert outcome.end_reason == "out_of_memory"
    assert "memory" in outcome.error_message


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize("isolated", [True, False], ids=["isolated", "unisolated"])
def test_check_refuses_what_a_process_cannot_honour(isolated: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "can_isolate", lambda: isolated)
    runtime = process_runtime()
    assert runtime.check(spec("true", network_mode=js.NETWORK_MODE_PUBLIC, input_files=[
        js.InputFile(from_url="file:///srv/ref.fa", to_path="/in/ref.fa")])) == []
    assert runtime.isolates is False and runtime.name == "process"

    secrets = runtime.check(spec("true", secrets=[js.SecretMount(name="db", mount_path="/secrets")]))
    if isolated:
        assert secrets == []  # mounted read-only in the job's own mount namespace (test_secret_mounts.py)
    else:
        [reason] = secrets
        assert "secrets cannot be mounted" in reason and "worker's own user" in reason
    reasons = runtime.check(spec("true", secrets=[js.SecretMount(name="db", mount_path="/a/../b")]))
    assert any("mount_path '/a/../b'" in reason for reason in reasons)
    [reason] = runtime.check(spec("true", network_mode=js.NETWORK_MODE_PRIVATE))
    assert "NETWORK_MODE_PRIVATE cannot be enforced" in reason and "no private network" in reason
    none = runtime.check(spec("true", network_mode=js.NETWORK_MODE_NONE))
    if isolated:
        assert none == []  # a network namespace with loopback only
    else:
        [reason] = none
        assert "NETWORK_MODE_NONE" in reason and "cannot isolate the network" in reason
    [reason] = runtime.check(spec("true", machine_type="n2-standard-8"))
    assert "machine_type 'n2-standard-8'" in reason
    assert runtime.check(spec("true", input_files=[js.InputFile(from_url="gs://bucket/ref.fa", to_path="/in/ref.fa")],
                              output_files=[js.OutputFile(from_path="/out", to_url="az://container/out")])) == []
    [reason] = runtime.check(spec("true", input_files=[js.InputFile(from_url="s3://bucket/ref.fa",
                                                                    to_path="/in/ref.fa")]))
    assert "s3://bucket/ref.fa" in reason and "gs://" in reason and "az://" in reason
    [reason] = runtime.check(spec("true", output_files=[js.OutputFile(from_path="../x",
                                                                      to_url="file:///tmp/x")]))
    assert "'../x'" in reason
    [reason] = runtime.check(js.JobSpec(image="x"))
    assert "no command" in reason


async def test_a_worker_that_cannot_isolate_refuses_jobs_unless_told_otherwise(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_module, "can_isolate", lambda: False)  # as if not root
    marker = tmp_path / "ran"
    runtime = ProcessRuntime()
    [reason] = runtime.check(spec("true"))
    assert "needs a worker running as root" in reason and "--unisolated-dev" in reason
    outcome, _ = await run(runtime, job(tmp_path, spec(script=f"touch {marker}")))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "needs a worker running as root" in outcome.error_message
    assert "did not run" in outcome.isolation
    assert not marker.exists()

    # Allowed (development), it runs as the worker's own user, and says so loudly.
    outcome, _ = await run(ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True)),
                           job(tmp_path, spec(script=f"touch {marker}"), attempt_id="dev"))
    assert outcome.state == "Success" and marker.exists()
    assert outcome.isolation.startswith("process runtime, UNISOLATED (development mode)")
    assert "its keys and other jobs' files included" in outcome.isolation


async def test_run_refuses_a_spec_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(
        script=f"touch {marker}", network_mode=js.NETWORK_MODE_PRIVATE)))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "NETWORK_MODE_PRIVATE cannot be enforced" in outcome.error_message
    assert not marker.exists()


# ---------------------------------------------------------------- files


async def test_input_and_output_files(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "dir" / "a").mkdir(parents=True)
    (source / "ref.txt").write_text("ref\n")
    (source / "dir" / "a" / "b").write_text("nested\n")
    store = tmp_path / "store"
    files = {
        "input_files": [js.InputFile(from_url=f"file://{source}/ref.txt", to_path="/in/ref.txt"),
                        js.InputFile(from_url=f"file://{source}/dir", to_path="/in/dir")],
        "output_files": [js.OutputFile(from_path="/out/result.txt", to_url=f"file://{store}/result.txt"),
                         js.OutputFile(from_path="/out/more", to_url=f"file://{store}/deep/more")],
    }
    script = "mkdir -p out/more && cat in/ref.txt in/dir/a/b > out/result.txt && echo x > out/more/y; exit ${CODE:-0}"

    outcome, output = await run(process_runtime(), job(tmp_path, spec(script=script, **files), attempt_id="ok"))
    assert outcome.state == "Success", (outcome, output)
    assert (store / "result.txt").read_text() == "ref\nnested\n"
    assert (store / "deep" / "more" / "y").read_text() == "x\n"

    # Outputs are copied only after the command exits 0.
    (store / "result.txt").unlink()
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(script=script, env={"CODE": "1"}, **files),
                                                 attempt_id="failed"))
    assert (outcome.state, outcome.exit_code) == ("Failed", 1)
    assert not (store / "result.txt").exists()

    # A missing output is the system failing around the command; so is a missing input.
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(script="true", output_files=files["output_files"]),
                                                 attempt_id="no-output"))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Error", "system_error", 0)
    assert "/out/result.txt does not exist" in outcome.error_message
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(script="true", input_files=[
        js.InputFile(from_url=f"file://{source}/missing", to_path="/in/missing")]), attempt_id="no-input"))
    assert (outcome.state, outcome.end_reason, outcome.start_time_ms) == ("Error", "system_error", None)
    assert "copying input files failed" in outcome.error_message


async def test_always_copy_outputs_copies_what_a_failed_command_left(tmp_path: Path) -> None:
    store = tmp_path / "store"
    outputs = [js.OutputFile(from_path="/out/made.txt", to_url=f"file://{store}/made.txt"),
               js.OutputFile(from_path="/out/never.txt", to_url=f"file://{store}/never.txt"),
               js.OutputFile(from_path="/out/dir", to_url=f"file://{store}/dir")]
    script = "mkdir -p out/dir && echo partial > out/made.txt && echo y > out/dir/y && exit 3"

    outcome, output = await run(process_runtime(), job(tmp_path, spec(script=script, output_files=outputs,
                                                                      always_copy_outputs=True), attempt_id="a"))
    # The attempt ends as the command did; the output it never made is no further error.
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Failed", "exited", 3), (outcome, output)
    assert outcome.error_message == "exited with code 3"
    assert (store / "made.txt").read_text() == "partial\n"
    assert (store / "dir" / "y").read_text() == "y\n"
    assert not (store / "never.txt").exists()

    # Killed at its timeout, it has its outputs copied too.
    timed = spec(script="mkdir out && echo early > out/made.txt && sleep 30", output_files=outputs[:1],
                 always_copy_outputs=True, timeout=duration_pb2.Duration(seconds=1))
    outcome, _ = await run(process_runtime(), job(tmp_path, timed, attempt_id="timed"))
    assert (outcome.state, outcome.end_reason) == ("Failed", "timed_out"), outcome
    assert (store / "made.txt").read_text() == "early\n"

    # An output that is there and cannot be copied is said in the message, and the others are still copied.
    refused = spec(script="mkdir out && echo z > out/z && ln -s /etc/hostname out/made.txt && false",
                   output_files=[outputs[0], js.OutputFile(from_path="/out/z", to_url=f"file://{store}/z")],
                   always_copy_outputs=True)
    outcome, _ = await run(process_runtime(), job(tmp_path, refused, attempt_id="refused"))
    assert (outcome.state, outcome.exit_code) == ("Failed", 1), outcome
    assert outcome.error_message.startswith("exited with code 1; output files not copied: /out/made.txt -> ")
    assert "symbolic link" in outcome.error_message
    assert (store / "z").read_text() == "z\n"

    # Without it a failed command's outputs stay where they were, as before.
    (store / "made.txt").unlink()
    outcome, _ = await run(process_runtime(), job(tmp_path, spec(script=script, output_files=outputs),
                                                 attempt_id="without"))
    assert (outcome.state, outcome.exit_code) == ("Failed", 3)
    assert not (store / "made.txt").exists()


async def test_every_storage_url_goes_through_the_url_check(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("in\n")
    checked: list[str] = []

    def check_url(url: str) -> None:
        checked.append(url)
        if "forbidden" in url:
            raise PermissionError(f"{url} is outside the storage roots")

    runtime = process_runtime(check_url=check_url)
    ok = spec(script="cp in.txt out.txt", input_files=[js.InputFile(from_url=f"file://{tmp_path}/in.txt",
                                                                     to_path="/in.txt")],
              output_files=[js.OutputFile(from_path="/out.txt", to_url=f"file://{tmp_path}/store/out.txt")])
    outcome, _ = await run(runtime, job(tmp_path, ok, attempt_id="ok"))
    assert outcome.state == "Success"
    assert checked == [f"file://{tmp_path}/in.txt", f"file://{tmp_path}/store/out.txt"]

    refused_in = spec(script="true", input_files=[js.InputFile(from_url=f"file://{tmp_path}/forbidden",
                                                               to_path="/x")])
    outcome, _ = await run(runtime, job(tmp_path, refused_in, attempt_id="in"))
    assert (outcome.state, outcome.start_time_ms) == ("Error", None)
    assert "is outside the storage roots" in outcome.error_message
    refused_out = spec(script="echo x > x", output_files=[js.OutputFile(from_path="/x",
                                                                        to_url=f"file://{tmp_path}/forbidden")])
    outcome, _ = await run(runtime, job(tmp_path, refused_out, attempt_id="out"))
    assert (outcome.state, outcome.exit_code) == ("Error", 0)
    assert "is outside the storage roots" in outcome.error_message
    assert not (tmp_path / "forbidden").exists()


# ---------------------------------------------------------------- logs


async def test_follow_yields_output_while_running_and_upload_copies_the_log(tmp_path: Path) -> None:
    run_job = job(tmp_path, spec(script="echo first; sleep 0.5; echo second"))
    log = LogSink(run_job.log_path)

    async def nothing(pid: int) -> None:
        pass

    task = asyncio.create_task(process_runtime().run(run_job, log, nothing))
    chunks = [(chunk, task.done()) async for chunk in log.follow()]
    assert chunks[0] == (b"first\n", False)
    assert b"".join(chunk for chunk, _ in chunks) == b"first\nsecond\n"
    assert (await task).state == "Success"
    assert [chunk async for chunk in log.follow(6)] == [b"second\n"]  # a finished log from an offset
    assert log.read(6, 3) == b"sec"

    url = f"file://{tmp_path}/store/logs/7/3/a1/main.log"
    await log.upload(url)
    assert (tmp_path / "store" / "logs" / "7" / "3" / "a1" / "main.log").read_bytes() == b"first\nsecond\n"


async def test_log_keeps_head_and_tail_beyond_its_cap(tmp_path: Path) -> None:
    log = LogSink(tmp_path / "main.log", cap_bytes=20)
    lines = [f"line{i}\n".encode() for i in range(10)]
    for line in lines:
        log.write(line)
    everything = b"".join(lines)
    assert log.read() == everything[:10]  # only the head is visible while running
    log.close()
    assert log.received_bytes == 60
    assert log.read() == everything[:10] + b"\n[corral: 40 bytes of output omitted; the log keeps the first 10 " \
                                           b"and the last 10 bytes]\n" + everything[-10:]
    with pytest.raises(RuntimeError):
        log.write(b"more")


async def test_upload_refuses_an_unfinished_log(tmp_path: Path) -> None:
    log = LogSink(tmp_path / "main.log")
    log.write(b"x")
    with pytest.raises(RuntimeError):
        await log.upload(f"file://{tmp_path}/out.log")
    log.close()
    await log.upload(f"file://{tmp_path}/out.log")
    assert (tmp_path / "out.log").read_bytes() == b"x"


async def test_a_command_that_ran_out_of_disk_is_an_error_naming_the_disk(tmp_path: Path) -> None:
    # The disk may have room again at the end (another attempt's files went); the command's own words count.
    outcome, _ = await run(process_runtime(),
                           job(tmp_path, spec(script="echo 'dd: error writing fill: No space left on device' >&2; "
                                                     "exit 1")))
    assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Error", "system_error", 1)
    assert outcome.error_message.startswith("the worker's scratch disk ran out of space (/")
    assert outcome.error_message.endswith("bytes free now); the command exited with code 1")


async def test_a_log_whose_disk_is_full_keeps_the_output_in_memory_and_the_error() -> None:
    log = LogSink(Path("/dev/full"))  # every write: ENOSPC
    log.write(b"first\n")
    log.write(b"No space left on device\n")
    assert log.write_error is not None and log.write_error.errno == errno.ENOSPC
    assert log.recent == b"first\nNo space left on device\n"
    log.close()
    assert log.closed


async def test_a_log_remembers_only_its_latest_output(tmp_path: Path) -> None:
    log = LogSink(tmp_path / "main.log")
    log.write(b"x" * RECENT_BYTES)
    log.write(b"end")
    assert log.recent == b"x" * (RECENT_BYTES - 3) + b"end"
    log.close()
    assert log.write_error is None


async def test_a_pull_secret_is_used_for_nothing_and_written_nowhere(tmp_path: Path) -> None:
    """The process runtime pulls no image: a job's registry login (JobRun.pull_credentials) reaches neither
    the job's environment, files nor log, nor the attempt's status, and the job runs as without one."""
    password = "registry-password-" + os.urandom(8).hex()
    pulling = dataclasses.replace(job(tmp_path, spec(script="env; cat /proc/self/environ; echo done",
                                                     image_pull_secret="registry")),
                                  pull_credentials=Credentials("alice", password))
    outcome, log = await run(process_runtime(), pulling)
    assert outcome.state == "Success" and log.rstrip().endswith(b"done"), (outcome, log)
    assert password.encode() not in log and password not in outcome.error_message + outcome.isolation
    assert password not in repr(pulling)
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
                and password.encode() in p.read_bytes()]
