"""A job's size on real processes (`corral up`, one local worker of two
cores per pool): a job asking for 10 PB is refused by `client.submit`,
naming the field, the amount and the machine, and nothing is written; one
asking for 1 GiB runs, on a worker that reported its pool's 16 GiB, and
GetJob shows what it reserved. docs/batch-file.md's Defaults example runs as
written through `corral submit`; the one it had before, whose job `big`
named a machine type, is refused in one line naming the job."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

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


def defaults_example() -> str:
    """The batch file of docs/batch-file.md's *Defaults* section, as written there."""
    page = (up.REPO_DIR / "docs" / "batch-file.md").read_text()
    found = re.search(r"^## Defaults\n.*?^```yaml\n(.*?)^```$", page, re.S | re.M)
    assert found is not None
    return found.group(1)


@pytest.mark.timeout(300)
def test_the_defaults_example_runs_as_written_and_a_machine_type_is_refused_naming_the_job(
        cluster: Cluster, tmp_path: Path) -> None:
    example = defaults_example()
    old = tmp_path / "old.yaml"  # the example until issue 36: job big waited for good, Ready
    old.write_text(example.replace("    cores: 2\n    memory_bytes: 8589934592\n", "    machine_type: n2-highmem-8\n"))
    assert "machine_type: n2-highmem-8" in old.read_text()
    before = cluster.query("SELECT COUNT(*) AS n FROM batches")
    refused = cluster.cli("submit", str(old))
    assert refused.returncode == 4, refused.stderr  # EXIT_REFUSED: INVALID_ARGUMENT
    [line] = refused.stderr.splitlines()
    assert "jobs[2] (name: big): machine_type: n2-highmem-8: no pool of this deployment offers it (pools: highcpu, highmem, " \
           "standard on local); ask for cores and memory instead" in line, line
    assert cluster.query("SELECT COUNT(*) AS n FROM batches") == before  # nothing written

    current = tmp_path / "defaults.yaml"
    current.write_text(example)
    submitted = cluster.cli("submit", "-q", str(current))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    waited = cluster.cli("wait", "--quiet", batch_id)
    assert waited.returncode == 0, waited.stdout + waited.stderr  # every job succeeded
    jobs = cluster.query("SELECT inst_coll, cores_mcpu, memory_bytes, state FROM jobs WHERE batch_id = %s "
                         "ORDER BY job_id", [int(batch_id)])
    assert [(j["inst_coll"], j["cores_mcpu"], j["memory_bytes"], j["state"]) for j in jobs] == [
        ("standard", 250, GIB, "Success"), ("highcpu", 1000, GIB, "Success"), ("standard", 2000, 8 * GIB, "Success")]
