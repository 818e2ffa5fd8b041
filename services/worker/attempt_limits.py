"""One attempt's process and storage limits as both runtimes watch them
while it runs and read them at its end: a fork the kernel refused at the
job's own cap (its cgroup's pids.events and counts), and what its scratch
holds against its storage request (a walk of its writable layer, or of its
work and tmp directories). The rules and their words are host_limits.py;
the loop that runs the checks is limit_watch.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.policy.sizes import binary_size
from services.worker.disk import used_bytes
from services.worker.host_limits import (ProcessCount, deployment_share, ended_at_a_limit, filled_a_full_cap,
                                         full_cap_words, hit_own_limit, over_storage, process_limit_words,
                                         refused_by_others, storage_limit_words)
from services.worker.limit_watch import Check, LimitWatch

from services.worker.oci.cgroups import V2, AttemptCgroup, read_children_limits, read_processes


@dataclass(frozen=True)
class AttemptLimits:
    """What to read of one attempt, and how often."""

    cgroup: AttemptCgroup | None
    """Its cgroup (None: the process runtime without writable cgroups: no process check)."""
    storage_bytes: int
    """Its storage request (0: not enforced)."""
    scratch: tuple[Path, ...]
    """Where its writes land on the scratch disk."""
    owner_uid: int | None
    """Count only what this uid owns under `scratch` (a copy of the image is the worker's), or everything."""
    killed: str
    """What is done to it when it goes over, in words: 'its container was killed'."""
    process_interval_s: float
    storage_interval_s: float
    job_cores_mcpu: int = 0
    worker_cores_mcpu: int = 0
    """The attempt's and its worker's cores: its share of a full deployment's cap (host_limits.deployment_share)."""

    def watch(self) -> LimitWatch:
        """The checks to run while the attempt runs; `run` returns why to kill it."""
        checks = []
        if self.cgroup is not None:
            checks.append(Check("processes", self.process_interval_s, self._processes))
        if self.storage_bytes > 0:
            checks.append(Check("storage", self.storage_interval_s, self._storage, in_thread=True))
        return LimitWatch(checks)

    def _processes(self) -> str | None:
        assert self.cgroup is not None
        count = self.cgroup.processes()
        if hit_own_limit(count):
            return process_limit_words(count.limit, self.killed)
        v2 = self.cgroup.hierarchies.version == V2
        if not (count.refused or (v2 and count.current)):
            return None  # refused nothing (cgroup v2 since 6.11 counts a refusal at the full cap: looked at below)
        share, deployment_limit, ancestor_full = self._share()
        if filled_a_full_cap(count, share, v2 and ancestor_full):
            return full_cap_words(share, deployment_limit, self.killed)
        return None

    def _share(self) -> tuple[int, int, bool]:
        """The attempt's share of its deployment's cap (host_limits.deployment_share), the deployment's cap, and
        whether its worker's or its deployment's cap is full now."""
        assert self.cgroup is not None
        hierarchies = self.cgroup.hierarchies
        worker_path = self.cgroup.path.rsplit("/", 1)[0]
        deployment_path = worker_path.rsplit("/", 1)[0]
        worker, deployment = read_processes(hierarchies, worker_path), read_processes(hierarchies, deployment_path)
        share = deployment_share(self.job_cores_mcpu, self.worker_cores_mcpu, worker.limit, deployment.limit,
                                 read_children_limits(hierarchies, deployment_path))
        return share, deployment.limit, any(0 < level.limit <= level.current for level in (worker, deployment))

    def _storage(self) -> str | None:
        used = self.used_bytes()
        if not over_storage(used, self.storage_bytes):
            return None
        return storage_limit_words(self.storage_bytes, f"{binary_size(used)} in its scratch when checked; "
                                                       f"{self.killed}")

    def used_bytes(self) -> int:
        """What its scratch holds now (blocking: a walk)."""
        return used_bytes(list(self.scratch), self.owner_uid)

    def at_end(self, exit_code: int, command: str) -> tuple[str, str] | None:
        """(state, message) if a limit explains how the command ended (host_limits.ended_at_a_limit), else
        None. Blocking (it walks the scratch); call it before the attempt's cgroups are removed."""
        count: ProcessCount | None = self.cgroup.processes() if self.cgroup is not None else None
        used = self.used_bytes() if self.storage_bytes > 0 else 0
        share, deployment_limit = None, 0
        if count is not None and refused_by_others(count):
            share, deployment_limit, _ = self._share()
        return ended_at_a_limit(exit_code, count, used, self.storage_bytes, command, share, deployment_limit)
