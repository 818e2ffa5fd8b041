"""The running command of an attempt, as the worker sees it: started,
watched, stopped and reaped.

`IsolatedCommand` has the worker's job `Launcher` (launcher.py, a helper
process of its own) start it through `jobinit.py` (namespaces of its own, a
user of its own); `PlainCommand` runs it as a plain child in its own process
group, as the worker's own user (development only). Both answer the same
calls: `started` (the pid the job sees, or why it could not start),
`signal` (SIGTERM asks every process of the job to stop, SIGKILL kills them
all), `exited`, `reap` and, once reaped, `ended` (its wait status and usage).

Neither runs Python between fork and exec in the worker, a multithreaded
gRPC process: gRPC's state in such a child is not safe to touch (issue 10:
jobs died at start with SIGABRT, `Check failed: next_worker->state ==
KICKED`, when a preexec_fn set their memory limit). Only the launcher, which
has a single thread, forks and then runs Python.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from services.worker.helper_process import HelperProcess

LAUNCHER = Path(__file__).with_name("launcher.py")
"""The launcher program, run by its path with `python -I -S`: it imports nothing of corral."""
SYSTEM_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
"""Where the worker looks for util-linux's prlimit (never the job's PATH)."""


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
    read_only_binds: tuple[tuple[str, str], ...] = ()
    """(source, target) directories: each source, hidden from the job like the rest of the scratch root, is
    mounted read-only at its target below the job's working directory (its secrets)."""
    cgroup_procs: str = ""
    """The `cgroup.procs` of the attempt's cgroup, which its top process joins before it forks (so the job's
    processes are held to its pids.max); '' where the worker has no cgroups to write."""
    max_file_bytes: int = 0
    """RLIMIT_FSIZE of the command: the largest file it may write (its storage request); 0: none."""


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
              address_space_bytes: int) -> PlainCommand:
        """Start it, its stdout and stderr on `output_fd`, its RLIMIT_AS `address_space_bytes` (0: none);
        raises StartFailed. The limit is set by util-linux's `prlimit`, which then execs the command in the
        same process: Popen without a preexec_fn runs no Python in the child."""
        program = argv
        if address_space_bytes > 0:
            prlimit = shutil.which("prlimit", path=SYSTEM_PATH)
            if prlimit is None:
                raise StartFailed("could not limit the job's memory: util-linux's prlimit is not installed "
                                  f"on the worker's machine (looked in {SYSTEM_PATH})")
            if not _finds_program(argv[0], env, cwd):  # prlimit would only print its failure into the log
                raise StartFailed(f"could not start {argv[0]!r}: {os.strerror(2)}")
            program = [prlimit, f"--as={address_space_bytes}:{address_space_bytes}", "--", *argv]
        try:
            return cls(subprocess.Popen(program, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=output_fd,
                                        stderr=subprocess.STDOUT, start_new_session=True))
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


def _finds_program(name: str, env: dict[str, str], cwd: Path) -> bool:
    """Whether exec would find `name` as execvp does: a path (relative to `cwd`), or on the job's PATH."""
    if "/" in name:
        path = cwd / name
        return path.is_file() and os.access(path, os.X_OK)
    return shutil.which(name, path=env.get("PATH", os.defpath)) is not None


class Launcher(HelperProcess):
    """The worker's job launcher (launcher.py): one long-lived, single-threaded root process that forks
    each isolated attempt, so the worker never forks for one. Each start waits for the launcher's answer (it
    forks and answers at once)."""

    @classmethod
    def start(cls) -> Launcher:
        """Start a launcher. Call it from the thread that lives as long as the worker (the event loop's): the
        launcher dies with the thread that started it (PR_SET_PDEATHSIG)."""
        try:
            return cls.spawn(LAUNCHER)
        except (OSError, subprocess.SubprocessError) as e:
            raise StartFailed(f"could not start the job launcher: {e}") from e

    @property
    def alive(self) -> bool:
        """Whether it still runs and answered every request so far. Its socket tells first: the launcher
        speaks only when asked (one start at a time), so a readable socket is one it closed, and a dying
        process closes its descriptors before its children get their PR_SET_PDEATHSIG."""
        if self._failed or self._requests.fileno() < 0:
            return False
        closed = select.poll()
        closed.register(self._requests, select.POLLIN)
        return not closed.poll(0) and self.proc.poll() is None

    def launch(self, instructions: dict, output_fd: int, status_fd: int) -> int:
        """Start an attempt of `jobinit.run_attempt`; returns a pidfd of its top process. Raises StartFailed;
        if the launcher failed us, it is killed (and its attempts with it)."""
        memfd = os.memfd_create("corral-attempt", os.MFD_CLOEXEC)  # the environment stays off command lines
        try:
            data = memoryview(json.dumps(instructions).encode())
            while data:
                data = data[os.write(memfd, data):]
            count, reply, pidfds = self.ask(f"start {self._count + 1}".encode(), [memfd, output_fd, status_fd], 1)
        except OSError as e:  # a timeout too
            raise StartFailed(f"the job launcher (pid {self.pid}) did not answer: {e}") from e
        finally:
            os.close(memfd)
        number, _, answer = reply.decode("utf-8", "replace").partition(" ")
        kind, _, detail = answer.partition(" ")
        if kind == "started" and number == count and len(pidfds) == 1:
            return pidfds[0]
        for fd in pidfds:
            os.close(fd)
        if kind == "error" and number == count:
            raise StartFailed(detail)
        self.kill()
        raise StartFailed(f"the job launcher (pid {self.pid}) " +
                          ("died" if not reply else f"answered {reply[:100]!r} to request {count}"))



class IsolatedCommand:
    """The command started by the worker's `Launcher` through `jobinit.py`. The worker holds a pidfd of the
    attempt's top process, outside the job's namespaces (the launcher's child): the job's init and processes
    die with it, and no pid can be reused under the worker."""

    def __init__(self, launcher: Launcher, pidfd: int, status_fd: int):
        self.launcher = launcher
        self.reaped = False
        self._pidfd = pidfd
        self._status_fd = status_fd
        self._buffer = b""
        self._eof = False
        self._lines: list[str] = []

    @classmethod
    def start(cls, launcher: Launcher, argv: list[str], env: dict[str, str], cwd: Path, output_fd: int,
              address_space_bytes: int, isolation: Isolation) -> IsolatedCommand:
        """Have the launcher start it, its stdout and stderr on `output_fd`; raises StartFailed."""
        status_r, status_w = os.pipe()
        try:
            pidfd = launcher.launch({
                "argv": argv, "env": env, "cwd": str(cwd), "address_space_bytes": address_space_bytes,
                "uid": isolation.uid, "gid": isolation.gid, "hostname": isolation.hostname,
                "network": "none" if isolation.network_none else "host", "cover": isolation.cover,
                "reveal": list(isolation.reveal), "private_dirs": list(isolation.private_dirs),
                "private_dir_bytes": isolation.private_dir_bytes, "max_processes": isolation.max_processes,
                "read_only_binds": [list(bind) for bind in isolation.read_only_binds],
                "cgroup_procs": isolation.cgroup_procs, "max_file_bytes": isolation.max_file_bytes,
            }, output_fd, status_w)
        except BaseException:
            os.close(status_r)
            raise
        finally:
            os.close(status_w)
        os.set_blocking(status_r, False)
        return cls(launcher, pidfd, status_r)

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
        """SIGTERM: the top process passes it to the init, which sends it to every process of the job.
        SIGKILL: the top process dies, and with it the init, and with the init every process of its
        namespace."""
        try:
            signal.pidfd_send_signal(self._pidfd, sig)
        except ProcessLookupError:
            pass

    async def exited(self) -> None:
        """Return once the top process has exited (its pidfd becomes readable)."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()
        fd = os.dup(self._pidfd)  # its own: a cancelled wait may end after `close`
        loop.add_reader(fd, lambda: readable.done() or readable.set_result(None))
        try:
            await readable
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def reap(self) -> None:
        """Wait until the top process is gone (the launcher reaps it)."""
        await self.exited()
        self.reaped = True

    def reap_now(self) -> None:
        """`reap`, blocking: only for a process just sent SIGKILL, which exits at once."""
        poller = select.poll()
        poller.register(self._pidfd, select.POLLIN)
        poller.poll()
        self.reaped = True

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
        """Close the report pipe (after `ended`) and the pidfd."""
        for fd in (self._status_fd, self._pidfd):
            if fd >= 0:
                os.close(fd)
        self._status_fd = self._pidfd = -1

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
