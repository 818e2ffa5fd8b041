"""Whether a job can ever run on this deployment, and what a job that waits for a machine waits for.

A job goes to one instance collection (`services.frontend.validate.choose_pool`): a pool of shared
machines (highcpu, standard, highmem), or the job-private collection for a job that names a
`machine_type`. It can ever run only if that collection exists, is enabled, and can make a machine that
holds it: a pool's machine (`worker_cores`, `worker_memory_bytes`, `worker_storage_bytes`) at least as
large as the job, and for a job-private machine a provider whose autoscaler makes machines of a named
type. The frontend refuses at submission a job for which `never_runs` gives a reason (INVALID_ARGUMENT,
nothing written); ExplainJob gives the same reason for a job accepted before the deployment changed.

`machine_outlook` says what a job that fits its pool but finds no room waits for, and whether it comes:
a machine the autoscaler is creating, one it will create, or none while the pool is at its
`max_instances`.

Pure: the deployment is the rows of `instance_collections`, read by the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from services.policy.sizes import binary_size

JOB_PRIVATE = "job-private"
"""The instance collection of jobs that name a machine type (one machine per job)."""

JOB_PRIVATE_PROVIDERS: frozenset[str] = frozenset()
"""Providers whose machines the autoscaler makes one per job, of the type the job names. None yet: the
autoscaler makes machines for the pools only (services.driver.autoscaler reads `is_pool` rows), and the
local provider runs its workers as processes of its pools' sizes. The GCP provider can create a named
type (`InstanceRequest.machine_type`): once the autoscaler asks it for job-private machines, "gcp" goes
here and such jobs are accepted where the job-private collection is on GCP."""


@dataclasses.dataclass(frozen=True)
class InstanceCollection:
    """A row of `instance_collections`: a pool, or the job-private collection."""

    name: str
    is_pool: bool
    provider: str
    """local, gcp or azure."""
    cores_mcpu: int = 0
    """Its machines' cores (a pool's; 0 for the job-private collection or when not known)."""
    memory_bytes: int = 0
    """Its machines' memory (0: not known, not checked)."""
    storage_bytes: int = 0
    """Its machines' scratch storage (0: not known, not checked)."""
    max_instances: int = 0
    """The most machines it may have at once."""
    enabled: bool = True
    """A disabled collection gets no machines."""
    machine_type: str = ""
    """The type of its machines as its provider names them ('' when none is fixed: job-private)."""
    spot: bool = False
    """Its machines are spot / preemptible."""
    paused_by: str | None = None
    """Who paused the pool (None: it runs): nothing new starts there and it gets no new machine."""
    time_paused_ms: int | None = None


@dataclasses.dataclass(frozen=True)
class Deployment:
    """The instance collections of a deployment."""

    collections: tuple[InstanceCollection, ...]

    def get(self, name: str) -> InstanceCollection | None:
        return next((c for c in self.collections if c.name == name), None)

    def pools(self) -> list[InstanceCollection]:
        """The enabled pools, in the order of their rows."""
        return [c for c in self.collections if c.is_pool and c.enabled]

    def describe(self) -> str:
        """'pools: highcpu, standard, highmem on local' (each provider's pools), or 'no pools'."""
        by_provider: dict[str, list[str]] = {}
        for pool in self.pools():
            by_provider.setdefault(pool.provider, []).append(pool.name)
        if not by_provider:
            return "no pools"
        return "pools: " + "; ".join(f"{', '.join(names)} on {provider}" for provider, names in by_provider.items())


@dataclasses.dataclass(frozen=True)
class Needs:
    """What a job needs of a machine, as its row (or `choose_pool`) says."""

    pool: str
    """Its instance collection."""
    cores_mcpu: int
    memory_bytes: int = 0
    storage_bytes: int = 0
    machine_type: str = ""
    """The machine type it names (a job-private job's; '' when not known)."""


def oversize(job: Needs, machine: InstanceCollection) -> list[tuple[str, str]]:
    """Each of cores, memory and scratch storage the job asks more of than `machine` has, as (resource,
    'N is more than the largest POOL machine has (M)'); a size the machine does not know (0) is not
    checked."""
    found = []
    if machine.cores_mcpu and job.cores_mcpu > machine.cores_mcpu:
        found.append(("cores_mcpu", f"{job.cores_mcpu / 1000:g} cores is more than the largest {machine.name} "
                                    f"machine has ({machine.cores_mcpu / 1000:g})"))
    for resource, size, most in (("memory_bytes", job.memory_bytes, machine.memory_bytes),
                                 ("storage_bytes", job.storage_bytes, machine.storage_bytes)):
        if most and size > most:
            found.append((resource, f"{binary_size(size)} is more than the largest {machine.name} machine has "
                                    f"({binary_size(most)})"))
    return found


def never_runs(job: Needs, deployment: Deployment,
               job_private_providers: Iterable[str] = JOB_PRIVATE_PROVIDERS) -> str | None:
    """Why no machine of `deployment` can ever run `job`, in one line; None when one can (it may still
    wait for room)."""
    collection = deployment.get(job.pool)
    if job.pool == JOB_PRIVATE or (collection is not None and not collection.is_pool):
        named = f"machine_type {job.machine_type}" if job.machine_type else "a machine of its own (machine_type)"
        if collection is None or not collection.enabled or collection.provider not in set(job_private_providers):
            return f"{named}: no pool of this deployment offers it ({deployment.describe()}); ask for cores and " \
                   "memory instead"
        return None
    if collection is None or not collection.enabled:
        state = "is disabled" if collection is not None else "does not exist"
        return f"its pool, {job.pool} (chosen by its memory per core), {state} in this deployment " \
               f"({deployment.describe()})"
    too_big = oversize(job, collection)
    if too_big:
        return "; ".join(text for _, text in too_big)
    return None


@dataclasses.dataclass(frozen=True)
class PoolMachines:
    """A pool's machines now, as ExplainJob reads them."""

    n_starting: int
    """Machines created and not yet active (pending): their workers take jobs once they start."""
    n_active: int
    max_instances: int


def machine_outlook(pool: str, machines: PoolMachines | None) -> str:
    """What a job that fits `pool`'s machines but finds none with room waits for, and whether it comes."""
    if machines is None:
        return "the autoscaler adds machines while the pool has room"
    live = machines.n_starting + machines.n_active
    if machines.n_starting:
        return f"waiting for a machine: the autoscaler is creating {_machines(machines.n_starting)} for pool {pool}"
    if machines.max_instances <= 0:
        return f"pool {pool} has max_instances {machines.max_instances}, so no machine is ever added: it waits " \
               "until an operator raises it"
    if live >= machines.max_instances:
        return f"waiting for room: pool {pool} is at its max_instances ({live} of {machines.max_instances} " \
               "machines), so it waits for running jobs to end"
    return f"waiting for a machine: the autoscaler adds one to pool {pool} in its next cycle ({live} of at most " \
           f"{machines.max_instances} machines now)"


def _machines(n: int) -> str:
    return "1 machine" if n == 1 else f"{n} machines"

