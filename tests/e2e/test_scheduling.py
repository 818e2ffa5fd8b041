"""Scheduling beyond the peers (issue 41), on real processes (`corral up`, two local workers of two cores).

Hold and release: a held batch's jobs, and those a later update adds, stay Ready and never start (ExplainJob
says HELD) while the batch's other jobs run; a held job waits while its neighbours run; each starts once
released."""

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
    cluster = up.start(tmp_path_factory.mktemp("scheduling"), "--worker-cores", "2", "--max-workers", "2")
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
