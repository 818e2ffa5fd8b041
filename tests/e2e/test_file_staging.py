"""Jobs' files through a real `corral up` (issue 13, acceptance 5): a
3-job pipeline moves a file from job 1's output_files to job 2's input_files,
and job 2's own output on to job 3, through each kind of storage root at once:
`file://`, `gs://` (gcp-storage-emulator on loopback) and `az://` (Azurite on
loopback). corral up hands the workers the emulators' endpoint and the
Azurite connection string (in a 0600 file, never on a command line) through
its own options. A job
whose input does not exist ends in Error, its message naming the step and the
file."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

import corral
from corral.batch.v1 import job_spec_pb2 as js
from corral.batch.v1 import job_state_pb2
from services.common.storage_access import StorageAccess
from services.worker.object_stores import ObjectStores
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster
from tests.storage_emulators import AZURITE_KEY, Emulator

BUCKET = f"corral-e2e-{uuid.uuid4().hex[:8]}"
"""The GCS bucket and the Azure container the storage roots are in."""


@pytest.fixture(scope="module")
def stores(gcs_emulator: Emulator, azurite: Emulator,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStores]:
    """The test's own view of the emulators (as a worker sees them), with the bucket and container made."""
    secrets = tmp_path_factory.mktemp("secrets")
    connection = secrets / "azure.conn"
    connection.write_text(azurite.connection_string)
    connection.chmod(0o600)
    stores = ObjectStores(StorageAccess(gcs_endpoint=gcs_emulator.endpoint, gcs_anonymous=True,
                                        azure_connection_string_file=connection))
    for scheme in ("gs", "az"):
        stores.locate(f"{scheme}://{BUCKET}").fs.mkdir(BUCKET)
    yield stores
    stores.close()


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The storage root of billing project `default` for each scheme."""
    local = tmp_path_factory.mktemp("storage")
    local.chmod(0o700)
    return {"file": f"file://{local}/default/", "gs": f"gs://{BUCKET}/default/", "az": f"az://{BUCKET}/default/"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, stores: ObjectStores, roots: dict[str, str]) -> Iterator[Cluster]:
    access = stores.access
    templates = [root.replace("/default/", "/{project}/") for root in roots.values()]
    cluster = up.start(tmp_path_factory.mktemp("staging"), "--worker-cores", "2", "--max-workers", "1",
                       *(a for template in templates for a in ("--storage-root", template)), *access.to_args())
    yield from up.running(cluster)


def pipeline(builder: corral.BatchBuilder, scheme: str, root: str) -> None:
    """Job 1 writes a file; job 2 reads it and writes a directory with its own file; job 3 reads that directory,
    checks the file and writes a third."""
    one = builder.add_job(js.JobSpec(
        image="busybox", script=f"echo 'hello from {scheme}' > out.txt", attributes={"name": f"{scheme}-1"},
        output_files=[js.OutputFile(from_path="/out.txt", to_url=f"{root}pipeline/one.txt")]))
    two = builder.add_job(js.JobSpec(
        image="busybox", script="mkdir out && tr a-z A-Z < in/one.txt > out/two.txt",
        attributes={"name": f"{scheme}-2"},
        input_files=[js.InputFile(from_url=f"{root}pipeline/one.txt", to_path="/in/one.txt")],
        output_files=[js.OutputFile(from_path="/out", to_url=f"{root}pipeline/out")]), parents=[one])
    builder.add_job(js.JobSpec(
        image="busybox", attributes={"name": f"{scheme}-3"},
        script=f"grep -qx 'HELLO FROM {scheme.upper()}' two/two.txt && echo checked > three.txt",
        input_files=[js.InputFile(from_url=f"{root}pipeline/out", to_path="/two")],
        output_files=[js.OutputFile(from_path="/three.txt", to_url=f"{root}pipeline/three.txt")]), parents=[two])


@pytest.mark.timeout(300)
def test_a_file_moves_through_a_pipeline_in_every_kind_of_storage(cluster: Cluster, stores: ObjectStores,
                                                                 roots: dict[str, str]) -> None:
    builder = corral.BatchBuilder("default", attributes={"test": "file staging"})
    for scheme, root in roots.items():
        pipeline(builder, scheme, root)
    missing = f"{roots['gs']}no/such/object.txt"
    builder.add_job(js.JobSpec(image="busybox", script="true", max_attempts=1, attributes={"name": "missing"},
                               input_files=[js.InputFile(from_url=missing, to_path="/in/x")]))
    with cluster.client() as client:
        batch_id = client.submit(builder).batch_id
        client.wait(batch_id)
        jobs = {job.attributes["name"]: client.get_job(batch_id, job.job_id)
                for job in client.jobs(batch_id)}

    def read(url: str) -> str:
        location = stores.locate(url)
        return location.fs.cat_file(location.path).decode()

    failed = {name: (job_state_pb2.JobState.Name(job.state), job.error_message)
              for name, job in jobs.items() if name != "missing" and job.state != job_state_pb2.JOB_STATE_SUCCEEDED}
    assert failed == {}
    for scheme, root in roots.items():
        assert read(f"{root}pipeline/one.txt") == f"hello from {scheme}\n"
        assert read(f"{root}pipeline/out/two.txt") == f"HELLO FROM {scheme.upper()}\n"
        assert read(f"{root}pipeline/three.txt") == "checked\n"
    # The workers that did this hold the account key; no command line does (every local account reads them).
    assert cluster.worker_pids()
    assert not [argv for argv in up.processes().values() if any(AZURITE_KEY in arg for arg in argv)]
    assert jobs["missing"].state == job_state_pb2.JOB_STATE_ERROR
    assert jobs["missing"].error_message == (f"copying input files failed: {missing} -> /in/x: "
                                             f"{missing} does not exist")
