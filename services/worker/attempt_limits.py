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
from typing import TYPE_CHECKING

from services.policy.sizes import binary_size
from services.worker.disk import used_bytes
from services.worker.host_limits import (ProcessCount, ended_at_a_limit, hit_own_limit, over_storage,
                                         process_limit_words, storage_limit_words)
from services.worker.limit_watch import Check, LimitWatch

if TYPE_CHECKING:  # the OCI package imports this module
    from services.worker.oci.cgroups import AttemptCgroup


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
        return process_limit_words(count.limit, self.killed) if hit_own_limit(count) else None

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
        return ended_at_a_limit(exit_code, count, used, self.storage_bytes, command)
