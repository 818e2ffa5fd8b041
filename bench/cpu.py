"""CPU time of corral's processes over a timed phase, by group, read from /proc.

A benchmark takes a `CpuSnapshot` of a `corral up`'s processes (its pid
files in DATA/run/pids, and the MariaDB server's pid) before the phase and
another after, and `cpu_ms_per_job` divides each group's difference by the
jobs the phase ran. A process's own time is `utime + stime` of
/proc/PID/stat. A worker's jobs are not its own children (its launcher, a
child of its own, forks them and reaps them), so a worker's tree is counted
apart: the children it has waited for (`cutime + cstime`) and each live
descendant's own and waited-for time. Another part's children are not
counted (a driver starts the local workers: they are counted as workers).
The resolution is the kernel's clock tick (10 ms): over a phase of seconds,
a fraction of a millisecond per job.

Groups: `database` (the MariaDB server, every connection's work),
`driver_leader` and `driver_standby` (of two drivers, the one that used
more is the leader: it is the one scheduling), `frontend`, `auth`,
`registry`, `gateways`, `workers` (the worker processes themselves) and
`workers_children` (the jobs and what the workers start per attempt). A process that
is gone by the second snapshot is left out of both, and named in `lost`; one
that started during the phase (a worker) counts whole.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from services.common.processes import PidFiles

TICK_S = 1 / os.sysconf("SC_CLK_TCK")
GROUPS = ("database", "driver_leader", "driver_standby", "frontend", "auth", "registry", "gateways", "workers",
          "workers_children")
CONTROL_PLANE = ("database", "driver_leader", "driver_standby", "frontend", "auth", "gateways")
"""What issue 15 calls the control plane: everything but the workers, their jobs and the registry."""


@dataclasses.dataclass(frozen=True)
class Times:
    """CPU seconds of one process: its own, and those of its tree (what it waited for, and each live
    descendant's own and waited-for time)."""

    own_s: float
    tree_s: float


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own seconds, waited-for children's seconds) from /proc/PID/stat; None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    # After the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14)
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return int(fields[1]), (utime + stime) * TICK_S, (cutime + cstime) * TICK_S


def own_cpu_s(pid: int | None) -> float:
    """The CPU seconds one process has used itself so far; 0 when it is unknown or gone."""
    stat = _stat(pid) if pid is not None else None
    return stat[1] if stat is not None else 0.0


def _all_processes() -> dict[int, tuple[int, float, float]]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(int(entry))) is not None:
            found[int(entry)] = stat
    return found


def _tree_s(pid: int, processes: dict[int, tuple[int, float, float]]) -> float:
    """What `pid` waited for, plus each live descendant's own and waited-for time."""
    children: dict[int, list[int]] = {}
    for child, (parent, _, _) in processes.items():
        children.setdefault(parent, []).append(child)
    total, stack = processes[pid][2], list(children.get(pid, []))
    while stack:
        descendant = stack.pop()
        _, own, waited = processes[descendant]
        total += own + waited
        stack.extend(children.get(descendant, []))
    return total


def _group(name: str) -> str:
    for prefix, group in (("driver-", "driver"), ("worker-", "workers"), ("gateway-", "gateways"),
                          ("registry-", "registry")):  # registry-push beside the workers' registry
        if name.startswith(prefix):
            return group
    return name


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    """Each process's times at one moment, by (part name, pid)."""

    times: dict[tuple[str, int], Times]

    @classmethod
    def of(cls, data_dir: Path, database_pid: int | None) -> CpuSnapshot:
        """Every process `corral up` on `data_dir` recorded (its parts and the workers its drivers started),
        and the database server if its pid is known."""
        processes = [(record.name, record.pid) for record in PidFiles(data_dir / "run" / "pids").live()]
        if database_pid is not None:
            processes.append(("database", database_pid))
        everything = _all_processes()
        times = {}
        for name, pid in processes:
            if pid in everything:
                times[(name, pid)] = Times(everything[pid][1], _tree_s(pid, everything))
        return cls(times)


@dataclasses.dataclass(frozen=True)
class CpuUse:
    """CPU milliseconds per job of each group over a phase."""

    ms_per_job: dict[str, float]
    lost: list[str]
    """Processes that ended during the phase (their time is not counted)."""

    @property
    def control_plane_ms_per_job(self) -> float:
        return sum(self.ms_per_job.get(group, 0.0) for group in CONTROL_PLANE)


def cpu_ms_per_job(before: CpuSnapshot, after: CpuSnapshot, n_jobs: int) -> CpuUse:
    """Each group's CPU over the phase between the snapshots, in ms per job; a driver's group is decided by
    which of them used more."""
    used: dict[str, float] = {group: 0.0 for group in GROUPS}
    drivers: list[float] = []
    lost = []
    for key in before.times.keys() | after.times.keys():
        start, end = before.times.get(key, Times(0.0, 0.0)), after.times.get(key)
        name, pid = key
        if end is None:
            lost.append(f"{name} (pid {pid})")
            continue
        own = end.own_s - start.own_s
        group = _group(name)
        if group == "driver":
            drivers.append(own)
        elif group == "workers":
            used["workers"] += own
            used["workers_children"] += end.tree_s - start.tree_s
        else:
            used[group] = used.get(group, 0.0) + own
    drivers.sort(reverse=True)
    used["driver_leader"] = drivers[0] if drivers else 0.0
    used["driver_standby"] = sum(drivers[1:])
    return CpuUse({group: round(seconds * 1000 / n_jobs, 3) for group, seconds in used.items()}, lost)
