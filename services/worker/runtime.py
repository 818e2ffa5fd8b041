"""Running one attempt of a job: the `ContainerRuntime` interface and the
process runtime for development machines without a container runtime.

What an attempt's outcome means follows the protos: SUCCEEDED is exit 0 with
the outputs copied; FAILED is a non-zero exit, a kill by a signal we did not
send, running out of memory or timing out; ERROR is the system failing around
the command (a spec the runtime refuses, an input or output copy, a command
that cannot be started); CANCELLED is a stop asked for with `cancel`. End
reasons are `corral.batch.v1.AttemptEndReason` names without their prefix, in
lower case, as the driver stores them.
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol
from urllib.parse import urlsplit

import fsspec

from corral.batch.v1 import job_spec_pb2
from services.worker.logs import LogPipe, LogSink

EXITED = "exited"
OUT_OF_MEMORY = "out_of_memory"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
SYSTEM_ERROR = "system_error"

# What programs print when an allocation fails under RLIMIT_AS (Python, libc's
# strerror(ENOMEM), C++, the JVM, Go, R). The limit makes malloc fail rather
# than killing the process, so the log is the only witness we have.
_ALLOCATION_FAILURES = (b"memoryerror", b"cannot allocate memory", b"bad_alloc", b"outofmemoryerror",
                        b"out of memory", b"cannot allocate vector")


@dataclass(frozen=True)
class JobRun:
    """One attempt of a job, as a runtime needs it."""

    batch_id: int
    job_id: int
    attempt_id: str
    spec: job_spec_pb2.JobSpec
    cores_mcpu: int
    """Cores reserved for the attempt, in thousandths of a core."""
    memory_bytes: int
    """Memory reserved for the attempt (after any out-of-memory increase); 0 = no limit."""
    scratch: Path
    """The worker's scratch root; the attempt gets its own directory under it."""

    @property
    def attempt_dir(self) -> Path:
        """Directory of this attempt: `work/` (the job's cwd and HOME), `tmp/`, `main.log`."""
        return self.scratch / f"{self.batch_id}-{self.job_id}-{self.attempt_id}"

    @property
    def log_path(self) -> Path:
        """Where the main command's log is written while it runs."""
        return self.attempt_dir / "main.log"


@dataclass(frozen=True)
class JobOutcome:
    """How an attempt ended."""

    state: str
    """'Success', 'Failed', 'Error' or 'Cancelled' (the database's names)."""
    exit_code: int | None
    """Exit code of the command (128 + signal when a signal killed it); None if it never ran to an exit."""
    error_message: str
    """What went wrong, in words; empty on success."""
    start_time_ms: int | None
    """When the command started; None if it never did."""
    end_time_ms: int
    """When the attempt ended."""
    end_reason: str
    """An AttemptEndReason name in lower case: exited, out_of_memory, timed_out, cancelled, system_error."""
    isolation: str
    """How the job was (or was not) isolated, in words a user reads in the job's status."""
    peak_memory_bytes: int | None = None
    """Peak resident memory of the command's largest process, where the OS tells."""
    cpu_time_ms: int | None = None
    """CPU time (user + system) of the command and the children it waited for, where the OS tells."""


class ContainerRuntime(Protocol):
    """Runs attempts of jobs on this worker, one `run` call per attempt."""

    name: str
    """Short name for logs and status, e.g. 'process' or 'oci'."""
    isolates: bool
    """Whether jobs get their own filesystem, network and resource limits."""

    def check(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        """Why this runtime cannot honour `spec`; empty if it can."""
        ...

    def isolation(self, job: JobRun) -> str:
        """How `run` isolates this attempt, in words a user reads in the job's status."""
        ...

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        """Run the attempt to its end: copy inputs, run the command (its output into `log`, which is
        closed when the command ends), copy outputs. `on_started` gets the command's pid once it runs.
        Cancelling the calling task kills the command and everything it started."""
        ...

    async def cancel(self, attempt_id: str) -> None:
        """Ask a running attempt to stop; its `run` then returns Cancelled. No-op if not running."""
        ...


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class ProcessRuntimeConfig:
    """Settings of the process runtime."""

    kill_grace_s: float = 10.0
    """After SIGTERM on timeout or cancel, how long the job may take to exit before SIGKILL."""
    max_timeout_s: float | None = None
    """The deployment's longest attempt; applies when a spec sets no timeout or a longer one."""
    base_path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    """PATH the job starts with (a spec's env may override it); never the worker's own."""
    output_drain_s: float = 5.0
    """How long to keep reading output after the command's group was killed: a process that left
    the group (setsid) may hold the log pipe open, and we stop waiting for it."""
    keep_work_dirs: bool = False
    """Keep `work/` and `tmp/` of finished attempts (for debugging); the log is always kept."""
    clock_ms: Callable[[], int] = field(default=_wall_ms)
    """Wall clock for start and end times, in milliseconds since the epoch."""


class ProcessRuntime:
    """Runs the command as a plain subprocess of the worker: no image, no container.

    Each attempt gets a fresh working directory (also its HOME) under the scratch
    root, an environment of its own (never the worker's), its own process group
    so that a timeout or cancel kills everything it started, and, when it has a
    memory reservation, an RLIMIT_AS limit. RLIMIT_AS bounds each process's
    address space, not the tree's resident memory: it is an approximation that
    can refuse programs reserving much more than they touch (JVMs, Go) and lets
    a tree of processes use more in total. Running out of it makes allocations
    fail instead of killing the process, so out-of-memory is recognised from
    what the job printed last. Container paths of input and output files are
    rooted at the working directory ('/in/ref.fa' is 'in/ref.fa' there).
    Processes that leave the group with setsid escape the kill.
    """

    name = "process"
    isolates = False

    def __init__(self, config: ProcessRuntimeConfig | None = None):
        self.config = config or ProcessRuntimeConfig()
        self._stops: dict[str, asyncio.Event] = {}

    def check(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        """Refusals: what a plain process on a shared machine cannot honour."""
        reasons = []
        command = spec.WhichOneof("command")
        if command is None or (command == "argv" and not spec.argv.args) or (command == "script" and not spec.script):
            reasons.append("the spec has no command (argv or script)")
        if any("\0" in arg for arg in spec.argv.args) or "\0" in spec.script:
            reasons.append("the command contains a NUL byte")
        for name, value in spec.env.items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                reasons.append(f"environment variable {name!r} cannot be passed to a process")
        if spec.WhichOneof("size") == "machine_type":
            reasons.append(f"machine_type {spec.machine_type!r} asks for a job-private machine; "
                           "the process runtime runs jobs on this shared machine")
        if spec.secrets:
            reasons.append("secrets cannot be mounted: without a container the process runtime cannot keep "
                           "them private to the job")
        if spec.network_mode in (job_spec_pb2.NETWORK_MODE_NONE, job_spec_pb2.NETWORK_MODE_PRIVATE):
            mode = job_spec_pb2.NetworkMode.Name(spec.network_mode)
            reasons.append(f"network_mode {mode} cannot be enforced: the process runtime cannot isolate the "
                           "network, the job would share the worker's")
        for f in spec.input_files:
            reasons += _url_refusals("input", f.from_url) + _path_refusals("input to_path", f.to_path)
        for f in spec.output_files:
            reasons += _url_refusals("output", f.to_url) + _path_refusals("output from_path", f.from_path)
        return reasons

    def isolation(self, job: JobRun) -> str:
        """See `ContainerRuntime.isolation`: plainly, none."""
        return _isolation_note(job)

    async def cancel(self, attempt_id: str) -> None:
        """Ask the attempt to stop; returns at once, and `run` returns Cancelled once its processes are gone."""
        if (stop := self._stops.get(attempt_id)) is not None:
            stop.set()

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        """See `ContainerRuntime.run`."""
        if job.attempt_id in self._stops:
            raise ValueError(f"attempt {job.attempt_id} is already running")
        stop = self._stops[job.attempt_id] = asyncio.Event()
        try:
            return await self._run(job, log, on_started, stop)
        finally:
            del self._stops[job.attempt_id]
            log.close()
            if not self.config.keep_work_dirs:
                for sub in ("work", "tmp"):
                    await asyncio.to_thread(shutil.rmtree, job.attempt_dir / sub, True)

    async def _run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]],
                   stop: asyncio.Event) -> JobOutcome:
        if refusals := self.check(job.spec):
            return self._outcome(job, "Error", SYSTEM_ERROR,
                                 "the process runtime cannot run this job: " + "; ".join(refusals))
        try:
            work, tmp = await _prepare(job)
            if stop.is_set():
                return self._outcome(job, "Cancelled", CANCELLED, "cancelled before the command started")
            proc, read_fd = self._spawn(job, work, tmp)
        except _SystemError as e:
            return self._outcome(job, "Error", SYSTEM_ERROR, str(e))
        start_ms = self.config.clock_ms()
        timeout_s = _timeout_s(job.spec, self.config.max_timeout_s)
        ending, status, usage = await self._watch(_Child(proc), read_fd, log, on_started, stop, timeout_s)
        log.close()

        def ended(state: str, reason: str, message: str, exit_code: int | None = None) -> JobOutcome:
            return self._outcome(job, state, reason, message, exit_code=exit_code, start_ms=start_ms, usage=usage)

        if ending == CANCELLED:
            return ended("Cancelled", CANCELLED, "cancelled while running; its processes were killed")
        if ending == TIMED_OUT:
            return ended("Failed", TIMED_OUT, f"timed out after {timeout_s:g} s; its processes were killed")
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            try:
                await asyncio.to_thread(_copy_outputs, job.spec, work)
            except Exception as e:
                return ended("Error", SYSTEM_ERROR, f"copying output files failed: {e}", 0)
            return ended("Success", EXITED, "", 0)
        if code < 0:
            message, exit_code = f"killed by signal {_signal_name(-code)}", 128 - code
        else:
            message, exit_code = f"exited with code {code}", code
        if job.memory_bytes > 0 and _reports_allocation_failure(log):
            return ended("Failed", OUT_OF_MEMORY, f"ran out of memory: {message} after an allocation failed under "
                         f"its limit of {job.memory_bytes} bytes (an address-space limit per process, approximate)",
                         exit_code)
        return ended("Failed", EXITED, message, exit_code)

    def _spawn(self, job: JobRun, work: Path, tmp: Path) -> tuple[subprocess.Popen, int]:
        """Start the command in its own session and process group; its stdout and stderr share one pipe,
        whose read end is returned."""
        spec = job.spec
        argv = list(spec.argv.args) if spec.WhichOneof("command") == "argv" else ["/bin/sh", "-c", spec.script]
        env = {"PATH": self.config.base_path, "HOME": str(work), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
               **spec.env,
               "CORRAL_BATCH_ID": str(job.batch_id), "CORRAL_JOB_ID": str(job.job_id),
               "CORRAL_ATTEMPT_ID": job.attempt_id}
        read_fd, write_fd = os.pipe()
        try:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=write_fd,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_memory_limit(job.memory_bytes))
        except (OSError, subprocess.SubprocessError) as e:
            os.close(read_fd)
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise _SystemError(f"could not start {argv[0]!r}: {why}") from e
        finally:
            os.close(write_fd)
        return proc, read_fd

    async def _watch(self, child: _Child, read_fd: int, log: LogSink, on_started: Callable[[int], Awaitable[None]],
                     stop: asyncio.Event, timeout_s: float | None) -> tuple[str | None, int, resource.struct_rusage]:
        """Copy the command's output into the log until it ends; then nothing of its group is left.
        Returns how it was stopped (CANCELLED, TIMED_OUT or None), its wait status and resource usage."""
        pipe = None
        try:
            pipe = await LogPipe.attach(read_fd, log)
            await on_started(child.pid)
            ending = await self._supervise(child, stop, timeout_s)
            child.kill_group(signal.SIGKILL)  # what outlived the command, as when a container's init exits
            status, usage = await child.reap()
            await pipe.drain(self.config.output_drain_s)
            return ending, status, usage
        finally:
            if not child.reaped:  # on_started raised or our task was cancelled: leave nothing running
                child.kill_group(signal.SIGKILL)
                child.reap_now()
            if pipe is not None:
                pipe.close()

    async def _supervise(self, child: _Child, stop: asyncio.Event, timeout_s: float | None) -> str | None:
        """Wait for the command to exit, be cancelled or time out; stop it in the last two cases.
        Returns CANCELLED, TIMED_OUT or None (it exited by itself)."""
        exited = asyncio.ensure_future(child.exited())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({exited, stopped}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            if exited in done:
                return None
            child.kill_group(signal.SIGTERM)
            if not (await asyncio.wait({exited}, timeout=self.config.kill_grace_s))[0]:
                child.kill_group(signal.SIGKILL)
                await exited
            return CANCELLED if stopped in done else TIMED_OUT
        finally:
            exited.cancel()
            stopped.cancel()

    def _outcome(self, job: JobRun, state: str, reason: str, message: str, *, exit_code: int | None = None,
                 start_ms: int | None = None, usage: resource.struct_rusage | None = None) -> JobOutcome:
        return JobOutcome(
            state=state, exit_code=exit_code, error_message=message, start_time_ms=start_ms,
            end_time_ms=self.config.clock_ms(), end_reason=reason, isolation=_isolation_note(job),
            peak_memory_bytes=None if usage is None else _peak_rss_bytes(usage),
            cpu_time_ms=None if usage is None else round((usage.ru_utime + usage.ru_stime) * 1000))


class _SystemError(Exception):
    """The system failed around the command (state Error, end reason system_error)."""


async def _prepare(job: JobRun) -> tuple[Path, Path]:
    """Create the attempt's fresh working and temporary directories and copy its inputs in."""
    if not job.attempt_id or "/" in job.attempt_id or job.attempt_id in (".", ".."):
        raise _SystemError(f"attempt id {job.attempt_id!r} cannot name a directory")
    work, tmp = job.attempt_dir / "work", job.attempt_dir / "tmp"
    try:
        work.mkdir(parents=True)
        tmp.mkdir()
    except FileExistsError as e:
        raise _SystemError(f"attempt directory {job.attempt_dir} already exists") from e
    try:
        await asyncio.to_thread(_copy_inputs, job.spec, work)
    except Exception as e:
        raise _SystemError(f"copying input files failed: {e}") from e
    return work, tmp


class _Child:
    """A started command: the leader of its own process group."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pid = proc.pid
        self.reaped = False
        self._result: tuple[int, resource.struct_rusage] | None = None

    async def exited(self) -> None:
        """Return once the leader has exited, leaving it unreaped where the OS allows (a zombie's pid,
        and so its group id, cannot be reused while we still signal the group)."""
        try:
            fd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            if hasattr(os, "waitid"):
                await asyncio.to_thread(os.waitid, os.P_PID, self.pid, os.WEXITED | os.WNOWAIT)
                return
            # E.g. macOS before Python 3.13: reap here, polling so that a cancel never loses the result
            # to a thread; kill_group then has a small pid-reuse window.
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

    def kill_group(self, sig: int) -> None:
        """Send `sig` to every process still in the command's group."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):  # group empty (macOS says EPERM when only zombies remain)
            pass

    async def reap(self) -> tuple[int, resource.struct_rusage]:
        """Wait status and resource usage of the exited leader."""
        if self._result is None:
            self._result = (await asyncio.to_thread(os.wait4, self.pid, 0))[1:]
        return self._finish()

    def reap_now(self) -> tuple[int, resource.struct_rusage]:
        """`reap`, blocking: only for a leader just sent SIGKILL, which exits at once."""
        if self._result is None:
            self._result = os.wait4(self.pid, 0)[1:]
        return self._finish()

    def _finish(self) -> tuple[int, resource.struct_rusage]:
        assert self._result is not None
        # Popen must know the child is gone, or it would warn and try to reap its pid again later.
        self.proc.returncode = os.waitstatus_to_exitcode(self._result[0])
        self.reaped = True
        return self._result


def _isolation_note(job: JobRun) -> str:
    memory = (f"; memory limited only approximately, to {job.memory_bytes} bytes of address space per process"
              if job.memory_bytes > 0 else "; memory not limited")
    return (f"process runtime: no container isolated this job. The image {job.spec.image!r} was ignored and the "
            "command ran as a plain process of the worker, on its filesystem and network, with no cpu or "
            f"disk limit{memory}.")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _memory_limit(memory_bytes: int) -> Callable[[], None] | None:
    """A preexec hook setting RLIMIT_AS, or None (no hook lets subprocess use vfork)."""
    if memory_bytes <= 0:
        return None
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _timeout_s(spec: job_spec_pb2.JobSpec, max_timeout_s: float | None) -> float | None:
    asked = spec.timeout.ToTimedelta().total_seconds() if spec.HasField("timeout") else 0.0
    if asked <= 0:
        return max_timeout_s
    return asked if max_timeout_s is None else min(asked, max_timeout_s)


def _peak_rss_bytes(usage: resource.struct_rusage) -> int:
    return usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024  # Linux reports KiB


def _reports_allocation_failure(log: LogSink) -> bool:
    size = log.path.stat().st_size if log.path.exists() else 0
    last = log.read(max(0, size - 8192)).lower()
    return any(marker in last for marker in _ALLOCATION_FAILURES)


def _url_refusals(what: str, url: str) -> list[str]:
    parts = urlsplit(url)
    if parts.scheme != "file" or parts.netloc:
        return [f"{what} URL {url!r} is not a local file:// URL; the process runtime copies only those"]
    return []


def _path_refusals(what: str, path: str) -> list[str]:
    p = PurePosixPath(path)
    if not p.is_absolute() or ".." in p.parts or p == PurePosixPath("/"):
        return [f"{what} {path!r} must be an absolute path below / without '..'"]
    return []


def _host_path(work: Path, container_path: str) -> Path:
    """Where a container path lives for the process runtime: below the working directory."""
    return work / posixpath.normpath(container_path).lstrip("/")


def _copy_inputs(spec: job_spec_pb2.JobSpec, work: Path) -> None:
    for f in spec.input_files:
        fs, remote = fsspec.core.url_to_fs(f.from_url)
        dest = _host_path(work, f.to_path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            if fs.isdir(remote):  # a trailing slash copies the contents, the same on every copy
                fs.get(remote.rstrip("/") + "/", str(dest), recursive=True)
            else:
                fs.get_file(remote, str(dest))
        except Exception as e:
            raise RuntimeError(f"{f.from_url} -> {f.to_path}: {e}") from e


def _copy_outputs(spec: job_spec_pb2.JobSpec, work: Path) -> None:
    for f in spec.output_files:
        source = _host_path(work, f.from_path)
        try:
            if not source.exists():
                raise FileNotFoundError(f"{f.from_path} does not exist")
            fs, remote = fsspec.core.url_to_fs(f.to_url)
            fs.makedirs(posixpath.dirname(remote.rstrip("/")) or "/", exist_ok=True)
            if source.is_dir():
                fs.put(str(source) + "/", remote, recursive=True)
            else:
                fs.put_file(str(source), remote)
        except Exception as e:
            raise RuntimeError(f"{f.from_path} -> {f.to_url}: {e}") from e
