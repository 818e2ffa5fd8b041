"""How processes end with `corral up`: a program started through parent_death dies when its parent is
SIGKILLed (and never starts if the parent is already gone); a process holding the lifeline ends when
its holder does, even after the process between them died; pid files name exactly one process; ending
a set of processes says what it waits for and kills what ignores SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.common import parent_death
from services.common.lifeline import LIFELINE_VARIABLE, Lifeline
from services.common.processes import Child, PidFiles, PidRecord, Recorded, end_processes, start_ticks

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[2]


def eventually(check, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.02)
    return value


def python(code: str, env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[str]:
    """`python -c CODE` with this repository importable, its stdout a pipe."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, env={**os.environ, **(env or {}), "PYTHONPATH": str(REPO)},
                            pass_fds=pass_fds)


def test_a_program_started_through_parent_death_dies_with_its_parent() -> None:
    parent = python("""
        import subprocess, time
        from services.common.parent_death import launcher
        child = subprocess.Popen([*launcher(), "sleep", "600"])
        print(child.pid, flush=True)
        time.sleep(600)
    """)
    try:
        assert parent.stdout is not None
        child = PidRecord.of("sleep", int(parent.stdout.readline()))
        assert child is not None
        eventually(lambda: Path(f"/proc/{child.pid}/cmdline").read_bytes().startswith(b"sleep\0"))  # exec'd
        assert child.alive()
        parent.kill()  # SIGKILL: the parent can do nothing about its child
        eventually(lambda: not child.alive(), timeout_s=10)
    finally:
        parent.kill()
        parent.wait()
        assert parent.stdout is not None
        parent.stdout.close()


def test_parent_death_does_not_start_a_program_whose_parent_is_gone(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    not_our_parent = 1
    done = subprocess.run([*parent_death.launcher(not_our_parent), "touch", str(marker)])
    assert done.returncode == 1 and not marker.exists()
    # With the right parent it is the program itself: its exit status is the program's.
    assert subprocess.run([*parent_death.launcher(), "sh", "-c", "exit 7"]).returncode == 7
    assert subprocess.run([*parent_death.launcher(), "touch", str(marker)]).returncode == 0 and marker.exists()


WATCHER = """
    import asyncio
    from services.common import lifeline

    async def main():
        lost = asyncio.Event()
        assert lifeline.watch(lost.set)
        print("watching", flush=True)
        await lost.wait()
        print("lost", flush=True)

    asyncio.run(main())
"""


def test_the_lifeline_ends_with_its_holder_not_with_the_process_between() -> None:
    line = Lifeline()
    # A middle process (a driver) starts the watcher (a worker), handing the lifeline on, then dies.
    middle = python(f"""
        import subprocess, sys, textwrap, time
        from services.common import lifeline
        watcher = subprocess.Popen([sys.executable, "-c", textwrap.dedent({WATCHER!r})], pass_fds=lifeline.pass_on())
        print(watcher.pid, flush=True)
        time.sleep(600)
    """, env=line.environment(), pass_fds=(line.read_fd,))
    assert middle.stdout is not None
    try:
        watcher = PidRecord.of("watcher", int(middle.stdout.readline()))
        assert watcher is not None
        assert middle.stdout.readline() == "watching\n"  # the watcher shares the middle's stdout
        middle.kill()
        middle.wait()
        time.sleep(0.5)
        assert watcher.alive()  # its parent's death is not its own
        line.close()  # the holder goes: the write end closes
        eventually(lambda: not watcher.alive(), timeout_s=10)
        assert middle.stdout.readline() == "lost\n"
    finally:
        middle.kill()
        middle.wait()
        middle.stdout.close()
        line.close()


def test_without_a_lifeline_there_is_nothing_to_watch(tmp_path: Path) -> None:
    code = ("import asyncio\nfrom services.common import lifeline\n"
            "async def main(): print(lifeline.watch(lambda: None))\nasyncio.run(main())")
    env = {k: v for k, v in os.environ.items() if k != LIFELINE_VARIABLE}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True)
    assert out.stdout == "False\n", out.stderr
    # The variable without its pipe (inherited by something that was not given the descriptor).
    with open(tmp_path / "file", "w") as other:
        out = subprocess.run([sys.executable, "-c", code], cwd=REPO, pass_fds=(other.fileno(),),
                             env={**env, "PYTHONPATH": str(REPO), LIFELINE_VARIABLE: str(other.fileno())},
                             capture_output=True, text=True)
    assert out.stdout == "False\n", out.stderr


def test_a_pid_file_names_one_process(tmp_path: Path) -> None:
    pid_files = PidFiles(tmp_path / "pids")
    process = subprocess.Popen(["sleep", "600"])
    try:
        record = pid_files.record("sleeper", process.pid)
        assert record is not None and pid_files.read("sleeper") == record and record.alive()
        assert pid_files.live() == [record]
        impostor = PidRecord("sleeper", process.pid, record.start_ticks + 1)  # the pid, reused by another
        assert not impostor.alive()
        impostor.signal(signal.SIGKILL)
        assert process.poll() is None  # never signalled
        os.kill(process.pid, signal.SIGKILL)
        eventually(lambda: start_ticks(process.pid) is None)  # a zombie counts as gone
        assert not record.alive()
        assert pid_files.live() == [] and pid_files.read("sleeper") is None  # the stale file is removed
    finally:
        process.kill()
        process.wait()


def test_ending_says_what_it_waits_for_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    polite = subprocess.Popen(["sleep", "600"])
    other = subprocess.Popen(["sleep", "600"])
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "ready\n"
        record = PidRecord.of("other", other.pid)
        assert record is not None
        said: list[str] = []
        end_processes([Child("stubborn", stubborn), Child("polite", polite), Recorded(record)], 0.5,
                      said.append)
        assert stubborn.poll() == -signal.SIGKILL and polite.poll() == -signal.SIGTERM
        assert other.wait(5) == -signal.SIGTERM
        assert said[0].startswith(f"waiting for stubborn (pid {stubborn.pid})")  # and whoever has not ended yet
        assert said[-1] == f"did not stop within 0.5 s, killing: stubborn (pid {stubborn.pid})"
    finally:
        for process in (stubborn, polite, other):
            process.kill()
            process.wait()
        assert stubborn.stdout is not None
        stubborn.stdout.close()
