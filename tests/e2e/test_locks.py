"""Resource locks, enforced, on real processes (`corral up`, four local
workers of two cores): 40 jobs, ten pairs that each hold one exclusive lock,
eighteen readers of one shared lock and two writers of it. From the attempts'
recorded start and end times, no two jobs with clashing locks ever ran at
the same time, and the readers did run together. While a writer waits,
ExplainJob names the lock and the job holding it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import corral
from corral.batch.v1 import job_explanation_pb2, job_spec_pb2
from services.policy.lock_contention import LockMode, LockRequest, conflicts
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster, eventually

SLEEP_S = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = up.start(tmp_path_factory.mktemp("locks"), "--worker-cores", "2", "--max-workers", "4")
    yield from up.running(cluster)


def lock(name: str, exclusive: bool) -> job_spec_pb2.JobLock:
    mode = job_spec_pb2.LOCK_MODE_EXCLUSIVE if exclusive else job_spec_pb2.LOCK_MODE_SHARED
    return job_spec_pb2.JobLock(level="dataset", mode=mode, names=[name])


@pytest.mark.timeout(600)
def test_clashing_locks_never_overlap_and_readers_share(cluster: Cluster) -> None:
    builder = corral.BatchBuilder("default", attributes={"test": "locks"})
    wanted: dict[int, tuple[str, bool]] = {}  # job index -> (lock name, exclusive)
    for i in range(10):
        for _ in range(2):
            wanted[len(wanted)] = (f"pair-{i}", True)
    for i in range(20):
        wanted[len(wanted)] = ("reference", i in (3, 15))  # two writers among the readers
    for name, exclusive in wanted.values():
        builder.job("busybox", f"sleep {SLEEP_S}", cores=1, locks=[lock(name, exclusive)])

    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id

        def a_wait_on_a_lock() -> job_explanation_pb2.WaitReason | None:
            for job_id in range(1, 41):
                for reason in client.explain_job(batch_id, job_id).reasons:
                    if reason.code == job_explanation_pb2.WAIT_REASON_CODE_BLOCKED_BY_LOCK:
                        return reason
            return None

        blocked = eventually(a_wait_on_a_lock, 120, 0.2, "a job waiting on a lock")
        assert blocked.lock.level == "dataset" and list(blocked.lock.names)
        assert blocked.jobs and blocked.jobs[0].batch_id == batch_id
        assert f"held by job {batch_id}/{blocked.jobs[0].job_id}" in blocked.detail
        done = client.wait(batch_id)
    assert done.counts.n_succeeded == 40

    rows = cluster.query("SELECT job_id, start_time_ms, end_time_ms FROM attempts WHERE batch_id = %s "
                         "AND start_time_ms IS NOT NULL", [batch_id])
    assert len(rows) == 40

    def request(job_id: int) -> dict[str, LockRequest]:
        name, exclusive = wanted[job_id - 1]
        return {"dataset": LockRequest(LockMode.EXCLUSIVE if exclusive else LockMode.SHARED, frozenset({name}))}

    overlaps = 0
    readers_together = 0
    for a in rows:
        for b in rows:
            if a["job_id"] >= b["job_id"]:
                continue
            overlap = min(a["end_time_ms"], b["end_time_ms"]) > max(a["start_time_ms"], b["start_time_ms"])
            if overlap and conflicts(request(a["job_id"]), {"dataset": [request(b["job_id"])["dataset"]]}):
                overlaps += 1
            if overlap and not wanted[a["job_id"] - 1][1] and not wanted[b["job_id"] - 1][1] \
                    and wanted[a["job_id"] - 1][0] == wanted[b["job_id"] - 1][0] == "reference":
                readers_together += 1
    assert overlaps == 0
    assert readers_together > 0
