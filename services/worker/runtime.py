"""The process runtime: attempts run as processes of the worker's machine, for
machines without a container runtime. (The interface every runtime follows,
and what outcomes mean, are in runtime_api.py; its names are here too.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import stat
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from corral.batch.v1 import job_spec_pb2
from services.policy.sizes import binary_size
from services.worker.attempt_limits import AttemptLimits
from services.worker.disk import is_full, out_of_space, ran_out, reports_out_of_space
from services.worker.job_files import (UrlCheck, allow_all_urls, copy_inputs, copy_outputs,
                                       copy_outputs_after_failure, give_to, make_directory_beneath,
                                       path_refusals, url_refusals)
from services.worker.job_process import Ended, IsolatedCommand, Isolation, Launcher, PlainCommand, StartFailed
from services.worker.job_uids import JobUids, NoFreeUid, UidClaim
from services.worker.logs import LogPipe, LogSink
from services.worker.object_stores import ObjectStores
from services.worker.oci.cgroups import AttemptCgroup, CgroupError
from services.worker.process_cgroups import ProcessCgroups
from services.worker.runtime_api import (CANCELLED, EXITED, OUT_OF_MEMORY, REFUSED, SYSTEM_ERROR, TIMED_OUT,
                                         ContainerRuntime, JobOutcome, JobRun, attempt_timeout_s, command_refusals,
                                         signal_name)
from services.worker.secret_files import place_secrets, remove_secret_dirs
from services.common.usage_series import UsageReading

__all__ = ["CANCELLED", "EXITED", "OUT_OF_MEMORY", "REFUSED", "SYSTEM_ERROR", "TIMED_OUT", "ContainerRuntime",
           "JobOutcome", "JobRun", "ProcessRuntime", "ProcessRuntimeConfig", "can_isolate"]

logger = logging.getLogger(__name__)

# What programs print when an allocation fails under RLIMIT_AS (Python, libc's
# strerror(ENOMEM), C++, the JVM, Go, R). The limit makes malloc fail rather
# than killing the process, so the log is the only witness we have.
_ALLOCATION_FAILURES = (b"memoryerror", b"cannot allocate memory", b"bad_alloc", b"outofmemoryerror",
                        b"out of memory", b"cannot allocate vector")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def can_isolate() -> bool:
    """Whether this worker can run jobs as users of their own in namespaces of their own (root on Linux)."""
    return sys.platform == "linux" and os.geteuid() == 0


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
    """How long to keep reading output after the command ended and its processes were killed (unisolated,
    a process that left the group with setsid may hold the log pipe open; we stop waiting for it)."""
    keep_work_dirs: bool = False
    """Keep `work/` and `tmp/` of finished attempts (for debugging); the log is always kept."""
    clock_ms: Callable[[], int] = field(default=_wall_ms)
    """Wall clock for start and end times, in milliseconds since the epoch."""
    allow_unisolated: bool = False
    """Where jobs cannot be isolated (the worker is not root, or not on Linux), run them anyway as the
    worker's own user, unisolated (development only; each attempt's isolation note says so). Without it
    such a worker ends every job in Error saying why."""
    uid_first: int = 2_000_000_000
    """First uid (and gid) given to jobs; each running attempt on the host has its own."""
    uid_count: int = 65_536
    """How many uids from `uid_first` jobs may have: the most attempts running at once on this host."""
    uid_claims_dir: Path = Path("/run/corral/job-uids")
    """Where the workers of this host claim uids (a locked file per uid in use): one directory for all."""
    max_processes: int = 4096
    """Most processes (threads included) one attempt may have at once (RLIMIT_NPROC of its uid, and its
    cgroup's pids.max: its cores' share of the worker's cap, at most this; services/worker/host_limits.py)."""
    owner: str = ""
    """The worker's name on this host (its instance name): names its cgroup; '' a name of its own."""
    deployment: str = "default"
    """The deployment's name on this host: the cgroup level above its workers' (worker_cgroup.py)."""
    cgroup_root: str = "corral"
    """Attempts' cgroups are CGROUP_ROOT/DEPLOYMENT/OWNER/ATTEMPT in the pids hierarchy."""
    cgroup_claims_dir: Path = Path("/run/corral/process-cgroups")
    """Where the process runtimes of this host claim their cgroups (a locked file each; worker_cgroup.py)."""
    cores_mcpu: int = 0
    """The cores the worker offers, in thousandths (its process cap and each attempt's share come from them);
    0: the host's cpus."""
    max_processes_per_core: int = 1024
    """The worker's cgroup's pids.max is `max_processes_base` + this x its cores."""
    max_processes_base: int = 1024
    deployment_max_processes: int = 0
    """pids.max of the deployment's cgroup; 0: half of the host's kernel.pid_max."""
    process_check_interval_s: float = 0.5
    """How often a running attempt's cgroup is read for a fork refused at its cap (it is then killed)."""
    storage_check_interval_s: float = 1.0
    """How often a running attempt's work and tmp directories are measured against its storage request (it is
    killed past it); each file is also held to that size by RLIMIT_FSIZE."""
    private_dirs: tuple[str, ...] = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
    """World-writable directories of the host that each job sees as an empty tmpfs of its own."""
    private_dir_bytes: int = 256 * 2**20
    """Size of each of those tmpfs, in bytes of memory (TMPDIR is on disk, in the attempt's directory)."""
    check_url: UrlCheck = allow_all_urls
    """Called with every input and output URL before its copy; raises to refuse it (the deployment's
    storage policy). The default allows every URL."""
    object_stores: ObjectStores = field(default_factory=ObjectStores)
    """How input and output files are reached: the local disk, and object stores with the deployment's
    endpoints and credentials (by default, the storage libraries' own)."""


class ProcessRuntime:
    """Runs the command as processes of the worker's machine: no image, no container.

    Isolated (the worker is root on Linux): each attempt runs as a uid and gid
    of its own (see `JobUids`), with no supplementary group, no capability
    and no_new_privs, in its own PID, mount, IPC and UTS namespaces, and in
    its own network namespace with only loopback for network_mode NONE
    (PUBLIC shares the host's network; PRIVATE is refused). It sees a fresh
    /proc (its own processes only), fresh private /tmp, /var/tmp, /dev/shm
    and /run/lock, and nothing of the worker's scratch root but its own
    `work/` (cwd and HOME) and `tmp/` (TMPDIR), 0700 and its own; the log is
    written by the worker from a pipe. The whole tree dies with the
    attempt, and with the worker. The worker never forks for it: its job
    launcher (launcher.py, one root helper process started on first use and
    again if it dies) forks each attempt; see jobinit.py for what the
    attempt's processes do.

    Unisolated (only with `allow_unisolated`): a plain child of the worker
    in its own process group, as the worker's user, started without running
    Python between fork and exec (its memory limit is set by util-linux's
    `prlimit`, which then execs the command).

    Either way the environment is the job's own (never the worker's), and a
    memory reservation sets RLIMIT_AS: it bounds each process's address
    space, not the tree's resident memory, an approximation that can refuse
    programs reserving much more than they touch (JVMs, Go) and lets a tree
    of processes use more in total. Running out of it makes allocations fail
    instead of killing the process, so out-of-memory is recognised from what
    the job printed last. Isolated, its processes are in a cgroup of their
    own (process_cgroups.py) whose pids.max is its cores' share of its
    worker's; a job that reaches it is killed and ends Failed saying so. Its
    work and tmp directories may hold at most its storage request (measured
    while it runs; each file held to it by RLIMIT_FSIZE: host_limits.py).
    There is no cpu limit; a job that runs the scratch disk out of space
    ends in Error naming it (see disk.py). Container paths of
    input and output files, and secrets' mount paths, are rooted at the working
    directory ('/in/ref.fa' is 'in/ref.fa' there). A secret is a directory of the
    attempt's own (0500, its files 0400, the job's uid's: secret_files.py),
    mounted read-only at its mount path in the job's mount namespace, and removed
    when the attempt ends; unisolated, secrets are refused (the job would run as
    the worker's user, able to read every attempt's).
    """

    name = "process"
    isolates = False
    usage_note = ("the process runtime does not sample a job while it runs: the series holds only the "
                  "end-of-attempt reading, the rusage of the command and the children it waited for (cpu time; "
                  "peak memory of its largest process, not of all together); no current memory and no I/O")

    def __init__(self, config: ProcessRuntimeConfig | None = None):
        self.config = config or ProcessRuntimeConfig()
        self._stops: dict[str, asyncio.Event] = {}
        self._uids = JobUids(self.config.uid_claims_dir, self.config.uid_first, self.config.uid_count)
        self._launcher: Launcher | None = None
        c = self.config
        self.cgroups = ProcessCgroups(c.cgroup_claims_dir, c.cgroup_root, c.deployment,
                                      c.owner or f"process-{uuid.uuid4().hex[:8]}",
                                      c.cores_mcpu or 1000 * (os.cpu_count() or 1), c.max_processes_per_core,
                                      c.max_processes_base, c.max_processes, c.deployment_max_processes)
        """The worker's and its attempts' cgroups (made when the first isolated attempt runs)."""

    @property
    def launcher_pid(self) -> int | None:
        """The pid of the job launcher, while there is one (isolated attempts start it on first use)."""
        return self._launcher.pid if self._launcher is not None and self._launcher.alive else None

    async def close(self) -> None:
        """Stop the job launcher, if any: call it once no attempt runs (one still running would die with
        it). A later attempt starts a new one."""
        if self._launcher is not None:
            launcher, self._launcher = self._launcher, None
            await asyncio.to_thread(launcher.close)
        if not self._stops:
            await asyncio.to_thread(self.cgroups.close)

    def check(self, spec: job_spec_pb2.JobSpec) -> list[str]:
        """Refusals: what this runtime cannot honour on this machine."""
        reasons = []
        isolated = can_isolate()
        if not isolated and not self.config.allow_unisolated:
            reasons.append(f"the process runtime runs each job as a user of its own, which needs a worker running "
                           f"as root on Linux (this one runs as uid {os.geteuid()} on {sys.platform}); run the "
                           "worker as root, or with --unisolated-dev to run jobs unisolated as the worker's own "
                           "user (development only)")
        reasons += command_refusals(spec)
        if spec.WhichOneof("size") == "machine_type":
            reasons.append(f"machine_type {spec.machine_type!r} asks for a job-private machine; "
                           "the process runtime runs jobs on this shared machine")
        if spec.secrets and not isolated:
            reasons.append("secrets cannot be mounted: the unisolated process runtime runs jobs as the worker's "
                           "own user, who can read every attempt's secrets")
        for mount in spec.secrets:
            reasons += path_refusals(f"secret {mount.name!r} mount_path", mount.mount_path)
        mode = job_spec_pb2.NetworkMode.Name(spec.network_mode)
        if spec.network_mode == job_spec_pb2.NETWORK_MODE_PRIVATE:
            reasons.append(f"network_mode {mode} cannot be enforced: the process runtime offers NETWORK_MODE_NONE "
                           "(loopback only) or NETWORK_MODE_PUBLIC (the host's network), no private network")
        elif spec.network_mode == job_spec_pb2.NETWORK_MODE_NONE and not isolated:
            reasons.append(f"network_mode {mode} cannot be enforced: the unisolated process runtime cannot isolate "
                           "the network, the job would share the worker's")
        for f in spec.input_files:
            reasons += url_refusals("input", f.from_url) + path_refusals("input to_path", f.to_path)
        for f in spec.output_files:
            reasons += url_refusals("output", f.to_url) + path_refusals("output from_path", f.from_path)
        return reasons

    def image_digest(self, job: JobRun) -> str:
        """See `ContainerRuntime.image_digest`: this runtime pulls no image."""
        return ""

    def isolation(self, job: JobRun) -> str:
        """See `ContainerRuntime.isolation`: what is and is not isolated, plainly."""
        memory = (f"; memory limited only approximately, to {job.memory_bytes} bytes of address space per process"
                  if job.memory_bytes > 0 else "; memory not limited")
        image = f"no container isolated this job: the image {job.spec.image!r} was ignored"
        if not can_isolate() and not self.config.allow_unisolated:
            return ("process runtime: the job did not run; this worker cannot isolate jobs (it is not root) and "
                    "is not allowed to run them unisolated")
        if not can_isolate():
            return (f"process runtime, UNISOLATED (development mode): {image} and the command ran as a plain "
                    "process of the worker, as the worker's own user, on its filesystem and network; it could "
                    "read and change whatever the worker can, its keys and other jobs' files included. No cpu or "
                    f"disk limit{memory}.")
        network = ("none but its own loopback" if job.spec.network_mode == job_spec_pb2.NETWORK_MODE_NONE
                   else "the host's, shared with the worker and other jobs")
        processes = (f"at most {self.config.max_processes} processes and threads (its user's; "
                     f"{self.cgroups.why_not})" if self.cgroups.why_not else
                     f"at most {self.cgroups.attempt_max_processes(job.cores_mcpu)} processes and threads (its "
                     f"worker's {self.cgroups.max_processes} shared out by cores)")
        return (f"process runtime: {image} and the command ran with the worker machine's own programs. It ran "
                "as a user of its own (not root, no capabilities, no other running job shares it) in namespaces "
                "of its own: it saw only its own processes, its own working directory and private /tmp, "
                "/var/tmp and /dev/shm, none of the worker's files, and the rest of the host's files as any "
                f"unprivileged user does; network: {network}. Shared with the host: the kernel. No cpu limit; "
                f"{processes}; {_storage_note(job, self.config.storage_check_interval_s)}{memory}."
                f"{_secrets_note(job)}")

    def sample(self, attempt_id: str) -> UsageReading | None:
        """See `ContainerRuntime.sample`: nothing (see `usage_note`). The job's processes' cgroup has the pids
        controller alone (no cpu or memory counters) and, isolated, they are in a PID namespace the worker does not
        walk; rusage comes only at their end."""
        return None

    async def cancel(self, attempt_id: str) -> None:
        """Ask the attempt to stop; returns at once, and `run` returns Cancelled once its processes are gone."""
        if (stop := self._stops.get(attempt_id)) is not None:
            stop.set()

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        """See `ContainerRuntime.run`."""
        if job.attempt_id in self._stops:
            raise ValueError(f"attempt {job.attempt_id} is already running")
        stop = self._stops[job.attempt_id] = asyncio.Event()
        async with contextlib.AsyncExitStack() as cleanup:  # undone in reverse: directories, uid, log
            cleanup.callback(self._stops.pop, job.attempt_id)
            cleanup.callback(log.close)
            try:
                return await self._run(job, log, on_started, stop, cleanup)
            except OSError as e:  # e.g. the log could not be written: said before the directories go
                if not out_of_space(e):
                    raise
                return self._outcome(job, "Error", SYSTEM_ERROR, f"{ran_out(job.attempt_dir)}: {e}")
        raise AssertionError("unreachable")

    async def _run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]],
                   stop: asyncio.Event, cleanup: contextlib.AsyncExitStack) -> JobOutcome:
        if refusals := self.check(job.spec):
            return self._outcome(job, "Error", REFUSED,
                                 "the process runtime cannot run this job: " + "; ".join(refusals))
        isolated = can_isolate()
        try:
            if isolated:
                claim = await self._claim_uid()
                cleanup.callback(claim.release)  # after the directories are gone; its processes are by then
                uid = gid = claim.uid
            else:
                uid, gid = os.getuid(), os.getgid()
            cleanup.push_async_callback(self._remove_work_dirs, job)
            work, tmp = await self._prepare(job, uid if isolated else None, gid)
            binds = await self._write_secrets(job, work, uid, gid, cleanup)
            cgroup = await self._cgroup(job, cleanup) if isolated else None
            limits = AttemptLimits(cgroup, max(0, job.storage_bytes), (work, tmp), None,
                                   "its processes were killed", self.config.process_check_interval_s,
                                   self.config.storage_check_interval_s, job.cores_mcpu,
                                   self.cgroups.cores_mcpu) if isolated else None
            if stop.is_set():
                return self._outcome(job, "Cancelled", CANCELLED, "cancelled before the command started")
            read_fd, write_fd = os.pipe()
            try:
                command = self._start(job, work, tmp, write_fd, uid, gid, isolated, binds, cgroup)
            except BaseException:
                os.close(read_fd)
                raise
            finally:
                os.close(write_fd)
        except (_SystemError, NoFreeUid, StartFailed) as e:
            words = f"{ran_out(job.attempt_dir)}: {e}" if out_of_space(e) else str(e)
            return self._outcome(job, "Error", SYSTEM_ERROR, words)
        timeout_s = attempt_timeout_s(job.spec, self.config.max_timeout_s)
        try:
            start_ms, ending, ended = await self._watch(command, read_fd, log, on_started, stop, timeout_s,
                                                        limits)
        except StartFailed as e:
            return self._outcome(job, "Error", SYSTEM_ERROR, str(e))
        log.close()

        def outcome(state: str, reason: str, message: str, exit_code: int | None = None) -> JobOutcome:
            return self._outcome(job, state, reason, message, exit_code=exit_code, start_ms=start_ms, ended=ended)

        async def failed(reason: str, message: str, exit_code: int | None = None) -> JobOutcome:
            message += await copy_outputs_after_failure(job.spec, work, uid, self.config.check_url,
                                                        stores=self.config.object_stores)
            return outcome("Failed", reason, message, exit_code)

        if ending == CANCELLED:
            return outcome("Cancelled", CANCELLED, "cancelled while running; its processes were killed")
        if ending == TIMED_OUT:
            return await failed(TIMED_OUT, f"timed out after {timeout_s:g} s; its processes were killed")
        if ending is not None:  # the limit watch's words: it hit its process limit, or wrote past its storage
            return await failed(EXITED, ending, None if ended is None else _exit_code(ended.wait_status))
        if ended is None and isinstance(command, IsolatedCommand) and not command.launcher.alive:
            return outcome("Error", SYSTEM_ERROR, f"the worker's job launcher (pid {command.launcher.pid}) died "
                           "while the job ran, and its processes with it")
        if ended is None:
            return outcome("Error", SYSTEM_ERROR, "the job's init ended without reporting how the command ended")
        code = os.waitstatus_to_exitcode(ended.wait_status)
        if code < 0:
            message, exit_code = f"killed by signal {signal_name(-code)}", 128 - code
        else:
            message, exit_code = f"exited with code {code}", code
        at_a_limit = None if limits is None else await asyncio.to_thread(limits.at_end, exit_code, message)
        if at_a_limit is not None:
            state, words = at_a_limit
            if state == "Failed":
                return await failed(EXITED, words, exit_code)
            return outcome(state, SYSTEM_ERROR, words, exit_code)
        if code == 0:
            try:
                await asyncio.to_thread(copy_outputs, job.spec, work, uid, self.config.check_url,
                                        stores=self.config.object_stores)
            except Exception as e:
                return outcome("Error", SYSTEM_ERROR, f"copying output files failed: {e}", 0)
            return outcome("Success", EXITED, "", 0)
        if is_full(work) or reports_out_of_space(log.recent) or (
                log.write_error is not None and out_of_space(log.write_error)):
            return outcome("Error", SYSTEM_ERROR, f"{ran_out(work)}; the command {message}", exit_code)
        if job.memory_bytes > 0 and _reports_allocation_failure(log):
            return await failed(OUT_OF_MEMORY, f"ran out of memory: {message} after an allocation failed under "
                                f"its limit of {job.memory_bytes} bytes (an address-space limit per process, "
                                "approximate)", exit_code)
        return await failed(EXITED, message, exit_code)

    async def _claim_uid(self) -> UidClaim:
        """A uid of its own for the attempt (the claim looks through /proc: in a thread). Should our task be
        cancelled meanwhile, the claim the thread still makes is released."""
        claiming = asyncio.ensure_future(asyncio.to_thread(self._uids.claim))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            claiming.add_done_callback(
                lambda f: f.cancelled() or f.exception() is not None or f.result().release())
            raise

    async def _prepare(self, job: JobRun, uid: int | None, gid: int) -> tuple[Path, Path]:
        """Create the attempt's fresh working and temporary directories, private to the worker on the way
        (0700), copy its inputs in, and give both to the job's user (`uid`; None: the worker's own)."""
        if not job.attempt_id or "/" in job.attempt_id or job.attempt_id in (".", ".."):
            raise _SystemError(f"attempt id {job.attempt_id!r} cannot name a directory")
        scratch = Path(os.path.realpath(job.scratch))
        attempt_dir = scratch / job.attempt_dir.name
        work, tmp = attempt_dir / "work", attempt_dir / "tmp"
        try:
            scratch.mkdir(mode=0o700, parents=True, exist_ok=True)
            if scratch.stat().st_mode & (stat.S_ISVTX | stat.S_IWOTH):
                raise _SystemError(f"the scratch root {scratch} is shared with other users; the worker needs a "
                                   "directory of its own")
            scratch.chmod(0o700)
            attempt_dir.mkdir(mode=0o700, exist_ok=True)  # the log may have made it already
            attempt_dir.chmod(0o700)
            work.mkdir(mode=0o700)
            tmp.mkdir(mode=0o700)
        except FileExistsError as e:
            raise _SystemError(f"attempt directory {attempt_dir} already exists") from e
        except OSError as e:
            raise _SystemError(f"could not make the attempt's directories: {e}") from e
        try:
            await asyncio.to_thread(copy_inputs, job.spec, work, self.config.check_url,
                                    stores=self.config.object_stores)
        except Exception as e:
            raise _SystemError(f"copying input files failed: {e}") from e
        try:
            for secret in job.secrets:  # the mount points, before the job's user is given everything below work/
                await asyncio.to_thread(make_directory_beneath, work, secret.mount_path)
        except Exception as e:
            raise _SystemError(f"could not make the mount points of the job's secrets: {e}") from e
        try:
            if uid is not None:
                await asyncio.to_thread(give_to, work, uid, gid)
                await asyncio.to_thread(give_to, tmp, uid, gid)
        except Exception as e:
            raise _SystemError(f"could not give the job its directories: {e}") from e
        return work, tmp

    async def _write_secrets(self, job: JobRun, work: Path, uid: int, gid: int,
                             cleanup: contextlib.AsyncExitStack) -> tuple[tuple[str, str], ...]:
        """The attempt's secrets in place (secret_files.place_secrets), removed when the attempt ends whatever
        `keep_work_dirs` says; returns the read-only binds that mount them."""
        if not job.secrets:
            return ()
        secrets_dir = work.parent / "secrets"
        cleanup.push_async_callback(asyncio.to_thread, remove_secret_dirs, secrets_dir)
        try:
            return await asyncio.to_thread(place_secrets, job.secrets, secrets_dir, work, uid, gid)
        except Exception as e:  # the message names a path or a file, never what a file holds
            raise _SystemError(f"could not put the job's secrets in place: {e}") from e

    async def _cgroup(self, job: JobRun, cleanup: contextlib.AsyncExitStack) -> AttemptCgroup | None:
        """The attempt's cgroup with its process cap (None where the worker has no cgroups), removed when the
        attempt ends (whatever is left in it killed)."""
        if not self.cgroups.started:
            await asyncio.to_thread(self.cgroups.start)
        try:
            cgroup = await asyncio.to_thread(self.cgroups.attempt, job.attempt_dir.name, job.cores_mcpu)
        except CgroupError as e:
            raise _SystemError(str(e)) from e
        if cgroup is not None:
            cleanup.push_async_callback(self._remove_cgroup, cgroup)
        return cgroup

    async def _remove_cgroup(self, cgroup: AttemptCgroup) -> None:
        for what in await asyncio.to_thread(self.cgroups.remove, cgroup):
            logger.warning("could not clean up %s", what)

    def _start(self, job: JobRun, work: Path, tmp: Path, output_fd: int, uid: int, gid: int,
               isolated: bool, binds: tuple[tuple[str, str], ...] = (),
               cgroup: AttemptCgroup | None = None) -> IsolatedCommand | PlainCommand:
        """Start the command, its stdout and stderr on `output_fd`. Runs in the event loop's thread (see
        `Launcher.start`)."""
        spec = job.spec
        argv = list(spec.argv.args) if spec.WhichOneof("command") == "argv" else ["/bin/sh", "-c", spec.script]
        env = {"PATH": self.config.base_path, "HOME": str(work), "TMPDIR": str(tmp), "LANG": "C.UTF-8",
               **spec.env,
               "CORRAL_BATCH_ID": str(job.batch_id), "CORRAL_JOB_ID": str(job.job_id),
               "CORRAL_ATTEMPT_ID": job.attempt_id}
        if not isolated:
            return PlainCommand.start(argv, env, work, output_fd, _address_space_limit(job.memory_bytes))
        isolation = Isolation(
            uid=uid, gid=gid, hostname=f"job-{job.batch_id}-{job.job_id}",
            network_none=spec.network_mode == job_spec_pb2.NETWORK_MODE_NONE, cover=_cover(work),
            reveal=(str(work), str(tmp)), private_dirs=self.config.private_dirs,
            private_dir_bytes=self.config.private_dir_bytes, max_processes=self.config.max_processes,
            read_only_binds=binds, max_file_bytes=max(0, job.storage_bytes),
            cgroup_procs=str(cgroup.dir("pids") / "cgroup.procs") if cgroup is not None else "")
        return IsolatedCommand.start(self._running_launcher(), argv, env, work, output_fd, job.memory_bytes,
                                     isolation)

    def _running_launcher(self) -> Launcher:
        """The job launcher; a new one if there is none yet or the last one died (its attempts ended in
        Error then, each saying so)."""
        if self._launcher is not None and not self._launcher.alive:
            logger.warning("the job launcher (pid %d) died: %s; starting a new one", self._launcher.pid,
                           _signal_or_code(self._launcher.proc.returncode))
            self._launcher.close()
            self._launcher = None
        if self._launcher is None:
            self._launcher = Launcher.start()
            logger.info("job launcher started (pid %d)", self._launcher.pid)
        return self._launcher

    async def _watch(self, command: IsolatedCommand | PlainCommand, read_fd: int, log: LogSink,
                     on_started: Callable[[int], Awaitable[None]], stop: asyncio.Event,
                     timeout_s: float | None, limits: AttemptLimits | None) -> tuple[int, str | None, Ended | None]:
        """Copy the command's output into the log until it ends; then none of its processes is left.
        Returns when it started, how it was stopped (CANCELLED, TIMED_OUT, the limit watch's words or None)
        and how it ended. Raises StartFailed if it never started."""
        pipe = None
        try:
            pipe = await LogPipe.attach(read_fd, log)
            pid = await command.started()
            start_ms = self.config.clock_ms()
            await on_started(pid)
            ending = await self._supervise(command, stop, timeout_s, limits)
            command.signal(signal.SIGKILL)  # what outlived the command, as when a container's init exits
            await command.reap()
            await pipe.drain(self.config.output_drain_s)
            return start_ms, ending, command.ended()
        finally:
            if not command.reaped:  # it never started, on_started raised or our task was cancelled
                command.signal(signal.SIGKILL)
                command.reap_now()
            command.close()
            if pipe is not None:
                pipe.close()

    async def _supervise(self, command: IsolatedCommand | PlainCommand, stop: asyncio.Event,
                         timeout_s: float | None, limits: AttemptLimits | None = None) -> str | None:
        """Wait for the command to exit, be cancelled, time out or pass a limit; stop it in the last three
        cases (a limit passed: at once, with SIGKILL). Returns CANCELLED, TIMED_OUT, the limit watch's words
        or None (it exited by itself)."""
        exited = asyncio.ensure_future(command.exited())
        stopped = asyncio.ensure_future(stop.wait())
        over = asyncio.ensure_future(limits.watch().run() if limits is not None else asyncio.Event().wait())
        try:
            done, _ = await asyncio.wait({exited, stopped, over}, timeout=timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            if exited in done:
                return None
            if over in done:
                command.signal(signal.SIGKILL)
                await exited
                return str(over.result())
            command.signal(signal.SIGTERM)
            if not (await asyncio.wait({exited}, timeout=self.config.kill_grace_s))[0]:
                command.signal(signal.SIGKILL)
                await exited
            return CANCELLED if stopped in done else TIMED_OUT
        finally:
            exited.cancel()
            stopped.cancel()
            over.cancel()

    async def _remove_work_dirs(self, job: JobRun) -> None:
        if not self.config.keep_work_dirs:
            for sub in ("work", "tmp"):
                await asyncio.to_thread(shutil.rmtree, job.attempt_dir / sub, True)

    def _outcome(self, job: JobRun, state: str, reason: str, message: str, *, exit_code: int | None = None,
                 start_ms: int | None = None, ended: Ended | None = None) -> JobOutcome:
        return JobOutcome(
            state=state, exit_code=exit_code, error_message=message, start_time_ms=start_ms,
            end_time_ms=self.config.clock_ms(), end_reason=reason, isolation=self.isolation(job),
            peak_memory_bytes=None if ended is None else ended.peak_memory_bytes,
            cpu_time_ms=None if ended is None else ended.cpu_time_ms)


class _SystemError(Exception):
    """The system failed around the command (state Error, end reason system_error)."""


def _cover(work: Path) -> str:
    """What the job must not see of the worker's files: the highest directory on the way to `work` that
    others may not pass through (there is one: the scratch root is 0700). The job's view puts an empty
    tmpfs over it and shows only the attempt's own directories inside."""
    path = Path("/")
    for part in work.parts[1:]:
        path = path / part
        if not path.stat().st_mode & stat.S_IXOTH:
            return str(path)
    raise _SystemError(f"no directory on the way to {work} is private to the worker")


def _exit_code(wait_status: int) -> int:
    """The exit code as the job's status shows it: 128 + the signal that killed it."""
    code = os.waitstatus_to_exitcode(wait_status)
    return 128 - code if code < 0 else code


def _storage_note(job: JobRun, interval_s: float) -> str:
    if job.storage_bytes <= 0:
        return "its work and tmp directories not limited in size (it reserved no storage)"
    return (f"its work and tmp directories at most its storage request of {binary_size(job.storage_bytes)} "
            f"(measured every {interval_s:g} s, and each file held to that size)")


def _secrets_note(job: JobRun) -> str:
    if not job.spec.secrets:
        return ""
    paths = ", ".join(repr(m.mount_path.lstrip("/")) for m in job.spec.secrets)
    return f" Its secrets were mounted read-only below its working directory: {paths}."


def _address_space_limit(memory_bytes: int) -> int:
    """RLIMIT_AS for a reservation of `memory_bytes` (0: none): never above the worker's own hard limit,
    which an unprivileged process could not raise."""
    if memory_bytes <= 0:
        return 0
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    return memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)


def _signal_or_code(returncode: int | None) -> str:
    if returncode is None:
        return "it stopped answering"
    return f"killed by {signal_name(-returncode)}" if returncode < 0 else f"exit code {returncode}"


def _reports_allocation_failure(log: LogSink) -> bool:
    last = log.recent.lower()
    return any(marker in last for marker in _ALLOCATION_FAILURES)
