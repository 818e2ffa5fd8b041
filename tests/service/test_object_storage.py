"""Jobs' files in object stores, against real protocol servers on loopback:
gs:// on gcp-storage-emulator, az:// on Azurite (tests/storage_emulators.py).
The copy functions (services/worker/job_files.py, through object_stores.py)
move files and directories both ways; a missing object, a missing bucket,
refused credentials and an endpoint that is down each end the copy with an
error naming the URL, within the storage timeout; and the process runtime
turns a failed copy into Error (the system's failure, not the job's), with
the step and the file in its message."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.common.storage_access import StorageAccess
from services.up.ports import free_port
from services.worker.job_files import CopyRefused, allow_all_urls, copy_inputs, copy_outputs
from services.worker.logs import LogSink
from services.worker.object_stores import ObjectStores
from services.worker.runtime import JobRun, ProcessRuntime, ProcessRuntimeConfig
from tests.storage_emulators import AZURITE_ACCOUNT, Emulator

pytestmark = pytest.mark.timeout(60)


@dataclasses.dataclass
class Store:
    """A fresh bucket (GCS) or container (Azure) on an emulator, and the worker's view of it."""

    scheme: str
    bucket: str
    stores: ObjectStores

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def read(self, key: str) -> bytes:
        location = self.stores.locate(self.url(key))
        return location.fs.cat_file(location.path)

    def write(self, key: str, data: bytes) -> None:
        location = self.stores.locate(self.url(key))
        location.fs.pipe_file(location.path, data)


def secret_file(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def access_to(scheme: str, emulator: Emulator, tmp_path: Path, **settings: float) -> StorageAccess:
    """How a worker reaches `emulator`: anonymously for GCS, with Azurite's connection string in a 0600 file."""
    if scheme == "gs":
        return StorageAccess(gcs_endpoint=emulator.endpoint, gcs_anonymous=True, **settings)
    return StorageAccess(azure_connection_string_file=secret_file(tmp_path / "azure.conn", emulator.connection_string),
                         **settings)


@pytest.fixture(params=["gs", "az"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    scheme = request.param
    emulator = request.getfixturevalue("gcs_emulator" if scheme == "gs" else "azurite")
    stores = ObjectStores(access_to(scheme, emulator, tmp_path))
    made = Store(scheme, f"corral-{uuid.uuid4().hex[:12]}", stores)
    stores.locate(made.url("")).fs.mkdir(made.bucket)
    try:
        yield made
    finally:
        stores.close()


def spec(inputs: dict[str, str] | None = None, outputs: dict[str, str] | None = None,
         script: str = "true") -> js.JobSpec:
    """A spec copying `inputs` (URL -> container path) in and `outputs` (container path -> URL) out."""
    return js.JobSpec(image="x", script=script,
                      input_files=[js.InputFile(from_url=u, to_path=p) for u, p in (inputs or {}).items()],
                      output_files=[js.OutputFile(from_path=p, to_url=u) for p, u in (outputs or {}).items()])


def work_dir(tmp_path: Path, name: str) -> Path:
    work = tmp_path / name
    work.mkdir(mode=0o700)
    return work


def test_files_and_directories_go_out_to_the_store_and_come_back_in(store: Store, tmp_path: Path) -> None:
    out = work_dir(tmp_path, "job1")
    (out / "out" / "dir" / "a").mkdir(parents=True)
    (out / "out" / "result.txt").write_text("result\n")
    (out / "out" / "dir" / "top.txt").write_text("top\n")
    (out / "out" / "dir" / "a" / "b.txt").write_text("nested\n")
    copy_outputs(spec(outputs={"/out/result.txt": store.url("proj/result.txt"),
                               "/out/dir": store.url("proj/dir")}),
                 out, os.getuid(), allow_all_urls, stores=store.stores)
    assert store.read("proj/result.txt") == b"result\n"
    assert store.read("proj/dir/a/b.txt") == b"nested\n"

    back = work_dir(tmp_path, "job2")
    copy_inputs(spec(inputs={store.url("proj/result.txt"): "/in/result.txt", store.url("proj/dir"): "/in/dir"}),
                back, allow_all_urls, stores=store.stores)
    assert (back / "in" / "result.txt").read_text() == "result\n"
    assert (back / "in" / "dir" / "top.txt").read_text() == "top\n"
    assert (back / "in" / "dir" / "a" / "b.txt").read_text() == "nested\n"
    assert sorted(p.name for p in (back / "in" / "dir").iterdir()) == ["a", "top.txt"]


# gcsfs hands aiohttp a large upload as bytes, which it warns about (a ResourceWarning, silent outside tests);
# the copy itself is what is tested here.
@pytest.mark.filterwarnings("ignore:Sending a large body directly with raw bytes:ResourceWarning")
def test_a_large_file_goes_out_and_comes_back_whole(store: Store, tmp_path: Path) -> None:
    data = os.urandom(12 * 2**20 + 3)  # over 5 MiB, gcsfs uploads with GCS's resumable protocol
    out = work_dir(tmp_path, "out")
    (out / "big").write_bytes(data)
    copy_outputs(spec(outputs={"/big": store.url("p/big")}), out, os.getuid(), allow_all_urls, stores=store.stores)
    back = work_dir(tmp_path, "back")
    copy_inputs(spec(inputs={store.url("p/big"): "/big"}), back, allow_all_urls, stores=store.stores)
    assert (back / "big").read_bytes() == data


def test_an_object_written_a_moment_ago_is_seen(store: Store, tmp_path: Path) -> None:
    """Listings are not cached: the worker that listed a prefix sees what another job added to it since."""
    store.write("p/dir/one", b"1")
    first = work_dir(tmp_path, "first")
    copy_inputs(spec(inputs={store.url("p/dir"): "/d"}), first, allow_all_urls, stores=store.stores)
    store.write("p/dir/two", b"2")
    second = work_dir(tmp_path, "second")
    copy_inputs(spec(inputs={store.url("p/dir"): "/d"}), second, allow_all_urls, stores=store.stores)
    assert sorted(p.name for p in (second / "d").iterdir()) == ["one", "two"]


def test_a_missing_object_or_bucket_is_named(store: Store, tmp_path: Path) -> None:
    missing = store.url("proj/missing.txt")
    with pytest.raises(CopyRefused) as refused:
        copy_inputs(spec(inputs={missing: "/in/x"}), work_dir(tmp_path, "in"), allow_all_urls, stores=store.stores)
    assert str(refused.value) == f"{missing} -> /in/x: {missing} does not exist"

    out = work_dir(tmp_path, "out")
    (out / "x").write_text("x")
    nowhere = f"{store.scheme}://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
    with pytest.raises(CopyRefused) as refused:
        copy_outputs(spec(outputs={"/x": nowhere}), out, os.getuid(), allow_all_urls, stores=store.stores)
    assert str(refused.value) == f"/x -> {nowhere}: the bucket or container of {nowhere} does not exist"


def test_gcs_is_read_without_probing_the_bucket_type_over_grpc(gcs_emulator: Emulator, tmp_path: Path) -> None:
    """gcsfs's default class asks a gRPC API what the bucket is and waits 60 s where nothing answers it; the
    worker's plain JSON-API class asks nothing."""
    import gcsfs.core

    stores = ObjectStores(access_to("gs", gcs_emulator, tmp_path))
    try:
        location = stores.locate("gs://fresh-bucket/key")
        assert type(location.fs) is gcsfs.core.GCSFileSystem
        location.fs.mkdir("fresh-bucket")
        started = time.monotonic()
        location.fs.pipe_file(location.path, b"fast")
        copy_inputs(spec(inputs={"gs://fresh-bucket/key": "/k"}), work_dir(tmp_path, "w"), allow_all_urls,
                    stores=stores)
        assert time.monotonic() - started < 5
    finally:
        stores.close()


def test_refused_credentials_end_the_copy_naming_the_file(azurite: Emulator, tmp_path: Path) -> None:
    """Azurite checks the account key (the GCS emulator checks no credentials at all)."""
    right = ObjectStores(access_to("az", azurite, tmp_path))
    wrong_key = azurite.connection_string.replace("AccountKey=", "AccountKey=AAAA")
    wrong = ObjectStores(StorageAccess(azure_connection_string_file=secret_file(tmp_path / "wrong.conn", wrong_key)))
    url = f"az://corral-{uuid.uuid4().hex[:12]}/in.txt"
    try:
        location = right.locate(url)
        location.fs.mkdir(location.path.split("/")[0])
        location.fs.pipe_file(location.path, b"in")
        with pytest.raises(CopyRefused) as refused:
            copy_inputs(spec(inputs={url: "/in.txt"}), work_dir(tmp_path, "w"), allow_all_urls, stores=wrong)
    finally:
        right.close()
        wrong.close()
    message = str(refused.value)
    assert message.startswith(f"{url} -> /in.txt: ") and "authenticat" in message.lower(), message
    assert len(message) < 500  # one line, not the server's whole answer


@pytest.mark.parametrize("scheme", ["gs", "az"])
def test_an_endpoint_that_is_down_ends_the_copy_within_the_timeout(scheme: str, tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    connection = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey=a2V5;"
                  f"BlobEndpoint={down}/{AZURITE_ACCOUNT};")
    access = (StorageAccess(gcs_endpoint=down, gcs_anonymous=True, copy_timeout_s=2) if scheme == "gs" else
              StorageAccess(azure_connection_string_file=secret_file(tmp_path / "down.conn", connection),
                            copy_timeout_s=2))
    stores = ObjectStores(access)
    url = f"{scheme}://bucket/in.txt"
    started = time.monotonic()
    try:
        with pytest.raises(CopyRefused) as refused:
            copy_inputs(spec(inputs={url: "/in.txt"}), work_dir(tmp_path, "w"), allow_all_urls, stores=stores)
    finally:
        stores.close()
    assert time.monotonic() - started < 10  # gcsfs alone retries a refused connection for half a minute
    assert str(refused.value).startswith(f"{url} -> /in.txt: "), refused.value


async def test_the_process_runtime_copies_through_the_store_and_a_failed_copy_is_an_error(
        store: Store, tmp_path: Path) -> None:
    runtime = ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True, object_stores=store.stores))

    async def run(job_spec: js.JobSpec, attempt_id: str) -> tuple[str, str, int | None, str]:
        job = JobRun(batch_id=1, job_id=1, attempt_id=attempt_id, spec=job_spec, cores_mcpu=1000, memory_bytes=0,
                     scratch=tmp_path / "scratch")

        async def started(pid: int) -> None:
            pass

        outcome = await runtime.run(job, LogSink(job.log_path), started)
        return outcome.state, outcome.end_reason, outcome.exit_code, outcome.error_message

    try:
        store.write("proj/in.txt", b"shout\n")
        shout = spec(inputs={store.url("proj/in.txt"): "/in/in.txt"}, outputs={"/out.txt": store.url("proj/out.txt")},
                     script="tr a-z A-Z < in/in.txt > out.txt")
        assert await run(shout, "ok") == ("Success", "exited", 0, "")
        assert store.read("proj/out.txt") == b"SHOUT\n"

        missing = store.url("proj/missing.txt")
        state, reason, code, message = await run(spec(inputs={missing: "/in/x"}), "no-input")
        assert (state, reason, code) == ("Error", "system_error", None)
        assert message == f"copying input files failed: {missing} -> /in/x: {missing} does not exist"

        nowhere = f"{store.scheme}://no-such-bucket-{uuid.uuid4().hex[:8]}/out.txt"
        state, reason, code, message = await run(spec(outputs={"/out.txt": nowhere}, script="echo x > out.txt"),
                                                 "no-bucket")
        assert (state, reason, code) == ("Error", "system_error", 0)
        assert message == (f"copying output files failed: /out.txt -> {nowhere}: "
                           f"the bucket or container of {nowhere} does not exist")
    finally:
        await runtime.close()
