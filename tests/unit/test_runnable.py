"""services.policy.runnable: whether any machine of a deployment can ever run a job, and what a job without
room waits for."""

from __future__ import annotations

import dataclasses

from hypothesis import given
from hypothesis import strategies as st

from services.policy.runnable import (
    JOB_PRIVATE, Deployment, InstanceCollection, Needs, PoolMachines, machine_outlook, never_runs, oversize,
)

GIB = 2**30
# The local pools of migration 0002 (storage: 0017), and the job-private collection on the local provider.
LOCAL = Deployment((
    InstanceCollection("highcpu", True, "local", 2000, 2 * GIB, 16 * GIB, 2),
    InstanceCollection("highmem", True, "local", 2000, 16 * GIB, 16 * GIB, 2),
    InstanceCollection(JOB_PRIVATE, False, "local", max_instances=4),
    InstanceCollection("standard", True, "local", 2000, 8 * GIB, 16 * GIB, 4),
))


def test_a_machine_type_on_the_local_provider_never_runs_and_says_which_pools_there_are() -> None:
    assert never_runs(Needs(JOB_PRIVATE, 1000, machine_type="n2-highmem-8"), LOCAL) == (
        "machine_type n2-highmem-8: no pool of this deployment offers it (pools: highcpu, highmem, standard on "
        "local); ask for cores and memory instead")
    # A job row does not carry its machine type: ExplainJob says what it asked for in the file's words.
    assert never_runs(Needs(JOB_PRIVATE, 1000), LOCAL).startswith(
        "a machine of its own (machine_type): no pool of this deployment offers it")


def test_a_job_private_collection_runs_jobs_only_on_a_provider_that_makes_them_and_when_enabled() -> None:
    cloud = Deployment((InstanceCollection("standard", True, "gcp", 8000, 32 * GIB),
                        InstanceCollection(JOB_PRIVATE, False, "gcp")))
    job = Needs(JOB_PRIVATE, 1000, machine_type="n2-highmem-8")
    assert never_runs(job, cloud) is not None  # no provider makes them yet (JOB_PRIVATE_PROVIDERS)
    assert never_runs(job, cloud, job_private_providers={"gcp"}) is None
    off = Deployment((cloud.collections[0], dataclasses.replace(cloud.collections[1], enabled=False)))
    assert never_runs(job, off, job_private_providers={"gcp"}) == (
        "machine_type n2-highmem-8: no pool of this deployment offers it (pools: standard on gcp); ask for cores "
        "and memory instead")
    assert never_runs(job, Deployment(cloud.collections[:1]), job_private_providers={"gcp"}) is not None


def test_a_disabled_or_missing_pool_never_runs_its_jobs() -> None:
    off = Deployment(tuple(dataclasses.replace(c, enabled=c.name != "highmem") for c in LOCAL.collections))
    assert never_runs(Needs("highmem", 1000, 8 * GIB), off) == (
        "its pool, highmem (chosen by its memory per core), is disabled in this deployment (pools: highcpu, "
        "standard on local)")
    assert never_runs(Needs("gpu", 1000), LOCAL) == (
        "its pool, gpu (chosen by its memory per core), does not exist in this deployment (pools: highcpu, "
        "highmem, standard on local)")
    assert never_runs(Needs("x", 1000), Deployment(())).endswith("(no pools)")


def test_a_job_larger_than_its_pools_machine_never_runs_and_one_that_fits_may() -> None:
    assert never_runs(Needs("standard", 2000, 8 * GIB, 16 * GIB), LOCAL) is None
    assert never_runs(Needs("standard", 4000, 4 * GIB), LOCAL) == \
        "4 cores is more than the largest standard machine has (2)"
    assert never_runs(Needs("highmem", 1000, 32 * GIB, 17 * GIB), LOCAL) == (
        "32 GiB is more than the largest highmem machine has (16 GiB); 17 GiB is more than the largest highmem "
        "machine has (16 GiB)")


POOL = st.builds(InstanceCollection, st.sampled_from(["standard", "highmem"]), st.just(True), st.just("local"),
                 st.integers(0, 64_000), st.integers(0, 2**40), st.integers(0, 2**40), st.integers(0, 10),
                 st.booleans())
NEEDS = st.builds(Needs, st.sampled_from(["standard", "highmem", JOB_PRIVATE]), st.integers(1, 64_000),
                  st.integers(0, 2**40), st.integers(0, 2**40))


@given(NEEDS, POOL)
def test_a_job_runs_ever_exactly_when_its_pool_is_enabled_and_holds_it(job: Needs, pool: InstanceCollection) -> None:
    deployment = Deployment((pool,))
    fits = (not pool.cores_mcpu or job.cores_mcpu <= pool.cores_mcpu) \
        and (not pool.memory_bytes or job.memory_bytes <= pool.memory_bytes) \
        and (not pool.storage_bytes or job.storage_bytes <= pool.storage_bytes)
    runs = job.pool == pool.name and pool.enabled and fits
    assert (never_runs(job, deployment) is None) == runs
    assert bool(oversize(job, pool)) == (not fits)


@given(NEEDS, POOL, st.integers(1, 64_000))
def test_a_smaller_job_of_a_pool_that_runs_a_job_runs_too(job: Needs, pool: InstanceCollection, less: int) -> None:
    """Monotone: taking cores, memory or storage away never makes a runnable job unrunnable."""
    deployment = Deployment((pool,))
    smaller = dataclasses.replace(job, cores_mcpu=max(1, job.cores_mcpu - less),
                                  memory_bytes=max(0, job.memory_bytes - less), storage_bytes=job.storage_bytes // 2)
    if never_runs(job, deployment) is None:
        assert never_runs(smaller, deployment) is None


def test_a_job_without_room_is_told_what_it_waits_for_and_whether_it_comes() -> None:
    assert machine_outlook("standard", PoolMachines(1, 0, 4)) == \
        "waiting for a machine: the autoscaler is creating 1 machine for pool standard"
    assert machine_outlook("standard", PoolMachines(0, 1, 4)) == (
        "waiting for a machine: the autoscaler adds one to pool standard in its next cycle (1 of at most 4 "
        "machines now)")
    assert machine_outlook("standard", PoolMachines(0, 4, 4)) == (
        "waiting for room: pool standard is at its max_instances (4 of 4 machines), so it waits for running jobs "
        "to end")
    assert machine_outlook("standard", PoolMachines(0, 0, 0)) == (
        "pool standard has max_instances 0, so no machine is ever added: it waits until an operator raises it")
    assert machine_outlook("standard", None) == "the autoscaler adds machines while the pool has room"
