"""Scheduling beyond the peers (issue 41), on real processes (`corral up`, up to two local workers of four
cores).

Hold and release: a held batch's jobs, and those a later update adds, stay Ready and never start (ExplainJob
says HELD) while the batch's other jobs run; a held job waits while its neighbours run; each starts once
released.

Quotas: a billing project's quota of 4 running cores holds on a pool of 8 (never more than 4 of its one-core
jobs run at once, by their attempts' start and end times), its waiting jobs say QUOTA_REACHED, and all
succeed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import corral
from corral.batch.v1 import job_explanation_pb2, job_state_pb2
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

HELD_FOR_S = 6.0
"""How long the held jobs are watched not starting: several scheduler cycles (one a second or sooner)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    # 8 cores in all, so that a quota of 4 is what holds a project's jobs back, not the pool.
    cluster = up.start(tmp_path_factory.mktemp("scheduling"), "--worker-cores", "4", "--max-workers", "2")
    yield from up.running(cluster)


def states(client: corral.Client, batch_id: int) -> dict[int, str]:
    return {j.job_id: job_state_pb2.JobState.Name(j.state).removeprefix("JOB_STATE_").lower()
            for j in client.jobs(batch_id)}


def never_started(client: corral.Client, batch_id: int, job_ids: list[int]) -> None:
    """The jobs stay ready, and say why, for HELD_FOR_S."""
    ends = time.monotonic() + HELD_FOR_S
    while time.monotonic() < ends:
        now = states(client, batch_id)
        assert all(now[j] == "ready" for j in job_ids), now
        time.sleep(0.5)
    for job_id in job_ids:
        [reason] = client.explain_job(batch_id, job_id).reasons
        assert reason.code == job_explanation_pb2.WAIT_REASON_CODE_HELD, reason


@pytest.mark.timeout(300)
def test_a_held_batch_does_not_run_until_released(cluster: Cluster) -> None:
    with cluster.client() as client:
        first = corral.BatchBuilder("default", attributes={"test": "hold"})
        first.job("busybox", "true", cores=0.5)
        batch_id = client.submit(first).batch_id
        eventually(lambda: states(client, batch_id)[1] == "succeeded", 120, 0.2, "the first job to succeed")
        assert client.hold(batch_id) == "held"
        more = corral.BatchBuilder("default")
        for _ in range(4):
            more.job("busybox", "true", cores=0.5)
        start = client.update(batch_id, more).update.start_job_id
        added = list(range(start, start + 4))
        never_started(client, batch_id, added)
        # One job of another batch, held alone (while it waits on its parent, so before it could start), stays
        # ready while its neighbours run.
        other = corral.BatchBuilder("default", attributes={"test": "hold-one"})
        parent = other.job("busybox", "sleep 3", cores=0.5)
        other.job("busybox", "true", cores=0.5)
        other.job("busybox", "true", cores=0.5, parents=[parent])
        neighbours = client.submit(other).batch_id
        assert client.hold(neighbours, job_id=3) == "held"
        eventually(lambda: {states(client, neighbours)[j] for j in (1, 2)} == {"succeeded"}, 120, 0.2,
                   "the held job's neighbours to succeed")
        never_started(client, neighbours, [3])
        assert client.release(neighbours, job_id=3) == "released"
        assert client.release(batch_id) == "released"
        done = client.wait(batch_id, progress=False)
        assert done.counts.n_succeeded == done.counts.n_jobs == 5
        assert client.wait(neighbours, progress=False).counts.n_succeeded == 3


def peak_cores_mcpu(jobs: list) -> int:
    """The most cores the jobs' attempts held at once, from their start and end times (an end before a start at
    the same instant)."""
    edges = []
    for job in jobs:
        for attempt in job.attempts:
            if attempt.HasField("started_at"):
                assert attempt.HasField("ended_at"), attempt
                edges.append((attempt.started_at.ToNanoseconds(), 1, job.resources.cores_mcpu))
                edges.append((attempt.ended_at.ToNanoseconds(), 0, -job.resources.cores_mcpu))
    held, peak = 0, 0
    for _, _, change in sorted(edges):
        held += change
        peak = max(peak, held)
    return peak


@pytest.mark.timeout(300)
def test_a_quota_of_four_cores_holds(cluster: Cluster) -> None:
    """A project of its own (the module's other tests use `default`), its quota set with the CLI as a user
    writes it."""
    with cluster.client() as client:
        client.create_billing_project("quota-e2e")  # the administrator is its member
        quota = cluster.cli("quotas", "set", "quota-e2e", "--running-cores", "4")
        assert quota.returncode == 0 and "running_cores=4 " in quota.stdout, quota.stdout + quota.stderr
        batch = corral.BatchBuilder("quota-e2e", attributes={"test": "quota"})
        for _ in range(12):
            batch.job("busybox", "sleep 2", cores=1)
        batch_id = client.submit(batch).batch_id

        def one_waits_for_the_quota() -> bool:
            ready = [j.job_id for j in client.jobs(batch_id) if j.state == job_state_pb2.JOB_STATE_READY]
            return any(r.code == job_explanation_pb2.WAIT_REASON_CODE_QUOTA_REACHED and "quota-e2e" in r.detail
                       for job_id in ready[:3] for r in client.explain_job(batch_id, job_id).reasons)
        eventually(one_waits_for_the_quota, 120, 0.3, "a job to wait for the project's quota")
        done = client.wait(batch_id, progress=False)
        assert done.counts.n_succeeded == done.counts.n_jobs == 12
        jobs = list(client.jobs(batch_id, with_attempts=True))
        assert all(job.resources.cores_mcpu == 1000 for job in jobs)
        assert 0 < peak_cores_mcpu(jobs) <= 4000
        listed = cluster.cli("quotas", "ls")
        assert "project quota-e2e  running_cores=4  " in listed.stdout, listed.stdout + listed.stderr
