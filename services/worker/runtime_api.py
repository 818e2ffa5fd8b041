"""What a container runtime is: the `ContainerRuntime` interface, what it is
given for one attempt (`JobRun`) and what it returns (`JobOutcome`).

What an attempt's outcome means follows the protos: SUCCEEDED is exit 0 with
the outputs copied; FAILED is a non-zero exit, a kill by a signal we did not
send, running out of memory, timing out, or being killed at a limit it passed
(its process cap, its storage request: host_limits.py); ERROR is the system failing around
the command (a spec the runtime refuses, an input or output copy, a command
that cannot be started); CANCELLED is a stop asked for with `cancel`. End
reasons are `corral.batch.v1.AttemptEndReason` names without their prefix, in
lower case, as the driver stores them.
"""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from corral.batch.v1 import job_spec_pb2
from services.worker.image_tools import Credentials
from services.worker.logs import LogSink
from services.common.usage_series import UsageReading

EXITED = "exited"
OUT_OF_MEMORY = "out_of_memory"
TIMED_OUT = "timed_out"
CANCELLED = "cancelled"
SYSTEM_ERROR = "system_error"
REFUSED = "refused"
"""The worker would not run the spec (the runtime cannot honour it, a file URL outside the roots): no retry."""


@dataclass(frozen=True)
class SecretVolume:
    """One secret an attempt mounts, as the driver delivered it (services/worker/secret_files.py)."""

    name: str
    mount_path: str
    """Where the job sees the files (JobSpec.secrets[].mount_path), read only."""
    files: Mapping[str, bytes] = field(repr=False)
    """File name to content: never in a repr, a log line or an error message."""


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
    """Memory reserved for the attempt (after any out-of-memory increase). 0 = none reserved (a job-private
    machine's job, or a pool that declares no memory): the process runtime then sets no limit, the OCI
    runtime its worker's memory per core for the attempt's cores."""
    scratch: Path
    """The worker's scratch root; the attempt gets its own directory under it."""
    secrets: tuple[SecretVolume, ...] = ()
    """The secrets the spec mounts, delivered (one per spec.secrets entry, or the attempt is refused first)."""
    pull_credentials: Credentials | None = None
    """The registry login of spec.image_pull_secret, for pulling the image only (a runtime that pulls none
    ignores it); None: pull without credentials. Its password is in no repr."""
    storage_bytes: int = 0
    """Scratch storage reserved for the attempt (RunJob.storage_bytes): what its writes may take on the
    worker's disk (host_limits.py); 0: none reserved (a job-private machine's job), not enforced."""

    @property
    def attempt_dir(self) -> Path:
        """Directory of this attempt: `work/` (the job's cwd and HOME), `tmp/`, `main.log`."""
        return self.scratch / f"{self.batch_id}-{self.job_id}-{self.attempt_id}"

    @property
    def log_path(self) -> Path:
        """Where the main command's log is written while it runs."""
        return self.attempt_dir / "main.log"

    @property
    def secrets_dir(self) -> Path:
        """Where the attempt's secrets are kept while it runs, one directory each (`0`, `1`, ...)."""
        return self.attempt_dir / "secrets"


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
    """An AttemptEndReason name in lower case: exited, out_of_memory, timed_out, cancelled, system_error,
    refused."""
    isolation: str
    """How the job was (or was not) isolated, in words a user reads in the job's status."""
    peak_memory_bytes: int | None = None
    """Peak resident memory of the command's largest process, where the OS tells."""
    cpu_time_ms: int | None = None
    """CPU time (user + system) of the command and the children it waited for, where the OS tells."""
    io_read_bytes: int | None = None
    """Bytes the command read from block devices, where the OS tells (the OCI runtime's cgroup)."""
    io_write_bytes: int | None = None
    """Bytes the command wrote to block devices, where the OS tells."""


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

    def image_digest(self, job: JobRun) -> str:
        """The manifest digest (`sha256:...`) of the image this attempt runs in, once `run` has it; '' before,
        and always from a runtime that pulls no image."""
        ...

    async def run(self, job: JobRun, log: LogSink, on_started: Callable[[int], Awaitable[None]]) -> JobOutcome:
        """Run the attempt to its end: copy inputs, run the command (its output into `log`, which is
        closed when the command ends), copy outputs. `on_started` gets the command's pid (as the job sees it)
        once it runs.
        Cancelling the calling task kills the command and everything it started."""
        ...

    usage_note: str
    """What `sample` cannot tell while an attempt runs, in words stored with its usage series; '' if nothing."""

    def sample(self, attempt_id: str) -> UsageReading | None:
        """The running attempt's counters now; None if it is not running (or this runtime cannot read them
        while it runs). Blocking (it reads files): call it in a thread."""
        ...

    async def cancel(self, attempt_id: str) -> None:
        """Ask a running attempt to stop; its `run` then returns Cancelled. No-op if not running."""
        ...

    async def close(self) -> None:
        """Release what the runtime keeps between attempts (the process runtime's job launcher), once no
        attempt runs. A later `run` may start over."""
        ...


def attempt_timeout_s(spec: job_spec_pb2.JobSpec, max_timeout_s: float | None) -> float | None:
    """How long the attempt's command may run: the spec's timeout, capped by the deployment's longest
    (`max_timeout_s`, which also applies when the spec sets none); None = no limit."""
    asked = spec.timeout.ToTimedelta().total_seconds() if spec.HasField("timeout") else 0.0
    if asked <= 0:
        return max_timeout_s
    return asked if max_timeout_s is None else min(asked, max_timeout_s)


def signal_name(number: int) -> str:
    """'SIGKILL' for 9; 'signal 99' for a number that names none."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def command_refusals(spec: job_spec_pb2.JobSpec) -> list[str]:
    """What no runtime can start: a spec without a command, NUL bytes in it, an environment variable that
    cannot be passed to a process."""
    reasons = []
    command = spec.WhichOneof("command")
    if command is None or (command == "argv" and not spec.argv.args) or (command == "script" and not spec.script):
        reasons.append("the spec has no command (argv or script)")
    if any("\0" in arg for arg in spec.argv.args) or "\0" in spec.script:
        reasons.append("the command contains a NUL byte")
    for name, value in spec.env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            reasons.append(f"environment variable {name!r} cannot be passed to a process")
    return reasons
