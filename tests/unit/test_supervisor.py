"""`corral up`'s supervisor: a part that dies is started again with back-off, one that cannot be kept
running makes it give up, a part that stayed up starts its count over; with real processes, a kill is
reported with its signal, the restarted process is recorded, and ending a part stops it for good."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from services.common.processes import PidFiles
from services.up.supervisor import (
    RestartPolicy,
    ServiceProcess,
    Supervisor,
    end_leftovers,
    exit_description,
    lock_data_dir,
)

pytestmark = pytest.mark.timeout(60)


def eventually(check, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.02)
    return value


class Dies:
    """A part that dies as soon as it starts (the supervisor sees it at its next check); with
    `up_for_s`, one that runs that long first. It starts whenever asked."""

    name = "flaky"

    def __init__(self, clock: list[float], up_for_s: float = 0.0):
        self._clock = clock
        self._up_for_s = up_for_s
        self.starts: list[float] = []

    def start(self) -> None:
        self.starts.append(self._clock[0])

    @property
    def pid(self) -> int | None:
        return None

    def exit_status(self) -> int | None:
        return 3 if self._clock[0] - self.starts[-1] >= self._up_for_s else None

    def ready(self) -> bool:
        return True

    def last_words(self) -> str:
        return ""

    def ending(self) -> None:
        return None


class WillNotStartAgain(Dies):
    """A part that dies at once and then cannot be started again (a database whose disk is full)."""

    def start(self) -> None:
        super().start()
        if len(self.starts) > 1:
            raise RuntimeError("mariadbd exited: InnoDB: out of disk")


def test_a_part_is_restarted_with_back_off_then_given_up_on(tmp_path: Path) -> None:
    now = [0.0]
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path), RestartPolicy(tries=5), clock=lambda: now[0], say=said.append)
    part = Dies(now)
    supervisor.start(part)
    for second in range(60):
        now[0] = float(second)
        supervisor.check()
    # At once, then after 1, 2, 4 and 8 s (each death seen at the next check, a second later).
    assert part.starts == [0, 0, 2, 5, 10, 19]
    assert supervisor.failed is not None and supervisor.failed.startswith("flaky (pid None) exited with 3")
    assert "5 restarts in a row" in supervisor.failed
    assert said[0] == "flaky (pid None) exited with 3 after 0 s up; restarting it now (restart 1 of at most 5 in a row)"
    assert said[1] == "flaky restarted (pid None)"
    assert "restarting it in 8 s (restart 5 of at most 5 in a row)" in said[-3]
    assert said[-1] == supervisor.failed + "; stopping everything"


def test_a_part_that_cannot_be_started_again_is_tried_with_back_off(tmp_path: Path) -> None:
    now = [0.0]
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path), clock=lambda: now[0], say=said.append)
    part = WillNotStartAgain(now)
    supervisor.start(part)
    for second in range(60):
        now[0] = float(second)
        supervisor.check()
    assert part.starts == [0, 0, 1, 3, 7, 15]  # the first start, then at once, 1 s, 2 s, 4 s, 8 s later
    assert said[1] == ("flaky could not be started (mariadbd exited: InnoDB: out of disk) after 0 s up; "
                       "restarting it in 1 s (restart 2 of at most 5 in a row)")
    assert supervisor.failed is not None and supervisor.failed.startswith("flaky could not be started")
    assert supervisor.restarts == 0


def test_a_part_that_stayed_up_starts_its_count_over(tmp_path: Path) -> None:
    now = [0.0]
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path), RestartPolicy(tries=2, stable_s=60.0), clock=lambda: now[0],
                            say=said.append)
    part = Dies(now, up_for_s=100.0)
    supervisor.start(part)
    for second in range(0, 1000, 10):
        now[0] = float(second)
        supervisor.check()
    assert supervisor.failed is None  # it dies every 100 s, but each time after a good run
    assert part.starts == list(range(0, 1000, 100))
    assert all("restarting it now (restart 1 of" in line for line in said if "exited" in line)


def test_a_part_killed_again_and_again_after_serving_is_never_given_up_on(tmp_path: Path) -> None:
    """A leading driver killed every 25 s by a fault program: each restart served (ready, up 10 s and
    more) before it died, so it could be restarted, however often, each time as after a first death."""
    now = [0.0]
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path), RestartPolicy(tries=2, served_s=10.0), clock=lambda: now[0],
                            say=said.append)
    part = Dies(now, up_for_s=25.0)
    supervisor.start(part)
    for second in range(0, 3000):
        now[0] = float(second)
        supervisor.check()
    assert supervisor.failed is None
    assert len(part.starts) > 50
    # No growing pause: restarted at once each time, in the check that sees it dead.
    assert {b - a for a, b in zip(part.starts, part.starts[1:])} == {25.0}
    # One that dies 5 s after each start has not served: given up on after two such restarts.
    now[0] = 0.0
    supervisor = Supervisor(PidFiles(tmp_path), RestartPolicy(tries=2, served_s=10.0), clock=lambda: now[0],
                            say=said.append)
    part = Dies(now, up_for_s=5.0)
    supervisor.start(part)
    for second in range(0, 300):
        now[0] = float(second)
        supervisor.check()
    assert supervisor.failed is not None and "2 restarts in a row did not serve 10 s" in supervisor.failed
    assert len(part.starts) == 3


def test_the_restarts_may_wait_longer(tmp_path: Path) -> None:
    now = [0.0]
    supervisor = Supervisor(PidFiles(tmp_path), clock=lambda: now[0], say=lambda line: None)
    part = Dies(now)
    supervisor.start(part, RestartPolicy(first_restart_s=3.0))
    for second in range(30):
        now[0] = float(second)
        supervisor.check()
    assert part.starts == [0, 3, 7, 11, 16, 25]  # never sooner than 3 s: 3, 3, 3, 4, 8 (each death seen 1 s on)


def test_a_killed_process_is_reported_restarted_and_recorded(tmp_path: Path) -> None:
    said: list[str] = []
    pid_files = PidFiles(tmp_path / "pids")
    supervisor = Supervisor(pid_files, say=said.append)
    ready = tmp_path / "ready"
    part = ServiceProcess("sleeper", ["sh", "-c", f"touch {ready}; exec sleep 600"], tmp_path / "sleeper.log",
                          os.environ, ready_file=ready)
    supervisor.start(part)
    try:
        first = part.pid
        assert first is not None
        eventually(ready.exists)
        record = pid_files.read("sleeper")
        assert record is not None and record.pid == first and record.alive()
        os.kill(first, signal.SIGKILL)
        eventually(lambda: supervisor.check() or part.pid != first)
        assert said[0].startswith(f"sleeper (pid {first}) exited with -9 (killed by SIGKILL) after ")
        assert said[0].endswith(f" s up; restarting it now (restart 1 of at most 5 in a row); its log: {tmp_path / 'sleeper.log'}")
        assert said[1] == f"sleeper restarted (pid {part.pid})"
        eventually(lambda: supervisor.check() or said[-1] == f"sleeper (pid {part.pid}) serves again")
        restarted = pid_files.read("sleeper")
        assert restarted is not None and restarted.pid == part.pid and restarted.alive()
    finally:
        supervisor.end(["sleeper"], grace_s=10)
    assert part.exit_status() == -signal.SIGTERM
    assert pid_files.read("sleeper") is None
    supervisor.check()
    assert supervisor.parts == []  # an ended part is not restarted


def test_a_process_that_keeps_failing_makes_it_give_up(tmp_path: Path) -> None:
    said: list[str] = []
    supervisor = Supervisor(PidFiles(tmp_path / "pids"), RestartPolicy(tries=2, first_pause_s=0.05),
                            say=said.append)
    supervisor.start(ServiceProcess("broken", ["sh", "-c", "exit 3"], tmp_path / "broken.log", os.environ))
    eventually(lambda: supervisor.check() or supervisor.failed)
    assert supervisor.failed is not None and " exited with 3, and it could not be kept running" in supervisor.failed
    assert sum("restarted" in line for line in said) == 2


def test_exit_descriptions() -> None:
    assert exit_description(-9) == "-9 (killed by SIGKILL)"
    assert exit_description(-15) == "-15 (killed by SIGTERM)"
    assert exit_description(1) == "1"


def test_one_corral_up_per_data_directory(tmp_path: Path) -> None:
    fd = lock_data_dir(tmp_path / "run")
    try:
        with pytest.raises(RuntimeError, match=f"another corral up \\(pid {os.getpid()}\\) runs on {tmp_path}"):
            lock_data_dir(tmp_path / "run")
    finally:
        os.close(fd)
    os.close(lock_data_dir(tmp_path / "run"))  # free again once its holder let go


def test_leftovers_are_ended_and_only_they(tmp_path: Path) -> None:
    pid_files = PidFiles(tmp_path / "pids")
    leftover = os.posix_spawnp("sleep", ["sleep", "600"], dict(os.environ))
    pid_files.record("worker-left", leftover)
    # A pid file whose pid now names another process (this one: its start time differs).
    me = pid_files.record("driver-0", os.getpid())
    assert me is not None
    (pid_files.directory / "driver-0.pid").write_text(
        f'{{"pid": {os.getpid()}, "start_ticks": {me.start_ticks - 1}}}')
    said: list[str] = []
    end_leftovers(pid_files, said.append)
    assert os.waitpid(leftover, 0) == (leftover, signal.SIGTERM)  # it was ended with SIGTERM
    assert said[0] == f"ending what an earlier corral up left running: worker-left (pid {leftover})"
    assert not any("driver-0" in line for line in said)
    assert list(pid_files.directory.iterdir()) == []
