"""A job's scratch storage on real processes (`corral up`, one local worker
of two cores per pool): a job asking for 10 PB is refused by
`client.submit`, naming the field, the amount and the machine, and nothing
is written; one asking for 1 GiB runs, on a worker that reported its pool's
16 GiB, and GetJob shows what it reserved."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import corral
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster

GIB = 2**30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = up.start(tmp_path_factory.mktemp("resources"), "--worker-cores", "2", "--max-workers", "1")
    yield from up.running(cluster)


@pytest.mark.timeout(300)
def test_a_job_asking_10_pb_of_storage_is_refused_and_one_asking_1_gib_runs(cluster: Cluster) -> None:
    def written() -> list[dict[str, object]]:
        return cluster.query("SELECT (SELECT COUNT(*) FROM batches) AS batches, (SELECT COUNT(*) FROM jobs) AS jobs")

    before = written()
    huge = corral.BatchBuilder("default", attributes={"test": "storage"})
    huge.job("busybox", "true")
    huge.job("busybox", "true", storage_bytes=10 * 10**15)
    small = corral.BatchBuilder("default", attributes={"test": "storage"})
    small.job("busybox", "echo stored", storage_bytes=GIB)
    with cluster.client() as client:
        with pytest.raises(corral.InvalidArgument) as refused:
            client.submit(huge)
        assert written() == before  # nothing written
        batch_id = client.submit(small).batch_id
        done = client.wait(batch_id)
        job = client.get_job(batch_id, 1)
    assert [(v.field, v.description) for v in refused.value.field_violations] == [
        ("jobs[1].resources.storage_bytes", "8.9 PiB is more than the largest standard machine has (16 GiB)")]
    assert done.counts.n_succeeded == 1
    assert (job.resources.storage_bytes, job.resources.pool) == (GIB, "standard")
    [ran_on] = cluster.query("SELECT i.storage_bytes FROM attempts a JOIN instances i ON i.name = a.instance_name "
                             "WHERE a.batch_id = %s", [batch_id])
    assert ran_on["storage_bytes"] == 16 * GIB  # the pool's, as its worker reported it
