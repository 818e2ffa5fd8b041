"""What one worker's OCI runtime leaves on the host, under a name of its own,
and the cleanup of what a dead worker left.

A runtime is its worker's: its **owner name** is the worker's instance name.
Everything it makes is named after it, so that it can be found again:

    STATE_ROOT/OWNER/lock                 flock()ed while the runtime lives
    STATE_ROOT/OWNER/cgroup               the path of its cgroup (below its
                                          deployment's, worker_cgroup.py)
    STATE_ROOT/OWNER/crun/, runc/         the container runtime's state
                                          directory (--root), one per runtime
    STATE_ROOT/OWNER/attempts/ID.json     one record per attempt in progress:
                                          its container, its oci/ directory
                                          (mounts, writable layer), its cgroup
    STATE_ROOT/OWNER/network.json         the worker's subnet, bridges and
                                          iptables chains (network.py)
    /var/run/netns/crl-H-mNN, crvHmNN     its attempt networks, kept for the
                                          next attempt (slots.py; H hashes
                                          its directory, as network.json's)
    /sys/fs/cgroup/*/CGROUP_ROOT/DEPLOYMENT/OWNER/   the attempts' cgroups
    containers OWNER-BATCH-JOB-ATTEMPT

The kernel drops the lock when its holder dies, so a free lock is a dead
owner. When a runtime starts it takes its own lock (a live runtime of the
same name is refused) and cleans up, for its own name (a previous run of
the same worker) and for every dead owner under the state root (workers
of other names, e.g. the local provider's, which names each new worker
anew): kill and delete their containers, unmount and remove each recorded
attempt's directory, kill what is left in their cgroups and remove them
(and their deployment's, once empty), remove their attempt networks,
bridges and iptables chains.
STATE_ROOT is on /run (a tmpfs): after a reboot nothing is left to clean
but the attempts' directories on the scratch disk, which the worker's own
scratch handling owns.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from services.common.files import try_lock
from services.worker.oci.cgroups import Hierarchies, remove_if_empty, remove_tree
from services.worker.oci import network, slots
from services.worker.oci.layer import remove_oci_dir
from services.worker.oci.runc import CRUN, RUNC, Runc, RuncError, find

logger = logging.getLogger(__name__)


class OwnerBusy(Exception):
    """Another live runtime on this host has the name."""


@dataclass(frozen=True)
class AttemptRecord:
    """What an attempt in progress has made, for whoever cleans up after a crash."""

    container_id: str
    oci_dir: str
    """The attempt's oci/ directory (mounts, bundle, writable layer)."""
    cgroup: str
    """Its cgroup's path in each hierarchy."""


class Owner:
    """One runtime's name on the host and what is kept under it."""

    def __init__(self, state_root: Path, name: str, cgroup_parent: str):
        self.state_root = state_root
        self.name = name
        self.dir = state_root / name
        self.records_dir = self.dir / "attempts"
        self.cgroup_parent = cgroup_parent
        """Its cgroup in each hierarchy, its attempts' parent: '/CGROUP_ROOT/DEPLOYMENT/OWNER'."""
        self._lock_fd: int | None = None

    @classmethod
    def found(cls, state_root: Path, name: str, cgroup_root: str) -> Owner:
        """The owner of a directory under the state root, its cgroup as it wrote it (before deployments had
        cgroups of their own, '/CGROUP_ROOT/OWNER')."""
        try:
            recorded = (state_root / name / "cgroup").read_text().strip()
        except OSError:
            recorded = ""
        ours = recorded.startswith(f"/{cgroup_root}/") and ".." not in recorded.split("/")
        return cls(state_root, name, recorded if ours else f"/{cgroup_root}/{name}")

    def claim(self) -> None:
        """Take the name for this process; raises OwnerBusy if a live runtime has it."""
        self.state_root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        fd = try_lock(self.dir / "lock")
        if fd is None:
            raise OwnerBusy(f"another OCI runtime named {self.name!r} runs on this host (it holds "
                            f"{self.dir}/lock): each worker needs a name of its own")
        self._lock_fd = fd
        (self.dir / "cgroup").write_text(self.cgroup_parent)
        self.records_dir.mkdir(mode=0o700, exist_ok=True)

    def runtime_root(self, kind: str) -> Path:
        """The state directory (--root) of the runtime `kind` (CRUN or RUNC): their formats differ."""
        return self.dir / kind

    def release(self) -> None:
        """Let the name go (its directory is removed first: call once nothing of it is left)."""
        if self._lock_fd is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            os.close(self._lock_fd)
            self._lock_fd = None

    def record(self, record: AttemptRecord) -> None:
        """Write the record before making what it names."""
        path = self.records_dir / f"{record.container_id}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(asdict(record)))
        temporary.rename(path)

    def forget(self, container_id: str) -> None:
        (self.records_dir / f"{container_id}.json").unlink(missing_ok=True)

    def records(self) -> list[AttemptRecord]:
        found = []
        for path in sorted(self.records_dir.glob("*.json")) if self.records_dir.is_dir() else []:
            try:
                found.append(AttemptRecord(**json.loads(path.read_text())))
            except (OSError, ValueError, TypeError) as e:
                logger.warning("unreadable attempt record %s: %s", path, e)
        return found


async def clean_up(owner: Owner, hierarchies: Hierarchies) -> list[str]:
    """Remove every container, attempt directory and cgroup recorded or named under `owner`; returns what
    could not be removed, in words (it stays recorded for the next try)."""
    left: list[str] = []
    for kind in (CRUN, RUNC):
        root = owner.runtime_root(kind)
        if not root.is_dir():
            continue
        if (binary := find(kind)) is None:
            left.append(f"{root}: {kind}'s containers, and {kind} is not installed to remove them")
            continue
        runtime = Runc(binary, root)
        try:
            for container_id in await runtime.list():
                logger.warning("OCI runtime %s: removing container %s left by a worker that is gone", owner.name,
                               container_id)
                await runtime.kill(container_id, "KILL")
                await runtime.delete(container_id)
        except RuncError as e:
            left.append(str(e))
    for record in owner.records():
        if not record.oci_dir.endswith("/oci"):
            left.append(f"attempt record {record.container_id} names {record.oci_dir!r}, not an oci/ directory")
            continue
        try:
            await asyncio.to_thread(remove_oci_dir, Path(record.oci_dir))
            owner.forget(record.container_id)
        except OSError as e:
            left.append(f"{record.oci_dir}: {e}")
    left += await asyncio.to_thread(remove_tree, hierarchies, owner.cgroup_parent)
    deployment = owner.cgroup_parent.rsplit("/", 1)[0]
    if deployment.count("/") >= 2:  # '/ROOT/DEPLOYMENT', once no other worker's is in it (never the root's own)
        left += await asyncio.to_thread(remove_if_empty, hierarchies, deployment)
    if owner.dir.is_dir():
        try:
            left += await asyncio.to_thread(slots.remove_all, network.owner_hash(owner.dir))
            left += await asyncio.to_thread(network.tear_down, owner.dir)
        except (network.NetworkError, OSError, ValueError) as e:
            left.append(f"the network of {owner.name}: {e}")
    return left


async def clean_up_dead_owners(state_root: Path, cgroup_root: str, hierarchies: Hierarchies,
                               alive: str) -> list[str]:
    """Clean up after every owner under `state_root` whose runtime is gone (but `alive`, ours); returns
    what could not be removed."""
    left: list[str] = []
    if not state_root.is_dir():
        return left
    for entry in sorted(state_root.iterdir()):
        if entry.name == alive or not entry.is_dir():
            continue
        # Never made here: a directory without its lock is one its runtime is making or removing (its release
        # removes the directory, lock and all, while it still holds the lock), not a dead one's.
        fd = try_lock(entry / "lock", create=False)
        if fd is None:
            continue  # a live runtime's
        try:
            logger.warning("OCI runtime %s: cleaning up after %s, which is gone", alive, entry.name)
            dead = Owner.found(state_root, entry.name, cgroup_root)
            not_removed = await clean_up(dead, hierarchies)
            if not_removed:
                left += not_removed
            else:
                shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)
    return left


