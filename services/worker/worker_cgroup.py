"""A worker's level of the cgroup tree and its deployment's above it, each
with a process cap (pids.max; the arithmetic is host_limits.py):

    CGROUP_ROOT/DEPLOYMENT/           pids.max: the deployment's cap
    CGROUP_ROOT/DEPLOYMENT/WORKER/    pids.max: the worker's cap
    CGROUP_ROOT/DEPLOYMENT/WORKER/ATTEMPT/   each attempt's (oci/cgroups.py)

in the pids hierarchy (cgroup v1, and the other controllers' hierarchies
the attempts use, where the levels are plain directories) or the unified
one (v2, where each level passes the controllers down to the next). Both
runtimes use it: the OCI runtime for its containers, the process runtime
for its jobs' processes, which join their attempt's cgroup before they
fork.

The deployment's level is shared by the deployment's workers on the host:
each writes the same cap into it, and removes it once it is empty (a
worker making its own level below at that moment tries again).

`ProcessRuntimeClaim` is the process runtime's hold on its worker's name
(the OCI runtime has its Owner, oci/owner.py): a locked file naming the
worker's cgroup, so that a worker starting on the host can remove what a
dead one left.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from services.common.files import try_lock
from services.worker.oci.cgroups import (V1, CgroupError, Hierarchies, read_processes, remove_if_empty,
                                         remove_tree, write_file)

logger = logging.getLogger(__name__)

PID_MAX = Path("/proc/sys/kernel/pid_max")
_TRIES = 5  # making a level races with another worker removing the deployment's, emptied a moment before


def host_pid_max(path: Path = PID_MAX) -> int:
    """The host's kernel.pid_max (the most process ids at once); 32768, the kernel's default, if unreadable."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


class WorkerCgroup:
    """The worker's cgroup, `/ROOT/DEPLOYMENT/WORKER`, and its deployment's; `create` makes both with their
    caps, `remove` takes the worker's (and everything below it) away, and the deployment's if it is empty."""

    def __init__(self, hierarchies: Hierarchies, cgroup_root: str, deployment: str, worker: str,
                 controllers: tuple[str, ...] = ("cpu", "memory", "pids")):
        self.hierarchies = hierarchies
        self.deployment_path = f"/{cgroup_root}/{deployment}"
        """The deployment's cgroup, e.g. '/corral/default'."""
        self.path = f"{self.deployment_path}/{worker}"
        """The worker's cgroup: its attempts' parent."""
        self.controllers = controllers
        """What its attempts use (v1: the hierarchies the levels are made in; v2: what each level passes down)."""

    def create(self, worker_max: int, deployment_max: int) -> None:
        """Make both levels and write their caps; raises CgroupError naming the file."""
        for attempt in range(_TRIES):
            try:
                self._create(worker_max, deployment_max)
                return
            except FileNotFoundError as e:  # the deployment's level went between our mkdir and what followed
                if attempt == _TRIES - 1:
                    raise CgroupError(f"could not make the worker's cgroup {self.path}: {e}") from e
            except OSError as e:
                raise CgroupError(f"could not make the worker's cgroup {self.path}: {e}") from e

    def _create(self, worker_max: int, deployment_max: int) -> None:
        pids = self.hierarchies.by_controller["pids"]
        if self.hierarchies.version == V1:
            for controller in self.controllers:
                (self.hierarchies.by_controller[controller] / self.path.lstrip("/")).mkdir(parents=True,
                                                                                         exist_ok=True)
        else:
            enable = " ".join(f"+{c}" for c in self.controllers)
            current = pids
            for part in Path(self.path.lstrip("/")).parts:
                write_file(current / "cgroup.subtree_control", enable)
                current = current / part
                current.mkdir(exist_ok=True)
        write_file(pids / self.deployment_path.lstrip("/") / "pids.max", deployment_max)
        write_file(pids / self.path.lstrip("/") / "pids.max", worker_max)

    def exists(self) -> bool:
        """Whether the worker's level is there (it is gone if a dead worker's cleanup took it, say)."""
        return (self.hierarchies.by_controller["pids"] / self.path.lstrip("/")).is_dir()

    def processes(self) -> tuple[int | None, int | None]:
        """The worker's processes and threads now, and its cap (None: unreadable)."""
        count = read_processes(self.hierarchies, self.path)
        return count.current, count.limit

    def remove(self) -> list[str]:
        """Remove the worker's cgroup and everything below it (killing what is left in it), then the
        deployment's if no other worker has one there; returns what could not be removed, in words."""
        left = remove_tree(self.hierarchies, self.path)
        return left + remove_if_empty(self.hierarchies, self.deployment_path)


class ProcessRuntimeClaim:
    """The process runtime's hold on its worker's cgroup: `STATE_ROOT/NAME`, flock()ed while the runtime lives
    and holding the cgroup's path. The kernel drops the lock when its holder dies, so a free lock is a dead
    worker whose cgroup may be removed (its jobs died with its job launcher; what is left is killed)."""

    def __init__(self, state_root: Path, name: str):
        self.state_root = state_root
        self.file = state_root / name
        self._fd: int | None = None

    def claim(self, cgroup_path: str) -> bool:
        """Take the name, writing the path of its cgroup; False if a live runtime holds it."""
        self.state_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = try_lock(self.file)
        if fd is None:
            return False
        os.ftruncate(fd, 0)
        os.pwrite(fd, cgroup_path.encode(), 0)
        self._fd = fd
        return True

    def release(self, removed: bool = True) -> None:
        """Let the name go; its file too once its cgroup is `removed` (else the next runtime to start on the host
        tries to remove it)."""
        if self._fd is not None:
            if removed:
                self.file.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = None

    def remove_dead(self, hierarchies: Hierarchies) -> list[str]:
        """Remove the cgroups of every other claim under the state root whose holder is dead; returns what could
        not be removed (its claim stays, for the next try)."""
        left: list[str] = []
        for entry in sorted(self.state_root.iterdir()):
            if entry == self.file or not entry.is_file():
                continue
            fd = try_lock(entry)
            if fd is None:
                continue  # a live runtime's
            try:
                path = os.pread(fd, 4096, 0).decode(errors="replace").strip()
                if not path.startswith("/") or ".." in path.split("/"):
                    continue  # being claimed this moment (its path not written yet), or not a claim
                not_removed = remove_tree(hierarchies, path) + remove_if_empty(hierarchies, path.rsplit("/", 1)[0])
                if not_removed:
                    left += not_removed
                else:
                    logger.warning("removed the cgroup %s of a process runtime that is gone", path)
                    entry.unlink(missing_ok=True)
            finally:
                os.close(fd)
        return left

