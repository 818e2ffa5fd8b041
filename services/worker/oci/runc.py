"""The container runtime's command line, as the OCI runtime drives it: crun
or runc (the same commands), one state directory per worker and runtime
(`--root`), a container per attempt, started under the worker's keeper
(keeper.py: one long-lived process, the parent of every container, which
reports each job's exit status and kills the containers if the worker
dies), killed and deleted with the runtime's own commands.

crun, in C, is the one to prefer: a container costs it a fraction of what
runc, a Go program that starts three processes per container and copies
its own binary into a memfd each time, spends (docs/performance.md,
"containers"). It refuses a hybrid cgroup layout whose cgroup v2 holds a
controller, though (`crun_refusals`); runc then runs them.

The runtime's own words go to a JSON log file of the attempt (`--log`),
which `last_error` reads; when it fails before the job runs it also prints
them on its stderr, the log pipe, so they reach the job's log too (they
are useful there: `executable file not found in $PATH`). The pid file is
written once the container's process exists, so its absence after the
runtime exited tells a container that never started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

from services.worker.helper_process import HelperProcess

SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""Where the worker finds the runtime and cp (never the job's PATH)."""
COMMAND_TIMEOUT_S = 30.0
"""How long a kill, delete or list may take."""
KEEPER = Path(__file__).with_name("keeper.py")
"""Run by its path with `python -I -S`: it imports nothing of corral."""
CRUN, RUNC = "crun", "runc"
CGROUP_V2_HYBRID = Path("/sys/fs/cgroup/unified")


class RuncError(Exception):
    """The runtime failed; the message has its words."""


def find(program: str) -> str | None:
    return shutil.which(program, path=SYSTEM_PATH)


def kind_of(binary: str) -> str:
    """CRUN or RUNC: how a runtime binary is driven (crun in the foreground, runc detached), by its name."""
    return CRUN if os.path.basename(binary).startswith(CRUN) else RUNC


def crun_refusals(hybrid: Path = CGROUP_V2_HYBRID) -> list[str]:
    """Why crun cannot run containers on this host's cgroups (empty if it can): crun 1.8 refuses a hybrid
    layout (v1 hierarchies, and v2 at /sys/fs/cgroup/unified) whose v2 holds a controller. scripts/setup.sh
    mounts such a controller as a v1 hierarchy of its own, as systemd's hybrid layout does, which frees it."""
    try:
        held = (hybrid / "cgroup.controllers").read_text().split()
    except OSError:
        return []  # not hybrid: v1 alone, or v2 alone at /sys/fs/cgroup
    if held:
        return [f"crun refuses this host's hybrid cgroup layout: its cgroup v2 ({hybrid}) holds the "
                f"controllers {', '.join(held)} (mount each as a cgroup v1 hierarchy to free it, as "
                "scripts/setup.sh does)"]
    return []


def choose(wanted: str) -> tuple[str | None, list[str]]:
    """The runtime binary to use for `wanted` ('auto', 'crun', 'runc' or a path), or None and why not. 'auto'
    is crun where it is installed and can run here, else runc."""
    if wanted == "auto":
        if (crun := find(CRUN)) is not None and not crun_refusals():
            return crun, []
        wanted = RUNC
    binary = find(wanted)
    if binary is None:
        return None, [f"{wanted} is not installed (looked in {SYSTEM_PATH})"]
    if kind_of(binary) == CRUN and (why_not := crun_refusals()):
        return None, why_not
    return binary, []


class Runc:
    """crun or runc with one state directory (`--root`)."""

    def __init__(self, binary: str, root: Path):
        self.binary = binary
        self.root = root
        self.kind = kind_of(binary)

    def run_argv(self, container_id: str, bundle: Path, log: Path, pid_file: Path) -> list[str]:
        """How the keeper starts the container: crun in the foreground, runc detached (see keeper.py)."""
        return [self.binary, "--root", str(self.root), "--log", str(log), "--log-format", "json", "run",
                *(["--detach"] if self.kind == RUNC else []), "--bundle", str(bundle), "--pid-file", str(pid_file),
                container_id]

    def kill_argv(self, container_id: str) -> list[str]:
        return [self.binary, "--root", str(self.root), "kill", "--all", container_id, "KILL"]

    async def kill(self, container_id: str, signal_name: str) -> None:
        """Send the signal to every process of the container; a container that is gone is no error."""
        await self._call("kill", "--all", container_id, signal_name, missing_ok=True)

    async def delete(self, container_id: str) -> None:
        """Kill what is left of the container and forget it (its cgroup and state)."""
        await self._call("delete", "--force", container_id, missing_ok=True)

    async def list(self) -> list[str]:
        """The containers in the state directory."""
        if not self.root.exists():
            return []
        out = await self._call("list", "--format", "json")
        return [c["id"] for c in json.loads(out or "null") or []]

    async def _call(self, *args: str, missing_ok: bool = False) -> str:
        process = await asyncio.create_subprocess_exec(
            self.binary, "--root", str(self.root), *args, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env={"PATH": SYSTEM_PATH}, cwd="/")
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT_S):
                out, err = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuncError(f"{self.kind} {args[0]} took over {COMMAND_TIMEOUT_S:g} s") from None
        words = err.decode(errors="replace").strip()
        if process.returncode != 0:
            if missing_ok and _gone(words, self.root / args[-1]):
                return ""
            raise RuncError(f"{self.kind} {' '.join(args[:2])}: {words or f'exit code {process.returncode}'}")
        return out.decode(errors="replace")


def _gone(words: str, state_dir: Path) -> bool:
    """Whether a runtime's refusal says the container is not there (any more): runc's "does not exist", or
    crun's "cannot open directory" of its state when the container's own exit removed it meanwhile."""
    return "not exist" in words or ("No such file or directory" in words and f"'{state_dir}'" in words)


class KeptContainer:
    """A container the keeper started: its runtime's process (to kill if it is stuck) and, once it ended,
    the job's exit status (128 + the signal; the runtime's own if the container never started)."""

    def __init__(self, pid: int, pidfd: int, status_fd: int):
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._status_fd = status_fd
        self._ended = asyncio.get_running_loop().create_future()
        self._said = b""
        os.set_blocking(status_fd, False)
        asyncio.get_running_loop().add_reader(status_fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self._status_fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._said += data
            return
        asyncio.get_running_loop().remove_reader(self._status_fd)
        os.close(self._status_fd)
        os.close(self._pidfd)
        try:
            self.returncode = int(self._said.strip())
        except ValueError:
            self.returncode = 255  # the keeper died before it could say
        if not self._ended.done():
            self._ended.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._ended)

    def kill_runtime(self) -> None:
        """SIGKILL the runtime's process group (a runtime that is stuck), if it still runs."""
        if self.returncode is None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


class Keeper(HelperProcess):
    """The worker's keeper process (keeper.py), started from the event loop's thread (it dies with the thread
    that started it); `run` asks it to start a container, from several threads at once."""

    def __init__(self, proc: subprocess.Popen, requests: socket.socket):
        super().__init__(proc, requests)
        self._asking = threading.Lock()  # one request and its answer at a time

    @classmethod
    def start(cls) -> Keeper:
        try:
            return cls.spawn(KEEPER)
        except (OSError, subprocess.SubprocessError) as e:
            raise RuncError(f"could not start the containers' keeper: {e}") from e

    @property
    def alive(self) -> bool:
        """Whether it runs and answered every request so far. (Not whether its socket is readable: with
        attempts starting at once, an answer may be waiting there for the thread that asked.)"""
        return not self._failed and self._requests.fileno() >= 0 and self.proc.poll() is None

    async def run(self, runtime: Runc, container_id: str, bundle: Path, log: Path, pid_file: Path,
                  output_fd: int) -> KeptContainer:
        """Start the container, the job's stdout and stderr both on `output_fd`, its stdin /dev/null.
        Raises RuncError if the keeper failed (it is then killed, and its containers with it)."""
        request = {"argv": runtime.run_argv(container_id, bundle, log, pid_file), "detached": runtime.kind == RUNC,
                   "pid_file": str(pid_file), "kill": runtime.kill_argv(container_id)}
        status_read, status_write = os.pipe2(os.O_CLOEXEC)
        try:
            pid, pidfd = await asyncio.to_thread(self._ask, request, output_fd, status_write)
        except BaseException:
            os.close(status_read)
            raise
        finally:
            os.close(status_write)
        return KeptContainer(pid, pidfd, status_read)

    def _ask(self, request: dict, output_fd: int, status_fd: int) -> tuple[int, int]:
        with self._asking:
            try:
                number, reply, fds = self.ask(json.dumps({"n": self._count + 1, **request}).encode(),
                                              [output_fd, status_fd], 1)
            except OSError as e:  # a timeout too
                raise RuncError(f"the containers' keeper (pid {self.pid}) did not answer: {e}") from e
        said_number, _, answer = reply.decode("utf-8", "replace").partition(" ")
        word, _, detail = answer.partition(" ")
        if word == "started" and said_number == number and len(fds) == 1 and detail.isdigit():
            return int(detail), fds[0]
        for fd in fds:
            os.close(fd)
        if word == "error" and said_number == number:
            raise RuncError(f"the containers' keeper could not start it: {detail}")
        self.kill()
        raise RuncError(f"the containers' keeper (pid {self.pid}) " +
                        ("died" if not reply else f"answered {reply[:100]!r} to request {number}"))

    def discard(self) -> None:
        """Let a keeper that failed go: killed if it still runs (its containers are then killed by the
        runtime's cleanup, owner.py), its socket closed."""
        if self.proc.poll() is None:
            self.kill()
        self._requests.close()


def last_error(log: Path) -> str:
    """The runtime's last error in its JSON log, '' if none."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            return str(entry.get("msg", "")).strip()
    return ""


async def wait_until_running(container: KeptContainer, pid_file: Path) -> bool:
    """Wait until the job's process exists (the runtime wrote its pid file) or the job ended before (the
    runtime could not start it); whether it runs."""
    ended = asyncio.ensure_future(container.wait())
    try:
        delay = 0.001
        while not pid_file.exists():
            if (await asyncio.wait({ended}, timeout=delay))[0]:
                return pid_file.exists()
            delay = min(2 * delay, 0.005)  # a stat every 5 ms at most
        return True
    finally:
        ended.cancel()
