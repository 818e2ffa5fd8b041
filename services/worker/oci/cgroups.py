"""The attempt's cgroup: its limits, whether it ran out of memory, what it used.

Each attempt has a cgroup of its own that the worker makes before the
container starts, `/corral/OWNER/ATTEMPT` in every hierarchy, and runc puts
the container in a child of it (`…/ATTEMPT/job`). The limits are set on the
attempt's cgroup, so they hold for the child whatever runc does, and its
counters (which include the child's) outlive the container: runc removes
its own cgroup when the container is deleted.

- **cpu**: a CFS quota of `cores_mcpu / 1000` periods per period.
- **memory**: the limit, and no swap (memsw = memory in v1, where swap
  accounting exists; memory.swap.max = 0 in v2).
- **pids**: at most `max_processes` processes and threads (its cores' share of
  its worker's cap: the worker's and the deployment's levels above it have
  caps of their own, services/worker/worker_cgroup.py).

**Refused forks.** The kernel counts a fork it refused for a pids.max in
`pids.events` (`max`): cgroup v1 (and v2 before 6.11) in the cgroup of the
process that forked (runc's, `…/ATTEMPT/job`, which goes with the
container, so it is read while the container exists: crun removes it as
its container exits, so a job that ends before the limit watch looks has
no count left, and one whose pids.peak reached its own cap is taken to
have hit it, `ProcessCount.refusals_known`), whichever level's cap was
full; v2 since 6.11 in the cgroup whose cap was full and, for
`max`, its ancestors (so a fork refused by the worker's or the
deployment's cap is not seen at the attempt there). `processes` reads both
the attempt's and runc's, with pids.current and pids.peak, so that the
caller can tell a job at its own cap from one refused by an ancestor's
(host_limits.py).

**Out of memory.** cgroup v2 counts OOM kills in `memory.events`
(`oom_kill`) of every ancestor of the victim, the attempt's cgroup included.
cgroup v1 counts them (`memory.oom_control`'s `oom_kill`) only in the
victim's own cgroup, runc's, which lives only until the container is
deleted; so in v1 the worker reads that counter before it deletes the
container, and, to miss nothing, also registers an eventfd on the
attempt's `memory.oom_control` (cgroup.event_control) before the container
starts: the kernel signals it whenever the cgroup's limit makes it kill a
process (containerd watches v1 containers this way). Either way the answer
comes from the kernel, never from what the job printed.

**Usage**: cpu time (v1 cpuacct.usage, v2 cpu.stat usage_usec), current
memory (v1 memory.usage_in_bytes, v2 memory.current) and peak memory (v1
memory.max_usage_in_bytes, v2 memory.peak where the kernel has it) of the
attempt's cgroup, which include its child's; block I/O bytes read and
written where a hierarchy counts them (v1 blkio.throttle.io_service_bytes
of the attempt's cgroup, recursive, or of runc's while it exists; v2
io.stat, where the io controller is enabled for the attempt: it is not
asked for, so usually absent). The block counters see only I/O that
reaches a block device on the job's behalf (writeback of the page cache
may be charged to no one). `read_usage` can be called while the container
runs, for sampling.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from services.worker.host_limits import ProcessCount

V1 = "v1"
V2 = "v2"
RUNC_CHILD = "job"
"""The name of runc's cgroup under the attempt's."""
CPU_PERIOD_US = 100_000
_V2_CONTROLLERS = ("cpu", "memory", "pids")


class CgroupError(Exception):
    """The attempt's cgroup could not be made or limited; the message says which file and why."""


@dataclass(frozen=True)
class Limits:
    """What the attempt may use."""

    cores_mcpu: int
    memory_bytes: int
    max_processes: int


@dataclass(frozen=True)
class Usage:
    """What the attempt used so far (None: the kernel does not say)."""

    cpu_time_ms: int | None
    peak_memory_bytes: int | None
    memory_bytes: int | None = None
    """Memory charged now."""
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None


@dataclass(frozen=True)
class Hierarchies:
    """Where the machine's cgroup hierarchies are mounted."""

    version: str
    """V1 (a hierarchy per controller; a hybrid host's v2 hierarchy, without controllers, is only in
    `all`) or V2 (one unified hierarchy)."""
    by_controller: dict[str, Path]
    """Each controller's hierarchy (for v2, every controller is the unified one)."""
    all: tuple[Path, ...]
    """Every cgroup mount, controllers or not (runc makes its cgroup in each: all must be cleaned)."""

    @classmethod
    def of_host(cls, mountinfo: Path = Path("/proc/self/mountinfo")) -> Hierarchies:
        """Read from the mount table; raises CgroupError on a host where neither version is usable."""
        by_controller: dict[str, Path] = {}
        all_mounts: list[Path] = []
        unified: Path | None = None
        for line in mountinfo.read_text().splitlines():
            fields = line.split(" ")
            separator = fields.index("-")
            point, fstype, options = Path(fields[4]), fields[separator + 1], fields[separator + 3]
            if fstype == "cgroup":
                all_mounts.append(point)
                for option in options.split(","):
                    by_controller.setdefault(option, point)
            elif fstype == "cgroup2":
                all_mounts.append(point)
                unified = unified or point
        if "memory" in by_controller:
            return cls(V1, by_controller, tuple(all_mounts))
        if unified is not None and "memory" in (unified / "cgroup.controllers").read_text().split():
            return cls(V2, {c: unified for c in (*_V2_CONTROLLERS, "cpuacct")}, tuple(all_mounts))
        raise CgroupError("no cgroup hierarchy with the memory controller is mounted")

    def missing(self) -> list[str]:
        """Controllers the runtime needs that the host does not have."""
        return [c for c in ("cpu", "cpuacct", "memory", "pids") if c not in self.by_controller]


class AttemptCgroup:
    """The cgroup of one attempt, made with its limits by `create`; `close` once the container is gone
    and the counters were read (it does not remove the directories: `remove_tree` does)."""

    def __init__(self, hierarchies: Hierarchies, path: str):
        self.hierarchies = hierarchies
        self.path = path
        """Its path in each hierarchy, e.g. '/corral/worker-1/7-3-a1'."""
        self._oom_eventfd: int | None = None
        self.container = False
        """A container runs in it, in runc's cgroup below (`create`), not the process runtime's job."""

    @property
    def runc_path(self) -> str:
        """The cgroupsPath to give runc."""
        return f"{self.path}/{RUNC_CHILD}"

    def dir(self, controller: str) -> Path:
        return self.hierarchies.by_controller[controller] / self.path.lstrip("/")

    @classmethod
    def create(cls, hierarchies: Hierarchies, path: str, limits: Limits) -> AttemptCgroup:
        """Make the cgroup and set its limits; raises CgroupError (what was made is left to `remove_tree`)."""
        cgroup = cls(hierarchies, path)
        cgroup.container = True
        try:
            if hierarchies.version == V1:
                cgroup._create_v1(limits)
            else:
                cgroup._create_v2(limits)
        except OSError as e:
            cgroup.close()
            raise CgroupError(f"could not set up the attempt's cgroup {path}: {e}") from e
        return cgroup

    def _create_v1(self, limits: Limits) -> None:
        for controller in ("memory", "cpu", "pids"):
            self.dir(controller).mkdir(parents=True, exist_ok=True)
        memory = self.dir("memory")
        _write(memory / "memory.limit_in_bytes", limits.memory_bytes)
        if (memory / "memory.memsw.limit_in_bytes").exists():  # swap accounting: memory + swap = memory
            _write(memory / "memory.memsw.limit_in_bytes", limits.memory_bytes)
        _write(memory / "memory.swappiness", 0)
        _write(self.dir("cpu") / "cpu.cfs_period_us", CPU_PERIOD_US)
        _write(self.dir("cpu") / "cpu.cfs_quota_us", _quota_us(limits.cores_mcpu))
        _write(self.dir("pids") / "pids.max", limits.max_processes)
        eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        control = os.open(memory / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(memory / "cgroup.event_control", f"{eventfd} {control}")
        except OSError:
            os.close(eventfd)
            raise
        finally:
            os.close(control)
        self._oom_eventfd = eventfd

    def _create_v2(self, limits: Limits) -> None:
        root = self.hierarchies.by_controller["memory"]
        enable = " ".join(f"+{c}" for c in _V2_CONTROLLERS)
        current = root
        for part in Path(self.path.lstrip("/")).parts:
            _write(current / "cgroup.subtree_control", enable)  # the children get the controllers' files
            current = current / part
            current.mkdir(exist_ok=True)
        _write(current / "memory.max", limits.memory_bytes)
        if (current / "memory.swap.max").exists():
            _write(current / "memory.swap.max", 0)
        _write(current / "cpu.max", f"{_quota_us(limits.cores_mcpu)} {CPU_PERIOD_US}")
        _write(current / "pids.max", limits.max_processes)

    @classmethod
    def create_for_processes(cls, hierarchies: Hierarchies, path: str, max_processes: int) -> AttemptCgroup:
        """A cgroup with a pids.max only (the process runtime's jobs join it before they fork); raises
        CgroupError."""
        cgroup = cls(hierarchies, path)
        pids = cgroup.dir("pids")
        try:
            if hierarchies.version == V2:
                _write(pids.parent / "cgroup.subtree_control", "+pids")
            pids.mkdir(exist_ok=True)
            _write(pids / "pids.max", max_processes)
        except OSError as e:
            raise CgroupError(f"could not set up the attempt's cgroup {path}: {e}") from e
        return cgroup

    def processes(self) -> ProcessCount:
        """Its processes and the forks the kernel refused them (the attempt's cgroup and runc's below it)."""
        count = read_processes(self.hierarchies, self.path)
        if self.container and self.hierarchies.version == V1 and not (self.dir("pids") / RUNC_CHILD).exists():
            return dataclasses.replace(count, refusals_known=False)  # v1 counted them there (module docstring)
        return count

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process of the attempt for going over its memory limit. Read it
        before the cgroup is removed (v1 signals the eventfd once more when it is)."""
        if self.hierarchies.version == V2:
            return _keyed(self.dir("memory") / "memory.events").get("oom_kill", 0) > 0
        notified = 0
        if self._oom_eventfd is not None:
            try:
                notified = os.eventfd_read(self._oom_eventfd)
            except BlockingIOError:
                pass
        memory = self.dir("memory")
        killed = sum(_keyed(d / "memory.oom_control").get("oom_kill", 0) for d in (memory, memory / RUNC_CHILD))
        return notified > 0 or killed > 0

    def usage(self) -> Usage:
        """cpu time, memory and I/O so far (also after the container is gone, until removal)."""
        return read_usage(self.hierarchies, self.path)

    def close(self) -> None:
        """Stop watching for out-of-memory kills."""
        if self._oom_eventfd is not None:
            os.close(self._oom_eventfd)
            self._oom_eventfd = None


def read_usage(hierarchies: Hierarchies, path: str) -> Usage:
    """cpu time, memory and block I/O of the cgroup at `path` (and its children), where the kernel says."""
    def at(controller: str, name: str) -> Path:
        return hierarchies.by_controller.get(controller, Path("/nonexistent")) / path.lstrip("/") / name

    if hierarchies.version == V1:
        cpu_ns = _read_int(at("cpuacct", "cpuacct.usage"))
        read, written = _v1_io(at("blkio", "blkio.throttle.io_service_bytes_recursive"))
        if read is None:  # older kernels: runc's own cgroup, while the container exists
            read, written = _v1_io(at("blkio", f"{RUNC_CHILD}/blkio.throttle.io_service_bytes"))
        return Usage(None if cpu_ns is None else cpu_ns // 1_000_000,
                     _read_int(at("memory", "memory.max_usage_in_bytes")),
                     _read_int(at("memory", "memory.usage_in_bytes")), read, written)
    cpu_us = _keyed(at("cpu", "cpu.stat")).get("usage_usec")
    read, written = _v2_io(at("memory", "io.stat"))  # the unified hierarchy, whatever the controller
    return Usage(None if cpu_us is None else cpu_us // 1000, _read_int(at("memory", "memory.peak")),
                 _read_int(at("memory", "memory.current")), read, written)


def read_processes(hierarchies: Hierarchies, path: str) -> ProcessCount:
    """The pids counters of the cgroup at `path`: forks refused there or in runc's cgroup below it (see the
    module's docstring), processes now, the peak where the kernel keeps one, and its pids.max (0 if unreadable;
    'max' is 0 too: no cap)."""
    pids = hierarchies.by_controller.get("pids", Path("/nonexistent")) / path.lstrip("/")
    refused = sum(_keyed(d / "pids.events").get("max", 0) for d in (pids, pids / RUNC_CHILD))
    return ProcessCount(refused=refused, current=_read_int(pids / "pids.current") or 0,
                        peak=_read_int(pids / "pids.peak"), limit=_read_int(pids / "pids.max") or 0)


def read_children_limits(hierarchies: Hierarchies, path: str) -> list[int]:
    """The pids.max of each cgroup right below `path` (a deployment's workers'), 0 for 'max' or unreadable."""
    pids = hierarchies.by_controller.get("pids", Path("/nonexistent")) / path.lstrip("/")
    try:
        children = [entry for entry in os.scandir(pids) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return []
    return [_read_int(Path(child.path) / "pids.max") or 0 for child in children]


def _v1_io(path: Path) -> tuple[int | None, int | None]:
    """Bytes read and written, summed over devices, of a v1 blkio file ('MAJ:MIN Read N' lines)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None, None
    read = written = 0
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[2].isdigit():
            if parts[1] == "Read":
                read += int(parts[2])
            elif parts[1] == "Write":
                written += int(parts[2])
    return read, written


def _v2_io(path: Path) -> tuple[int | None, int | None]:
    """Bytes read and written, summed over devices, of io.stat ('MAJ:MIN rbytes=N wbytes=N ...' lines)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None, None
    read = written = 0
    for line in lines:
        for field in line.split()[1:]:
            name, _, value = field.partition("=")
            if value.isdigit() and name in ("rbytes", "wbytes"):
                if name == "rbytes":
                    read += int(value)
                else:
                    written += int(value)
    return read, written


def remove_tree(hierarchies: Hierarchies, path: str, wait_s: float = 5.0) -> list[str]:
    """Remove the cgroup at `path` and every cgroup below it, in every hierarchy, killing any process
    still in them first (a dead worker's container, say). Returns what could not be removed, in words."""
    left = []
    for mount in hierarchies.all:
        top = mount / path.lstrip("/")
        if _removed_as_made(top):
            continue
        for current, _, _ in sorted(os.walk(top), key=lambda entry: len(entry[0]), reverse=True):
            if (why := _remove_one(Path(current), wait_s)) is not None:
                left.append(why)
    return left


def _removed_as_made(top: Path) -> bool:
    """Whether `top` is gone once its runtime's child and itself are rmdir'ed, as an attempt leaves them:
    the common case, without a walk through every file of each cgroup (a v1 memory cgroup has dozens)."""
    for cgroup in (top / RUNC_CHILD, top):
        try:
            cgroup.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return False  # a process or a cgroup of its own in it: the walk kills and removes what is there
    return True


def remove_if_empty(hierarchies: Hierarchies, path: str) -> list[str]:
    """rmdir the cgroup at `path` in every hierarchy where it has no child cgroup and no process (others' are
    left, silently); returns what failed otherwise."""
    left = []
    for mount in hierarchies.all:
        try:
            (mount / path.lstrip("/")).rmdir()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                left.append(f"{mount / path.lstrip('/')}: {e.strerror}")
    return left


def _remove_one(cgroup: Path, wait_s: float) -> str | None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            cgroup.rmdir()
            return None
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                return f"{cgroup}: {e.strerror}"
        for pid in _pids(cgroup):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)


def _pids(cgroup: Path) -> list[int]:
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def _quota_us(cores_mcpu: int) -> int:
    return max(1000, cores_mcpu * CPU_PERIOD_US // 1000)  # the kernel's least quota is 1 ms


def write_file(path: Path, value: object) -> None:
    """Write `value` to a cgroup file; raises OSError naming the file."""
    _write(path, value)


def _write(path: Path, value: object) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, str(value).encode())
    except OSError as e:
        raise OSError(e.errno, f"writing {value} to {path}: {e.strerror}") from e
    finally:
        os.close(fd)


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _keyed(path: Path) -> dict[str, int]:
    """A flat keyed file ('name value' lines), e.g. memory.events or cpu.stat; {} if unreadable."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    values = {}
    for line in lines:
        name, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[name] = int(value)
    return values
