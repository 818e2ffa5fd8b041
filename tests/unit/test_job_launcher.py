"""The worker's job launcher (services/worker/launcher.py) and how jobs start
without the worker forking: one launcher serves every isolated attempt; it
dies with the worker and its attempts with it; a launcher that dies or stops
answering ends its attempts in Error and the next attempt gets a new one; a
job holds no descriptor of the worker or the launcher; SIGKILL takes the
whole tree even when the job's init is stuck. And the unisolated path, whose
memory limit is now set by util-linux's prlimit instead of Python run
between fork and exec."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.worker import helper_process
from services.worker import runtime as runtime_module
from services.worker.logs import LogSink
from services.worker.runtime import ProcessRuntime, ProcessRuntimeConfig, can_isolate
from tests.job_processes import marked, processes_marked
from tests.unit.test_job_isolation import go, start
from tests.unit.test_process_runtime import PY, eventually, gone, job, needs_py, run, spec

pytestmark = pytest.mark.timeout(60)
isolating = pytest.mark.skipif(not can_isolate(), reason="the launcher serves isolated attempts: root on Linux")


def waiting_alone() -> tuple:
    """A marked job of one process (no `sleep` children coming and going) that waits for `go`."""
    return marked(spec(PY, "-c", "import os, time\nprint('ready', flush=True)\n"
                                 "while not os.path.exists('go'): time.sleep(0.02)"))


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[1])


def descriptors(pid: int) -> dict[int, str]:
    """What each open descriptor of a process (as the host sees it) points to."""
    fd_dir = Path(f"/proc/{pid}/fd")
    return {int(fd): os.readlink(fd_dir / fd) for fd in os.listdir(fd_dir)}


@isolating
@needs_py
async def test_one_launcher_starts_every_attempt_and_the_worker_forks_none(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    try:
        waiting = [waiting_alone() for _ in range(2)]
        runs = [job(tmp_path, s, attempt_id=f"a{i}") for i, (s, _) in enumerate(waiting)]
        started = [start(runtime, r) for r in runs]
        await eventually(lambda: all(b"ready" in log.read() for _, log in started))
        launcher = runtime.launcher_pid
        assert launcher is not None and parent_of(launcher) == os.getpid()
        assert Path(f"/proc/{launcher}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-I", b"-S"]
        for _, mark in waiting:
            [command] = processes_marked(mark)  # PID 2 of its namespace
            init = parent_of(command)
            top = parent_of(init)
            assert parent_of(top) == launcher  # worker -> launcher -> top -> init -> command
        for r in runs:
            go(r)
        assert [(await task).state for task, _ in started] == ["Success", "Success"]
        assert runtime.launcher_pid == launcher
    finally:
        await runtime.close()
    assert runtime.launcher_pid is None
    await eventually(lambda: gone(launcher))


@isolating
@needs_py
async def test_a_job_holds_no_descriptor_but_its_output_and_dev_null(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    try:
        # Two at once: the launcher holds the first one's pidfd when it forks the second.
        waiting = [waiting_alone() for _ in range(2)]
        runs = [job(tmp_path, s, attempt_id=f"a{i}") for i, (s, _) in enumerate(waiting)]
        started = []
        for r in runs:
            started.append(start(runtime, r))
            await eventually(lambda: b"ready" in started[-1][1].read())
        [command] = processes_marked(waiting[1][1])
        fds = descriptors(command)
        assert sorted(fds) == [0, 1, 2], fds  # nothing of the worker or the launcher (its socket above all)
        assert fds[0] == "/dev/null" and fds[1] == fds[2] and fds[1].startswith("pipe:")
        # Nor do the processes above it (the job's init, the attempt's top process): their own pipes (the
        # report pipe, the init's life line) and the job's output on 1 and 2 only; none of the launcher's
        # socket, instructions (a memfd), other attempts' pidfds, or copies of what they were given.
        output = fds[1]
        for above in (parent_of(command), parent_of(parent_of(command))):
            held = descriptors(above)
            assert (held[0], held[1], held[2]) == ("/dev/null", output, output), held
            others = [target for fd, target in held.items() if fd > 2]
            assert all(target.startswith("pipe:") and target != output for target in others), held
            assert len(others) == len(set(others)), held
        for r in runs:
            go(r)
        assert [(await task).state for task, _ in started] == ["Success", "Success"]
    finally:
        await runtime.close()


@isolating
async def test_a_dead_launcher_ends_its_attempts_in_error_and_the_next_gets_a_new_one(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    try:
        victim, mark = marked(spec(script="echo ready; sleep 100"))
        task, log = start(runtime, job(tmp_path, victim, attempt_id="victim"))
        await eventually(lambda: b"ready" in log.read())
        first = runtime.launcher_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        outcome = await task
        assert (outcome.state, outcome.end_reason, outcome.exit_code) == ("Error", "system_error", None)
        assert f"job launcher (pid {first}) died" in outcome.error_message
        await eventually(lambda: not processes_marked(mark))

        outcome, output = await run(runtime, job(tmp_path, spec(script="echo again"), attempt_id="next"))
        assert (outcome.state, output) == ("Success", b"again\n")
        assert runtime.launcher_pid not in (None, first)
    finally:
        await runtime.close()


@isolating
async def test_a_launcher_that_stops_answering_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(helper_process, "ANSWER_TIMEOUT_S", 0.5)
    runtime = ProcessRuntime()
    try:
        assert (await run(runtime, job(tmp_path, spec("true"), attempt_id="first")))[0].state == "Success"
        stuck = runtime.launcher_pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)
        outcome, _ = await run(runtime, job(tmp_path, spec("true"), attempt_id="unanswered"))
        assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
        assert f"job launcher (pid {stuck}) did not answer" in outcome.error_message
        assert gone(stuck)  # killed, so that nothing it might still start runs unwatched
        outcome, _ = await run(runtime, job(tmp_path, spec("true"), attempt_id="after"))
        assert outcome.state == "Success"
        assert runtime.launcher_pid not in (None, stuck)
    finally:
        await runtime.close()


@isolating
async def test_sigkill_takes_the_whole_tree_even_when_the_init_is_stuck(tmp_path: Path) -> None:
    runtime = ProcessRuntime(ProcessRuntimeConfig(kill_grace_s=0.3))
    try:
        tree, mark = marked(spec(script="sleep 100 & echo ready; wait"))
        run_job = job(tmp_path, tree)
        task, log = start(runtime, run_job)
        await eventually(lambda: b"ready" in log.read() and len(processes_marked(mark)) == 2)
        processes = processes_marked(mark)
        [shell] = [p for p in processes if parent_of(p) not in processes]
        init = parent_of(shell)
        os.kill(init, signal.SIGSTOP)  # it can pass SIGTERM on to nobody now
        await runtime.cancel(run_job.attempt_id)
        outcome = await task
        assert outcome.state == "Cancelled"
        await eventually(lambda: not processes_marked(mark) and gone(init))
    finally:
        await runtime.close()


@isolating
async def test_the_launcher_and_its_jobs_die_with_the_worker(tmp_path: Path) -> None:
    """A worker killed with SIGKILL: its launcher follows it (PR_SET_PDEATHSIG), and the jobs follow theirs."""
    worker = textwrap.dedent(f"""
        import asyncio, sys
        from pathlib import Path
        from services.worker.logs import LogSink
        from tests.unit.test_process_runtime import job, spec
        from services.worker.runtime import ProcessRuntime

        async def main():
            runtime = ProcessRuntime()
            run_job = job(Path({str(tmp_path)!r}), spec(script="echo ready; sleep 100", env={{"TEST_MARK": sys.argv[1]}}))
            log = LogSink(run_job.log_path)
            async def started(pid):
                print(runtime.launcher_pid, flush=True)
            await runtime.run(run_job, log, started)

        asyncio.run(main())
    """)
    mark = os.urandom(8).hex()
    with subprocess.Popen([sys.executable, "-c", worker, mark], stdout=subprocess.PIPE,
                          cwd=Path(__file__).resolve().parents[2]) as process:
        assert process.stdout is not None
        launcher = int(await asyncio.to_thread(process.stdout.readline))
        assert processes_marked(mark)
        process.kill()
    await eventually(lambda: gone(launcher) and not processes_marked(mark))


# ---------------------------------------------------------------- unisolated


@pytest.fixture
def unisolated(monkeypatch: pytest.MonkeyPatch) -> ProcessRuntime:
    monkeypatch.setattr(runtime_module, "can_isolate", lambda: False)  # as a worker that is not root
    return ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True))


@needs_py
async def test_unisolated_the_memory_limit_is_set_by_prlimit(unisolated: ProcessRuntime, tmp_path: Path) -> None:
    limit = 512 * 2**20
    script = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)); b = bytearray({size}); print('ok')"
    outcome, output = await run(unisolated, job(tmp_path, spec(PY, "-c", script.format(size=32 * 2**20)), limit,
                                                "small"))
    assert (outcome.state, output) == ("Success", f"({limit}, {limit})\nok\n".encode())
    outcome, output = await run(unisolated, job(tmp_path, spec(PY, "-c", script.format(size=2 * 2**30)), limit,
                                                "big"))
    assert b"ok" not in output
    assert (outcome.state, outcome.end_reason) == ("Failed", "out_of_memory")


async def test_unisolated_a_missing_command_is_still_an_error_with_a_limit(unisolated: ProcessRuntime,
                                                                          tmp_path: Path) -> None:
    for attempt_id, argv in (("on-path", "no-such-command-corral"), ("relative", "./no-such-command-corral")):
        outcome, output = await run(unisolated, job(tmp_path, spec(argv), 2**30, attempt_id))
        assert (outcome.state, outcome.end_reason, outcome.start_time_ms) == ("Error", "system_error", None)
        assert f"could not start {argv!r}: No such file or directory" in outcome.error_message
        assert output == b""


async def test_unisolated_the_command_is_the_started_process(unisolated: ProcessRuntime, tmp_path: Path) -> None:
    """prlimit execs the command in its own process: the pid reported is the command's, argv[0] is as given."""
    started: list[int] = []

    async def on_started(pid: int) -> None:
        started.append(pid)

    run_job = job(tmp_path, spec(script="echo $$ $0"), 2**30)
    outcome = await unisolated.run(run_job, LogSink(run_job.log_path), on_started)
    assert outcome.state == "Success"
    assert run_job.log_path.read_text() == f"{started[0]} /bin/sh\n"
