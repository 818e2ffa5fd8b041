"""Processes known by pid: pid files that name exactly one process, and ending a set of processes while
saying what is being waited for.

A pid file (`DIR/NAME.pid`, JSON) holds the pid *and* the process's start
time (field 22 of /proc/PID/stat, in clock ticks since boot). A pid is reused
once its process is gone; the pair is not. So a process found from a pid
file is signalled only while it is still the process the file was written
for: an unrelated process that later got the same pid is never touched.

`corral up` records every process it starts (DATA/run/pids/), and the
driver's local provider each worker it starts; a restarted `corral up` ends
what a killed one left, and a driver can stop a local worker another driver
started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from services.common.files import write_atomically


def start_ticks(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if there is no such live process (a zombie,
    dead but not yet reaped, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # "pid (comm) state ppid ...": comm may hold spaces and ')'
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])  # field 22 of the whole line


@dataclasses.dataclass(frozen=True)
class PidRecord:
    """One process, as a pid file names it."""

    name: str
    """What the process is (`driver-0`, `mariadb`, `worker-standard-1a2b3c4d`)."""
    pid: int
    start_ticks: int
    """Its start time, from /proc: with the pid, names exactly one process."""

    @classmethod
    def of(cls, name: str, pid: int) -> PidRecord | None:
        """The record of a live process, or None if it is already gone."""
        ticks = start_ticks(pid)
        return None if ticks is None else cls(name, pid, ticks)

    def alive(self) -> bool:
        """Whether the process is still running and is still the one recorded."""
        return start_ticks(self.pid) == self.start_ticks

    def signal(self, signum: int) -> None:
        """Send `signum`, only if the pid still names the recorded process."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class PidFiles:
    """A directory of pid files (0700, like the rest of a data directory's private parts)."""

    def __init__(self, directory: Path):
        self.directory = directory

    def _path(self, name: str) -> Path:
        return self.directory / f"{name}.pid"

    def record(self, name: str, pid: int) -> PidRecord | None:
        """Write NAME.pid for the live process `pid` (None, and nothing written, if it is gone)."""
        record = PidRecord.of(name, pid)
        if record is not None:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomically(self._path(name), json.dumps({"pid": pid, "start_ticks": record.start_ticks}).encode())
        return record

    def forget(self, name: str) -> None:
        """Remove NAME.pid."""
        self._path(name).unlink(missing_ok=True)

    def read(self, name: str) -> PidRecord | None:
        """What NAME.pid says, or None if there is no (readable) file."""
        try:
            data = json.loads(self._path(name).read_text())
            return PidRecord(name, int(data["pid"]), int(data["start_ticks"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def live(self, prefix: str = "") -> list[PidRecord]:
        """Every recorded process (whose name starts with `prefix`) still running; the files of the others
        are removed."""
        found = []
        for path in sorted(self.directory.glob(f"{prefix}*.pid")):
            record = self.read(path.stem)
            if record is not None and record.alive():
                found.append(record)
            else:
                path.unlink(missing_ok=True)
        return found


class Ending(Protocol):
    """A process to end: a child of ours (a Popen) or one known from a pid file."""

    name: str

    @property
    def pid(self) -> int: ...

    def gone(self) -> bool: ...

    def signal(self, signum: int) -> None: ...


@dataclasses.dataclass
class Child:
    """A process this one started: ending it also reaps it."""

    name: str
    process: subprocess.Popen[Any]

    @property
    def pid(self) -> int:
        return self.process.pid

    def gone(self) -> bool:
        return self.process.poll() is not None

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)


@dataclasses.dataclass
class Recorded:
    """A process known from its pid file (not necessarily our child: another process may reap it)."""

    record: PidRecord

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def pid(self) -> int:
        return self.record.pid

    def gone(self) -> bool:
        return not self.record.alive()

    def signal(self, signum: int) -> None:
        self.record.signal(signum)


KILL_WAIT_S = 10.0
"""How long `end_processes` waits for a process it SIGKILLed."""


def describe(processes: Sequence[Ending]) -> str:
    """`driver-0 (pid 12), auth (pid 10)`."""
    return ", ".join(f"{p.name} (pid {p.pid})" for p in processes)


def end_processes(processes: Sequence[Ending], grace_s: float, say: Callable[[str], None],
                  report_every_s: float = 5.0, poll_s: float = 0.05) -> None:
    """SIGTERM each process, wait for them together, saying what is still awaited (at once and every
    `report_every_s`), and SIGKILL those still running after `grace_s`; returns when all are gone, or
    (saying so) when some still are `KILL_WAIT_S` after SIGKILL (stuck in the kernel: nothing more to do)."""
    waiting = [p for p in processes if not p.gone()]
    for process in waiting:
        process.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    next_report = time.monotonic()
    killed = False
    while True:
        waiting = [p for p in waiting if not p.gone()]
        if not waiting:
            return
        now = time.monotonic()
        if killed and now >= deadline + KILL_WAIT_S:
            say(f"still there {KILL_WAIT_S:g} s after SIGKILL, giving up on: {describe(waiting)}")
            return
        if now >= deadline and not killed:
            say(f"did not stop within {grace_s:g} s, killing: {describe(waiting)}")
            for process in waiting:
                process.signal(signal.SIGKILL)
            killed = True
        elif now >= next_report:
            say(f"waiting for {describe(waiting)}")
            next_report = now + report_every_s
        time.sleep(poll_s)


def last_log_line(log_file: Path) -> str:
    """A process's last words for its supervisor: the last line of its log file."""
    try:
        lines = log_file.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return f"the last line of {log_file}: {lines[-1] if lines else '(empty)'}"
