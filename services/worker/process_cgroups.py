"""The process runtime's cgroups: a pids.max on each isolated attempt, below
its worker's and its deployment's (worker_cgroup.py, host_limits.py), so
that its jobs cannot take the host's process ids as a fork bomb would (the
RLIMIT_NPROC of each attempt's own uid bounds one job, not all of them).

The jobs' processes join their attempt's cgroup from the job launcher's
child before they fork (jobinit.py). Only the pids controller is used:
the process runtime limits no cpu, and memory only per process.

Where the host's cgroups cannot be written (no pids controller, a read-only
/sys/fs/cgroup in a container), jobs run without these caps, as before:
the worker says so when it starts and in each job's isolation note.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from services.worker.host_limits import attempt_max_processes, default_deployment_max_processes, worker_max_processes
from services.worker.oci.cgroups import AttemptCgroup, CgroupError, Hierarchies, remove_tree
from services.worker.worker_cgroup import ProcessRuntimeClaim, WorkerCgroup, host_pid_max

logger = logging.getLogger(__name__)


class ProcessCgroups:
    """A process runtime's worker cgroup and its attempts' (see the module's docstring)."""

    def __init__(self, claims_dir: Path, cgroup_root: str, deployment: str, owner: str, cores_mcpu: int,
                 per_core: int, base: int, per_job: int, deployment_max: int):
        self._claim = ProcessRuntimeClaim(claims_dir, owner)
        self._cgroup_root, self._deployment, self._owner = cgroup_root, deployment, owner
        self.cores_mcpu = cores_mcpu
        self.max_processes = worker_max_processes(cores_mcpu, per_core, base)
        """The worker's pids.max."""
        self._per_job = per_job
        self._deployment_max = deployment_max
        self._worker: WorkerCgroup | None = None
        self._starting = threading.Lock()  # attempts that start together each ask for it, from threads
        self.why_not = ""
        """Why jobs run without process caps, if they do (known once `start` ran)."""

    def attempt_max_processes(self, job_cores_mcpu: int) -> int:
        """An attempt's pids.max: its cores' share of the worker's cap, at most the per-job cap."""
        return attempt_max_processes(job_cores_mcpu, self.cores_mcpu, self.max_processes, self._per_job)

    @property
    def started(self) -> bool:
        return self._worker is not None or bool(self.why_not)

    def start(self) -> None:
        """Claim the worker's name, remove what dead process runtimes left, make the worker's cgroup with its
        cap. Blocking; once, however many threads ask. Where it cannot, `why_not` says why (logged)."""
        with self._starting:
            if not self.started:
                self._start()

    def _start(self) -> None:
        try:
            hierarchies = Hierarchies.of_host()
            if "pids" not in hierarchies.by_controller:
                raise CgroupError("the pids cgroup controller is not mounted")
            worker = WorkerCgroup(hierarchies, self._cgroup_root, self._deployment, self._owner, ("pids",))
            if not self._claim.claim(worker.path):
                raise CgroupError(f"another process runtime named {self._owner!r} runs on this host")
            for what in self._claim.remove_dead(hierarchies):
                logger.warning("process runtime %s: could not clean up %s", self._owner, what)
            worker.create(self.max_processes,
                          self._deployment_max or default_deployment_max_processes(host_pid_max()))
            self._worker = worker
        except (CgroupError, OSError) as e:
            self._claim.release()
            self.why_not = f"its processes are not in cgroups of their own: {e}"
            logger.warning("process runtime %s: jobs run without process caps: %s", self._owner, self.why_not)

    def attempt(self, name: str, job_cores_mcpu: int) -> AttemptCgroup | None:
        """The attempt's cgroup, made with its cap (None where the worker has no cgroups); raises CgroupError."""
        if self._worker is None:
            return None
        if not self._worker.exists():  # an operator or a cleanup took it: made again, with its cap, first
            self._worker.create(self.max_processes,
                                self._deployment_max or default_deployment_max_processes(host_pid_max()))
        return AttemptCgroup.create_for_processes(self._worker.hierarchies, f"{self._worker.path}/{name}",
                                                  self.attempt_max_processes(job_cores_mcpu))

    def remove(self, cgroup: AttemptCgroup) -> list[str]:
        """Remove an attempt's cgroup (killing whatever is left in it); what could not be, in words."""
        return remove_tree(cgroup.hierarchies, cgroup.path)

    def close(self) -> None:
        """Remove the worker's cgroup (and the deployment's, if no other worker's is left) and let the name go."""
        with self._starting:
            self._close()

    def _close(self) -> None:
        if self._worker is not None:
            left = self._worker.remove()
            for what in left:
                logger.warning("process runtime %s: could not clean up %s", self._owner, what)
            self._claim.release(removed=not left)
            self._worker = None
        self.why_not = ""
