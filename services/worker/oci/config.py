"""The OCI runtime's settings."""

from __future__ import annotations

import ipaddress
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from services.worker.job_files import UrlCheck, allow_all_urls
from services.worker.object_stores import ObjectStores
from services.worker.oci.images import RootfsSource


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _host_memory_per_core_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (os.cpu_count() or 1)


@dataclass(frozen=True)
class OciRuntimeConfig:
    """Settings of the OCI runtime."""

    rootfs: RootfsSource
    """Where images' root filesystems come from (the worker's image cache)."""
    owner: str = "worker"
    """The worker's name on this host (its instance name): names its runc state, cgroups and containers,
    and a runtime with the same name must not be running. Letters, digits, '.', '_' and '-'."""
    state_root: Path = Path("/run/corral/oci")
    """Where the runtimes of this host keep their state, one directory per owner (see owner.py)."""
    cgroup_root: str = "corral"
    """Attempts' cgroups are CGROUP_ROOT/DEPLOYMENT/OWNER/ATTEMPT in each hierarchy."""
    deployment: str = "default"
    """The deployment's name on this host: the cgroup level above its workers' (services/worker/worker_cgroup.py)."""
    cores_mcpu: int = 0
    """The cores the worker offers, in thousandths (its cgroup's process cap and each attempt's share of it are
    computed from them); 0: the host's cpus."""
    container_runtime: str = "auto"
    """What runs the containers: 'crun', 'runc', a path to either (looked up in /usr/sbin:/usr/bin:/sbin:/bin;
    a name starting with 'crun' is driven as crun), or 'auto': crun where it is installed and this host's
    cgroups let it run, else runc (runc.py)."""
    layer: str = "auto"
    """How an attempt's writable root filesystem is made: 'overlayfs', 'copy' (of the whole image), or
    'auto' (overlayfs where a probe on the scratch filesystem mounts one, else copy)."""
    memory_per_core_bytes: int = field(default_factory=_host_memory_per_core_bytes)
    """The memory limit of a job that reserved none (JobRun.memory_bytes 0), per core it reserved; by
    default the host's memory per cpu. The worker passes its own memory per core."""
    max_processes: int = 4096
    """Most processes (threads included) one attempt may have: its cgroup's pids.max is its cores' share of
    the worker's cap, at most this (services/worker/host_limits.py)."""
    max_processes_per_core: int = 1024
    """The worker's cgroup's pids.max is `max_processes_base` + this x its cores."""
    max_processes_base: int = 1024
    deployment_max_processes: int = 0
    """pids.max of the deployment's cgroup; 0: half of the host's kernel.pid_max."""
    process_check_interval_s: float = 0.5
    """How often a running attempt's cgroup is read for a fork refused at its cap (it is then killed)."""
    storage_check_interval_s: float = 1.0
    """How often a running attempt's writable layer is measured against its storage request (it is killed
    past it); each file is also held to that size by RLIMIT_FSIZE."""
    shm_bytes: int = 64 * 2**20
    """Size of the container's /dev/shm (counted in its memory)."""
    max_open_files: int = 65536
    """RLIMIT_NOFILE of the job's processes (at most the worker's own hard limit: runc sets it once the
    process has no capability left to raise it)."""
    kill_grace_s: float = 10.0
    """After SIGTERM on timeout or cancel, how long the job may take to exit before SIGKILL."""
    max_timeout_s: float | None = None
    """The deployment's longest attempt; applies when a spec sets no timeout or a longer one."""
    start_timeout_s: float = 60.0
    """How long runc may take to start a container (some 30 ms, as a rule) before the attempt ends in Error."""
    output_drain_s: float = 5.0
    """How long to keep reading the log pipe after runc exited."""
    uid_first: int = 2_000_000_000
    """First uid (and gid) given to jobs (shared with the process runtime's claims: see job_uids.py)."""
    uid_count: int = 65_536
    uid_claims_dir: Path = Path("/run/corral/job-uids")
    check_url: UrlCheck = allow_all_urls
    """Called with every input and output URL before its copy; raises to refuse it."""
    object_stores: ObjectStores = field(default_factory=ObjectStores)
    """How input and output files are reached: the local disk, and object stores with the deployment's
    credentials (shared with the process runtime)."""
    private_networks: tuple[ipaddress.IPv4Network, ...] = ()
    """The deployment's private ranges: all that NETWORK_MODE_PRIVATE jobs reach, and what PUBLIC jobs do
    not (network.py)."""
    offers_networks: bool = True
    """Whether the runtime makes the host's bridges and chains for private and public networks when it starts;
    False: it changes no host network setting, and jobs asking for either are refused (a pipeline's
    LocalBackend, whose jobs have loopback only)."""
    clock_ms: Callable[[], int] = field(default=_wall_ms)
