"""The deployment's limits on what jobs take of a worker's host besides cores
and memory: processes (cgroup pids.max at three levels) and how often a
running job's processes and scratch storage are checked.

`corral up` takes these options and hands them to its drivers, and each
driver to the workers it starts (`to_args`), as it does the object-storage
settings; a worker takes them on its own command line. How the caps are
computed from them is `services/worker/host_limits.py`; docs/security.md
(*Limits*) lists each with its default.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
from pathlib import Path

DEPLOYMENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A deployment's name names a cgroup directory: letters, digits, '.', '_' and '-', at most 64."""


@dataclasses.dataclass(frozen=True)
class WorkerLimits:
    """Process and scratch-storage limits of a deployment's workers; every field has a default."""

    deployment: str = "default"
    """The deployment's name on the worker's host: its workers' cgroups are CGROUP_ROOT/DEPLOYMENT/WORKER,
    each attempt's below its worker's, so that every deployment sharing a host has a cap of its own."""
    deployment_max_processes: int = 0
    """pids.max of the deployment's cgroup: the most processes and threads all of its jobs on one host may
    have together. 0: half of the host's kernel.pid_max, read by each worker."""
    max_processes_per_core: int = 1024
    """Per core a worker offers, the processes and threads its jobs may have (1024 is the kernel's own
    scaling of pid_max per cpu)."""
    max_processes_base: int = 1024
    """Added to the per-core figure for the worker's cgroup: pids.max = base + per_core x cores."""
    max_processes_per_job: int = 4096
    """The most processes and threads one attempt may have; an attempt gets less where its cores' share of
    its worker's cap is less."""
    process_check_interval_s: float = 0.5
    """How often a running job's cgroup is read for forks the kernel refused at the job's limit."""
    storage_check_interval_s: float = 1.0
    """How often a running job's scratch use is measured against its storage request (at most: a walk that
    takes long waits ten times its own time before the next)."""

    def problems(self) -> list[str]:
        """What is wrong with these settings, in words naming each option; empty if nothing."""
        found = []
        if not DEPLOYMENT_NAME.fullmatch(self.deployment):
            found.append(f"--deployment {self.deployment!r}: letters, digits, '.', '_' and '-', at most 64")
        for option, value in (("--deployment-max-processes", self.deployment_max_processes),
                              ("--max-processes-base", self.max_processes_base)):
            if value < 0:
                found.append(f"{option} must not be negative")
        for option, value in (("--max-processes-per-core", self.max_processes_per_core),
                              ("--max-processes-per-job", self.max_processes_per_job)):
            if value < 1:
                found.append(f"{option} must be at least 1")
        for option, seconds in (("--process-check-interval", self.process_check_interval_s),
                                ("--storage-check-interval", self.storage_check_interval_s)):
            if not seconds > 0:
                found.append(f"{option} must be positive")
        return found

    def to_args(self) -> list[str]:
        """The command-line options that give a process these settings (`add_arguments`, `from_args`); only
        those that differ from the defaults."""
        args = []
        default = WorkerLimits()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != getattr(default, field.name):
                args += [_OPTIONS[field.name], str(value)]
        return args

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> WorkerLimits:
        """The settings of options added by `add_arguments` (an option not given: its default)."""
        given = {name: getattr(args, name) for name in _OPTIONS if getattr(args, name, None) is not None}
        return cls(**given)


def deployment_of_data_dir(data_dir: Path) -> str:
    """The deployment name `corral up` gives its workers unless told one: `up-` and a hash of its data
    directory's real path, so that two `corral up`s on a host have cgroups of their own and a restarted one
    finds its own again."""
    real = os.path.realpath(os.path.expanduser(data_dir))
    return "up-" + hashlib.sha256(real.encode()).hexdigest()[:12]


_OPTIONS = {"deployment": "--deployment", "deployment_max_processes": "--deployment-max-processes",
            "max_processes_per_core": "--max-processes-per-core", "max_processes_base": "--max-processes-base",
            "max_processes_per_job": "--max-processes-per-job",
            "process_check_interval_s": "--process-check-interval",
            "storage_check_interval_s": "--storage-check-interval"}


def add_arguments(parser: argparse.ArgumentParser, deployment_default: str | None = None) -> None:
    """The options of `WorkerLimits`, for `corral up`, the drivers (which pass them to the workers they start)
    and the workers. `deployment_default` words --deployment's default in the help (`corral up` derives one)."""
    d = WorkerLimits()
    group = parser.add_argument_group(
        "job limits on the worker's host", "processes (cgroup pids.max) and scratch storage (docs/security.md)")
    group.add_argument("--deployment", metavar="NAME",
                       help="the deployment's name on the workers' hosts: its cgroup is /corral/NAME, holding its "
                            f"workers' (default: {deployment_default or d.deployment})")
    group.add_argument("--deployment-max-processes", type=int, metavar="N",
                       help="pids.max of the deployment's cgroup: processes and threads of all its jobs on one "
                            "host together; keep the caps of every deployment on a host together below the host's "
                            "kernel.pid_max (default: half of kernel.pid_max)")
    group.add_argument("--max-processes-per-core", type=int, metavar="N",
                       help="a worker's pids.max is BASE + N x its cores; each job gets its cores' share of it, "
                            f"at most --max-processes-per-job (default: {d.max_processes_per_core})")
    group.add_argument("--max-processes-base", type=int, metavar="BASE",
                       help=f"added to a worker's per-core figure (default: {d.max_processes_base})")
    group.add_argument("--max-processes-per-job", type=int, metavar="N",
                       help="the most processes and threads one job may have; a job that reaches its limit is "
                            f"killed and ends Failed saying so (default: {d.max_processes_per_job})")
    group.add_argument("--process-check-interval", type=float, metavar="SECONDS", dest="process_check_interval_s",
                       help="how often each running job's cgroup is read for forks refused at its limit "
                            f"(default: {d.process_check_interval_s:g})")
    group.add_argument("--storage-check-interval", type=float, metavar="SECONDS", dest="storage_check_interval_s",
                       help="how often each running job's scratch use is measured against its storage request; a "
                            "job over it is killed and ends Failed saying so (default: "
                            f"{d.storage_check_interval_s:g})")
