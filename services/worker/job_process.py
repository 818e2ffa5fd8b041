"""The running command of an attempt, as the worker sees it: started,
watched, stopped and reaped.

`IsolatedCommand` runs it through `jobinit.py` (namespaces of its own, a
user of its own); `PlainCommand` runs it as a plain child in its own process
group, as the worker's own user (development only). Both answer the same
calls: `started` (the pid the job sees, or why it could not start),
`signal` (SIGTERM asks every process of the job to stop, SIGKILL kills them
all), `exited`, `reap` and, once reaped, `ended` (its wait status and usage).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

INIT = Path(__file__).with_name("jobinit.py")
"""The init program, run by its path with `python -I -S`: it imports nothing of corral."""


class StartFailed(Exception):
    """The command could not be started; the message says why, for the job's status."""


@dataclass(frozen=True)
class Ended:
    """How the command ended."""

    wait_status: int
    """Its wait status (see os.waitstatus_to_exitcode)."""
    cpu_time_ms: int | None
    """CPU time (user + system) of the command and the processes reaped after it, where known."""
    peak_memory_bytes: int | None
    """Peak resident memory of its largest process, where known."""


@dataclass(frozen=True)
class Isolation:
    """What `jobinit.py` needs besides the command: see `ProcessRuntimeConfig` for each setting."""

    uid: int
    gid: int
    hostname: str
    network_none: bool
    cover: str
    """The directory hidden under an empty tmpfs in the job's view (the scratch root or an ancestor)."""
    reveal: tuple[str, ...]
    """The attempt's directories shown again inside it, at their usual paths."""
    private_dirs: tuple[str, ...]
    private_dir_bytes: int
    max_processes: int


class _Process:
    """A child of the worker, left unreaped until `reap` so that its pid cannot be reused meanwhile."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pid = proc.pid
        self.reaped = False
        self._result: tuple[int, resource.struct_rusage] | None = None

    async def exited(self) -> None:
        """Return once the process has exited, leaving it unreaped where the OS allows."""
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            if hasattr(os, "waitid"):
                await asyncio.to_thread(os.waitid, os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
                return
            # E.g. macOS before Python 3.13: reap here, polling so that a cancel never loses the result
            # to a thread; a signal to the group then has a small pid-reuse window.
            while (reaped := os.wait4(self.pid, os.WNOHANG))[0] == 0:
                await asyncio.sleep(0.05)
            self._result = reaped[1:]
            return
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await readable
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def reap(self) -> None:
        """Collect the exited process."""
        if self._result is None:
            self._result = (await asyncio.to_thread(os.wait4, self.pid, 0))[1:]
        self._finish()

    def reap_now(self) -> None:
        """`reap`, blocking: only for a process just sent SIGKILL, which exits at once."""
        if self._result is None:
            self._result = os.wait4(self.pid, 0)[1:]
        self._finish()

    def close(self) -> None:
        """Release what watching it held (after `ended`)."""

    def _finish(self) -> None:
        assert self._result is not None
        # Popen must know the child is gone, or it would warn and try to reap its pid again later.
        self.proc.returncode = os.waitstatus_to_exitcode(self._result[0])
        self.reaped = True


class PlainCommand(_Process):
    """The command as a plain child of the worker, leader of its own process group. Processes that leave
    the group (setsid) escape `signal`."""

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], cwd: Path, output_fd: int,
              preexec: Callable[[], None] | None) -> PlainCommand:
        """Start it, its stdout and stderr on `output_fd`; raises StartFailed."""
        try:
            return cls(subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output_fd,
                                        stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=preexec))
        except (OSError, subprocess.SubprocessError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise StartFailed(f"could not start {argv[0]!r}: {why}") from e

    async def started(self) -> int:
        """The pid the job sees (Popen already said if it could not start)."""
        return self.pid

    def signal(self, sig: int) -> None:
        """Send `sig` to every process still in the command's group."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):  # group empty (macOS says EPERM when only zombies remain)
            pass

    def ended(self) -> Ended | None:
        """Its wait status and usage, once reaped."""
        if self._result is None:
            return None
        status, usage = self._result
        return Ended(status, round((usage.ru_utime + usage.ru_stime) * 1000), peak_rss_bytes(usage))


class IsolatedCommand(_Process):
    """The command run by `jobinit.py`: this process is its launcher, outside the job's namespaces; the
    job's init and processes die with it."""

    def __init__(self, proc: subprocess.Popen, status_fd: int, instructions: bytes):
        super().__init__(proc)
        self._status_fd = status_fd
        self._instructions = instructions
        self._buffer = b""
        self._eof = False
        self._lines: list[str] = []

    @classmethod
    def start(cls, argv: list[str], env: dict[str, str], cwd: Path, output_fd: int, address_space_bytes: int,
              isolation: Isolation) -> IsolatedCommand:
        """Start the launcher (call `send_instructions` next). It must run in the thread that lives as long as
        the worker (the event loop's): the launcher dies with the thread that started it."""
        status_r, status_w = os.pipe()
        instructions = json.dumps({
            "argv": argv, "env": env, "cwd": str(cwd), "address_space_bytes": address_space_bytes,
            "uid": isolation.uid, "gid": isolation.gid, "hostname": isolation.hostname,
            "network": "none" if isolation.network_none else "host", "cover": isolation.cover,
            "reveal": list(isolation.reveal), "private_dirs": list(isolation.private_dirs),
            "private_dir_bytes": isolation.private_dir_bytes, "max_processes": isolation.max_processes,
            "status_fd": status_w, "parent_pid": os.getpid()}).encode()
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(INIT)], cwd="/", env={},
                                    stdin=subprocess.PIPE, stdout=output_fd, stderr=subprocess.STDOUT,
                                    pass_fds=(status_w,), start_new_session=True)
        except (OSError, subprocess.SubprocessError) as e:
            os.close(status_r)
            raise StartFailed(f"could not start the job's init: {e}") from e
        finally:
            os.close(status_w)
        os.set_blocking(status_r, False)
        return cls(proc, status_r, instructions)

    async def send_instructions(self) -> None:
        """Hand the launcher its instructions (on its stdin: they hold the job's environment)."""
        stdin = self.proc.stdin
        assert stdin is not None

        def write() -> None:
            try:
                stdin.write(self._instructions)
                stdin.close()
            except BrokenPipeError:
                pass  # it died; `started` says so, and `close` closes our end

        await asyncio.to_thread(write)

    async def started(self) -> int:
        """The pid the job sees (2); raises StartFailed with the init's words if it could not start."""
        line = await self._next_line()
        kind, _, rest = (line or "").partition(" ")
        if kind == "started":
            return int(rest)
        if kind == "error":
            raise StartFailed(rest)
        raise StartFailed("the job's init exited before starting the command")

    def signal(self, sig: int) -> None:
        """SIGTERM: the launcher passes it to the init, which sends it to every process of the job. SIGKILL:
        the launcher dies, and with it the init, and with the init every process of its namespace."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            pass

    def ended(self) -> Ended | None:
        """What the init reported when the command ended; None if it never did (killed first)."""
        self._read_available()
        for line in self._lines:
            kind, _, rest = line.partition(" ")
            if kind == "exit":
                status, cpu_ms, maxrss_kib = (int(x) for x in rest.split())
                return Ended(status, cpu_ms, maxrss_kib * 1024)
        return None

    def close(self) -> None:
        """Close the report pipe (after `ended`) and, if the instructions never went, the launcher's stdin."""
        if self._status_fd >= 0:
            os.close(self._status_fd)
            self._status_fd = -1
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()

    async def _next_line(self) -> str | None:
        loop = asyncio.get_running_loop()
        while True:
            self._read_available()
            if self._lines:
                return self._lines.pop(0)
            if self._eof:
                return None
            readable = loop.create_future()
            loop.add_reader(self._status_fd, lambda: readable.done() or readable.set_result(None))
            try:
                await readable
            finally:
                loop.remove_reader(self._status_fd)

    def _read_available(self) -> None:
        while not self._eof and self._status_fd >= 0:
            try:
                chunk = os.read(self._status_fd, 4096)
            except BlockingIOError:
                return
            if not chunk:
                self._eof = True
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            self._lines += [line.decode("utf-8", "replace") for line in lines]


def peak_rss_bytes(usage: resource.struct_rusage) -> int:
    """ru_maxrss in bytes."""
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024  # Linux reports KiB
