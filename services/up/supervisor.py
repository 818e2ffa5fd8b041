"""`corral up`'s supervision, in one place: every process it runs is a *part*; a part that dies is
started again with back-off, and the whole system stops only when asked to or when a part cannot be
kept running.

The rules (docs/operations.md, "Faults and supervision"):
- a part that dies is logged with its exit status and started again: at once the first time, then
  after 1 s, 2 s, 4 s, ... (at most 30 s) while it keeps dying without serving (a driver never
  sooner than 3 s: a standby leads first);
- a part that served after its last start (ready, then up `served_s`, 2 s), or stayed up
  `stable_s` (60 s), is doing fine: its next death counts as a first one;
- a part whose last `tries` (5) restarts in a row each died before it had served for `served_s`
  (2 s: ready, and up that long since) cannot be kept running: `Supervisor.failed` says so, and
  `corral up` stops everything and exits 1. A part that serves after each restart is restarted however
  often something kills it (a fault program killed the leading driver 100 times).

Every part is started from this process's main thread through `parent_death` (it dies with `corral
up`, however `corral up` ends), in a session of its own (a Ctrl-C at the terminal reaches only
`corral up`, which stops the parts in order), and is recorded in a pid file (`corral up` ends what a
killed one left). The loop is synchronous and `check` is called from the main thread: the kernel
sends the parent-death signal when the thread that forked a child ends, so no part may be started
from a thread that could end first.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from services.common.parent_death import launcher
from services.common.processes import Child, Ending, PidFiles, Recorded, describe, end_processes


@dataclasses.dataclass(frozen=True)
class RestartPolicy:
    """When to start a dead part again, and when to give up on it."""

    first_restart_s: float = 0.0
    """Pause before the first restart of a series, and the shortest pause before any (at once by
    default; the drivers wait for a standby to take over first, see services.up.app)."""
    first_pause_s: float = 1.0
    """Pause before the second restart in a row; it doubles after each."""
    max_pause_s: float = 30.0
    """Longest pause between two restarts."""
    tries: int = 5
    """Restarts in a row that did not serve, after which the part's next death stops everything."""
    stable_s: float = 60.0
    """A part up this long is doing fine again, ready or not: the pause before its next restart is the
    first one."""
    served_s: float = 2.0
    """A restart served once the part was ready and stayed up this long: it could be restarted, and its
    next death counts as a first one (toward `tries`, and for the pause)."""

    def pause_s(self, restarts_in_a_row: int) -> float:
        """The pause before restart number `restarts_in_a_row + 1` of a series (never shorter than
        `first_restart_s`)."""
        if restarts_in_a_row == 0:
            return self.first_restart_s
        return max(self.first_restart_s, min(self.max_pause_s, self.first_pause_s * 2 ** (restarts_in_a_row - 1)))


class Part(Protocol):
    """One process `corral up` keeps running."""

    name: str

    def start(self) -> None:
        """Start it (again); raises if it could not be started."""

    @property
    def pid(self) -> int | None:
        """Its pid, once started."""

    def exit_status(self) -> int | None:
        """None while it runs; then its exit status (negative: the signal that killed it)."""

    def ready(self) -> bool:
        """Whether it serves (for the log line after a restart)."""

    def last_words(self) -> str:
        """Where to look for why it died (for the log line when it does)."""

    def ending(self) -> Ending | None:
        """How to end it (None if it was never started)."""


class ServiceProcess:
    """A process with a fixed argv, its output appended to a log file; `ready_file` (its ports file) is
    removed at each start and appears once it serves."""

    def __init__(self, name: str, argv: Sequence[str], log_file: Path, env: Mapping[str, str],
                 ready_file: Path | None = None, pass_fds: Sequence[int] = ()):
        self.name = name
        self.argv = list(argv)
        self.log_file = log_file
        self.env = dict(env)
        self.ready_file = ready_file
        self.pass_fds = tuple(pass_fds)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.ready_file is not None:
            self.ready_file.unlink(missing_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as out:
            self.process = subprocess.Popen([*launcher(), *self.argv], stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, pass_fds=self.pass_fds, start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def exit_status(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def ready(self) -> bool:
        return self.ready_file is None or self.ready_file.exists()

    def last_words(self) -> str:
        return f"its log: {self.log_file}"

    def ending(self) -> Ending | None:
        return Child(self.name, self.process) if self.process is not None else None


def exit_description(status: int) -> str:
    """`-9 (killed by SIGKILL)`, `1`."""
    if status < 0:
        try:
            return f"{status} (killed by {signal.Signals(-status).name})"
        except ValueError:
            return f"{status} (killed by signal {-status})"
    return str(status)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclasses.dataclass
class _Supervised:
    part: Part
    started_at: float
    policy: RestartPolicy
    restarts_in_a_row: int = 0
    """Deaths in a row without serving or staying up `stable_s`: how long to pause before the next
    restart."""
    unserved_in_a_row: int = 0
    """Restarts in a row that died before serving `served_s`: giving up at `tries`."""
    ready_at: float | None = None
    """When it was first seen ready since its last (re)start."""
    restart_at: float | None = None
    """When to start it again, while it is dead."""
    announced: bool = True
    """Whether its being ready again after a restart was said."""


class Supervisor:
    """Keeps its parts running (see the module docstring); `check` is one look at every part."""

    def __init__(self, pid_files: PidFiles, policy: RestartPolicy = RestartPolicy(),
                 clock: Callable[[], float] = time.monotonic, say: Callable[[str], None] = _say):
        self.pid_files = pid_files
        self.policy = policy
        self._clock = clock
        self.say = say
        self._parts: dict[str, _Supervised] = {}
        self.failed: str | None = None
        """Why the system must stop: a part that could not be kept running (None while all is well)."""
        self.restarts = 0
        """Restarts done, over every part."""

    @property
    def parts(self) -> list[Part]:
        """The parts, in start order."""
        return [s.part for s in self._parts.values()]

    def start(self, part: Part, policy: RestartPolicy | None = None) -> None:
        """Start a new part and supervise it from now on (by `policy`, default the supervisor's); raises
        (and keeps no part) if it cannot start."""
        try:
            part.start()
        except BaseException:
            self._abandon(part)
            raise
        self._parts[part.name] = _Supervised(part, self._clock(), policy or self.policy)
        self._record(part)

    def check(self) -> None:
        """Note the parts that died, restart those whose pause is over, say which serve again."""
        now = self._clock()
        for supervised in self._parts.values():
            if self.failed is not None:
                return
            part = supervised.part
            if supervised.restart_at is None:
                status = part.exit_status()
                if status is None:
                    if supervised.ready_at is None and part.ready():
                        supervised.ready_at = now
                    if not supervised.announced and supervised.ready_at is not None:
                        supervised.announced = True
                        self.say(f"{part.name} (pid {part.pid}) serves again")
                    continue
                self.pid_files.forget(part.name)
                self._died(supervised, now, f"(pid {part.pid}) exited with {exit_description(status)}",
                           part.last_words())
            if supervised.restart_at is not None and now >= supervised.restart_at:
                self._restart(supervised, now)

    def _died(self, supervised: _Supervised, now: float, what: str, last_words: str = "") -> None:
        part, policy = supervised.part, supervised.policy
        up_s = now - supervised.started_at
        if up_s >= policy.stable_s:
            supervised.restarts_in_a_row = 0
        if supervised.ready_at is not None and now - supervised.ready_at >= policy.served_s:
            # It served: it can be restarted, so this death is treated as a first one (no growing pause).
            supervised.unserved_in_a_row = supervised.restarts_in_a_row = 0
        if supervised.unserved_in_a_row >= policy.tries:
            self.failed = (f"{part.name} {what}, and it could not be kept running: {policy.tries} restarts in a "
                           f"row did not serve {policy.served_s:g} s" + (f" ({last_words})" if last_words else ""))
            self.say(f"{self.failed}; stopping everything")
            return
        pause_s = policy.pause_s(supervised.restarts_in_a_row)
        supervised.restarts_in_a_row += 1
        supervised.unserved_in_a_row += 1
        supervised.restart_at = now + pause_s
        when = "now" if pause_s == 0 else f"in {pause_s:g} s"
        self.say(f"{part.name} {what} after {up_s:.0f} s up; restarting it {when} "
                 f"(restart {supervised.unserved_in_a_row} of at most {policy.tries} in a row)"
                 + (f"; {last_words}" if last_words else ""))

    def _restart(self, supervised: _Supervised, now: float) -> None:
        part = supervised.part
        supervised.restart_at = None
        supervised.started_at = now
        supervised.ready_at = None
        try:
            part.start()
        except Exception as e:  # noqa: BLE001 - counted as a death, tried again after the pause
            self._abandon(part)
            self._died(supervised, now, f"could not be started ({e})")
            return
        self.restarts += 1
        supervised.announced = False
        self._record(part)
        self.say(f"{part.name} restarted (pid {part.pid})")

    def _abandon(self, part: Part) -> None:
        """End what a start that failed may have left running (a server that never answered)."""
        ending = part.ending()
        if ending is not None and not ending.gone():
            end_processes([ending], 10.0, self.say)

    def _record(self, part: Part) -> None:
        if part.pid is not None:
            self.pid_files.record(part.name, part.pid)

    def end(self, names: Sequence[str], grace_s: float) -> None:
        """Stop these parts (SIGTERM, then SIGKILL after `grace_s`), saying what is awaited; they are not
        restarted any more."""
        endings = []
        for name in names:
            supervised = self._parts.pop(name, None)
            if supervised is None:
                continue
            ending = supervised.part.ending()
            if ending is not None and not ending.gone():
                endings.append(ending)
        if endings:
            end_processes(endings, grace_s, self.say)
        for name in names:
            self.pid_files.forget(name)


LEFTOVER_GRACE_S = 60.0
"""How long a process an earlier `corral up` left may take to stop (a MariaDB shuts down cleanly) before
it is killed."""


def lock_data_dir(run_dir: Path) -> int:
    """Hold DATA/run/up.lock for as long as this process lives (the kernel lets go when it ends, SIGKILL
    included): a second `corral up` on the same data directory would take its ports, and would end
    its processes as leftovers."""
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / "up.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        raise RuntimeError(f"another corral up (pid {holder or '?'}) runs on {run_dir.parent}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def end_leftovers(pid_files: PidFiles, say: Callable[[str], None]) -> None:
    """End what an earlier `corral up` that was killed left running. Each pid file names its process by
    pid and start time: a process that merely reuses a pid is never touched."""
    leftovers = [Recorded(record) for record in pid_files.live()]
    if leftovers:
        say(f"ending what an earlier corral up left running: {describe(leftovers)}")
        end_processes(leftovers, LEFTOVER_GRACE_S, say)
    for record in leftovers:
        pid_files.forget(record.name)
