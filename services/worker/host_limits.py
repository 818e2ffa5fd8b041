"""What a job may take of its worker's host, as arithmetic: the process caps
(cgroup pids.max) of a worker and of each attempt, what a fork the kernel
refused means, and the words of an attempt ended at a limit. Pure: no I/O.

**Processes.** Three cgroup levels hold them, each with a pids.max:

    /corral/DEPLOYMENT            --deployment-max-processes (default: half
                                  of the host's kernel.pid_max)
    /corral/DEPLOYMENT/WORKER     BASE + PER_CORE x the worker's cores
    /corral/DEPLOYMENT/WORKER/ATTEMPT
                                  its cores' share of its worker's cap, at
                                  most --max-processes-per-job

An attempt's share is the worker's cap times its cores over the worker's
cores, so the attempts a worker runs together (their cores add up to at
most the worker's) have caps that add up to at most the worker's: one job's
fork bomb fills its own share and never another job's. The worker's cap
stands on its own in case of a fault in the share arithmetic, and the
deployment's bounds all of its workers on one host (a host may run several
deployments, each under a cap of its own; keep them together under
kernel.pid_max, less what the host itself needs).

A fork the kernel refused is counted in `pids.events` (`max`). When the
attempt had reached its own cap, it hit its limit: it is killed and ends
Failed saying so (a program that cannot fork seldom recovers, and a fork
bomb never stops). When it had not, an ancestor's cap refused it: the
deployment's, whose cap may be less than its workers' together (several
workers share a host under `corral up`). Then the attempts holding at
least their share of the deployment's cap (their cores' share of their
worker's part of it, the parts weighed by the workers' caps) are the ones
filling it, and are killed the same way; a job with fewer processes is not
to blame, and if it then fails it ends in Error, which is retried
elsewhere.

**Storage.** An attempt's scratch (its writable layer, or its work and tmp
directories) may hold less than its storage request (`storage_bytes`; 0:
not enforced); reaching it fails the job. It is measured every --storage-check-interval while the job
runs, and once more at its end; each file is also held to that size by
RLIMIT_FSIZE, which the kernel enforces on every write (SIGXFSZ).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.policy.sizes import binary_size

XFSZ_EXIT_CODE = 128 + 25
"""The exit code of a process the kernel killed with SIGXFSZ: it wrote past RLIMIT_FSIZE."""
CHECK_TIME_FACTOR = 10
"""A limit's check waits at least this many times its own last duration before it runs again, so a job
whose scratch takes long to walk costs the worker at most a tenth of a core."""


def worker_max_processes(cores_mcpu: int, per_core: int, base: int) -> int:
    """A worker's pids.max: `base` plus `per_core` for each core it offers (a part of a core counts in part,
    rounded up)."""
    return base + -(-max(0, cores_mcpu) * per_core // 1000)


def attempt_max_processes(job_cores_mcpu: int, worker_cores_mcpu: int, worker_max: int, per_job: int) -> int:
    """An attempt's pids.max: its cores' share of its worker's cap (`worker_max`), at most `per_job`, at
    least 1. A job asking more cores than the worker offers gets the whole of the worker's cap."""
    cores = min(max(0, job_cores_mcpu), worker_cores_mcpu)
    share = worker_max * cores // worker_cores_mcpu if worker_cores_mcpu > 0 else worker_max
    return max(1, min(per_job, share))


def default_deployment_max_processes(pid_max: int) -> int:
    """The deployment's pids.max unless set: half of the host's kernel.pid_max, so that one deployment leaves
    the other half to the host and to whatever else runs there."""
    return max(1, pid_max // 2)


@dataclass(frozen=True)
class ProcessCount:
    """An attempt's processes as its cgroup tells them."""

    refused: int
    """Forks the kernel refused the attempt's processes (pids.events `max`)."""
    current: int
    """Processes and threads now (pids.current)."""
    peak: int | None
    """The most it has had at once (pids.peak), where the kernel keeps it."""
    limit: int
    """Its own cap (pids.max)."""
    refusals_known: bool = True
    """False when the counter of refused forks went with the container: cgroup v1 counts them in the runtime's
    cgroup, which crun removes as its container exits. `refused` then says nothing, and an attempt that reached
    its own cap (pids.peak) is taken to have hit it."""


def hit_own_limit(count: ProcessCount) -> bool:
    """Whether a fork was refused because the attempt had reached its own cap (not an ancestor's)."""
    return (count.refused > 0 or not count.refusals_known) and max(count.current, count.peak or 0) >= count.limit


def refused_by_others(count: ProcessCount) -> bool:
    """Whether a fork was refused while the attempt was under its own cap: the worker's or the deployment's
    cap was full, of other jobs' processes."""
    return count.refused > 0 and not hit_own_limit(count)


def deployment_share(job_cores_mcpu: int, worker_cores_mcpu: int, worker_limit: int, deployment_limit: int,
                     workers_limits: list[int]) -> int:
    """The most processes an attempt may hold while its worker's or its deployment's cap is full: its cores'
    share of its worker's part of the deployment's cap, the workers' parts weighed by their own caps (their
    cores). Past it, the attempt is among those filling the full cap."""
    total = sum(workers_limits) or worker_limit
    worker_part = min(worker_limit, deployment_limit * worker_limit // total) if deployment_limit > 0 else worker_limit
    return max(1, attempt_max_processes(job_cores_mcpu, worker_cores_mcpu, worker_part, worker_part))


def filled_a_full_cap(count: ProcessCount, share: int, ancestor_full_now: bool = False) -> bool:
    """Whether an attempt is among those that filled its worker's or deployment's cap: a fork of it was refused
    under its own cap and it held at least `share` (deployment_share) at its peak. Where the kernel counts such
    a refusal at the full cap's cgroup instead (cgroup v2 since 6.11: `refused` stays 0 here), whether an
    ancestor is full now (`ancestor_full_now`) and it holds its share now. A job with fewer processes is not to
    blame, even if its forks were refused."""
    if hit_own_limit(count):
        return False
    if count.refused > 0:
        return max(count.current, count.peak or 0) >= share
    return ancestor_full_now and count.current >= share


def full_cap_words(share: int, deployment_limit: int, killed: str) -> str:
    """Why an attempt holding more than its share of a full worker's or deployment's cap ended."""
    return (f"hit its process limit: the deployment's {deployment_limit:,} processes and threads (pids.max) were "
            f"all taken, and it held at least its share of them, {share:,}; {killed}")


def process_limit_words(limit: int, killed: str) -> str:
    """Why an attempt that hit its process limit ended; `killed`: 'its container was killed' or the like."""
    return (f"hit its process limit: the kernel refused a fork at its limit of {limit:,} processes and threads "
            f"(the cgroup's pids.max); {killed}")


def refused_by_others_words(limit: int, command: str) -> str:
    """Why an attempt whose fork was refused under its own cap, and which then failed, ends in Error."""
    return (f"a fork was refused while the job had fewer than its {limit:,} processes: the worker's or the "
            f"deployment's process limit (pids.max) was full of other jobs' processes; the command {command}")


def over_storage(used_bytes: int, storage_bytes: int) -> bool:
    """Whether an attempt's scratch holds its whole request or more (0: none enforced). Reaching it counts:
    RLIMIT_FSIZE lets a file grow to exactly the request and refuses the write past it."""
    return storage_bytes > 0 and used_bytes >= storage_bytes


def storage_limit_words(storage_bytes: int, what: str) -> str:
    """Why an attempt that wrote past its storage request ended; `what` says what was found and done."""
    return f"wrote more than its storage request of {binary_size(storage_bytes)} (storage_bytes): {what}"


def next_check_delay_s(interval_s: float, last_took_s: float) -> float:
    """How long to wait before a limit's next check: its interval, or `CHECK_TIME_FACTOR` times what the last
    one took if that is longer."""
    return max(interval_s, CHECK_TIME_FACTOR * max(0.0, last_took_s))


def ended_at_a_limit(exit_code: int, count: ProcessCount | None, used_bytes: int, storage_bytes: int,
                     command: str, share: int | None = None, deployment_limit: int = 0) -> tuple[str, str] | None:
    """How an attempt whose command exited with `exit_code` (0 included) ends because of a limit, as (state,
    message): 'Failed' when it hit its own process limit or filled a full cap above it with at least its
    `share` (and failed), or wrote past its storage request (measured at its end, or a file stopped at that
    size by SIGXFSZ); 'Error' when a fork was refused by another level's cap that others filled and it
    failed; None when no limit explains its end. `command`: how the command ended, in words ('exited with
    code 3')."""
    if over_storage(used_bytes, storage_bytes):
        return "Failed", storage_limit_words(storage_bytes, f"{binary_size(used_bytes)} in its scratch when it "
                                                           f"ended; the command {command}")
    if exit_code == 0:
        return None
    if storage_bytes > 0 and exit_code == XFSZ_EXIT_CODE:
        return "Failed", storage_limit_words(storage_bytes, f"a file reached that size and the kernel stopped "
                                                           f"the write (SIGXFSZ); the command {command}")
    if count is not None and hit_own_limit(count):
        return "Failed", process_limit_words(count.limit, f"the command {command}")
    if count is not None and share is not None and filled_a_full_cap(count, share):
        return "Failed", full_cap_words(share, deployment_limit, f"the command {command}")
    if count is not None and refused_by_others(count):
        return "Error", refused_by_others_words(count.limit, command)
    return None
