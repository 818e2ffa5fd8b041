"""hailtop.batch's test_batch_service_backend.py, test_python_job_in_service.py and test_batch_pool_executor.py,
carried over to corral.pipeline's ServiceBackend against one `corral up` for the module: jobs in runc containers
of the `debian` and `python` base images, files staged by the workers from and to `corral up`'s local storage
(file://). Each test asserts what the original does; those that need what corral does not have say why they are
skipped."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import corral.pipeline as hb
from corral.pipeline import Batch, BatchPoolExecutor, ResourceGroup, ServiceBackend
from tests.e2e import cluster as up
from tests.oci.host import WHY_NOT

pytestmark = pytest.mark.timeout(300)

NOT_GOOGLE = "needs a Google Cloud Storage bucket or project (corral's storage here is file://)"
NO_CLOUDFUSE = "needs cloudfuse: corral does not mount buckets"
NO_REQUESTER_PAYS = "needs requester-pays buckets, which corral has not"
NO_QUERY = "needs Hail Query, which corral does not run"
LOCAL_REGION = "local"
"""The region of corral up's workers."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, module_host_ip_forwarding: None) -> Iterator[up.Cluster]:
    """One corral up whose jobs run in containers of the debian and python base images (from the machine's
    base image cache, tests/conftest.py); the client connects through its profile, as a user's would."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    started = up.start(tmp_path_factory.mktemp("pipeline"), "--worker-runtime", "oci", "--base-images",
                       "python,debian", timeout_s=600)
    before = os.environ.get("CORRAL_CONFIG")
    os.environ["CORRAL_CONFIG"] = started.env["CORRAL_CONFIG"]
    try:
        yield started
    finally:
        if before is None:
            os.environ.pop("CORRAL_CONFIG", None)
        else:
            os.environ["CORRAL_CONFIG"] = before
        started.stop()
    assert started.process.returncode == 0


@pytest.fixture(scope="module")
def storage(cluster: up.Cluster) -> Path:
    """corral up's storage root of the billing project 'default'."""
    path = (cluster.data_dir / "storage" / "default").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def service_backend(storage: Path) -> Iterator[ServiceBackend]:
    with ServiceBackend(billing_project="default", remote_tmpdir=f"file://{storage}/tmp/") as backend:
        yield backend


@pytest.fixture
def output_tmpdir(storage: Path, request: pytest.FixtureRequest) -> str:
    return f"file://{storage}/outputs/{request.node.name}"


@pytest.fixture(scope="module")
def upload_test_files(storage: Path) -> tuple[tuple[str, bytes], ...]:
    files = []
    for name, data in (("hello.txt", b"hello world!"), ("hello2.txt", b"hello world again!"),
                       ("hello (foo) spaces.txt", b"hello")):
        (storage / "inputs").mkdir(exist_ok=True)
        (storage / "inputs" / name).write_bytes(data)
        files.append((f"file://{storage}/inputs/{name}", data))
    return tuple(files)


def batch(backend: ServiceBackend, **kwargs: object) -> Batch:
    return Batch(name=os.environ.get("PYTEST_CURRENT_TEST", "test").split(" ")[0].rsplit("::", 1)[-1],
                 backend=backend, default_image="debian", attributes={"foo": "a", "bar": "b"}, **kwargs)


def succeeded(res: object) -> None:
    status = res.status()  # type: ignore[attr-defined]
    assert status["state"] == "success", str((status, res.debug_info()))  # type: ignore[attr-defined]


def local(url: str) -> Path:
    return Path(url.removeprefix("file://"))


def test_single_task_no_io(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command("echo hello")
    res = b.run()
    assert res
    succeeded(res)
    assert res.get_job_log(1)["main"] == "hello\n"


def test_single_task_input(service_backend: ServiceBackend, upload_test_files: tuple) -> None:
    (url1, data1), _, _ = upload_test_files
    b = batch(service_backend)
    input = b.read_input(url1)
    j = b.new_job()
    j.command(f"cat {input}")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(1)["main"].encode() == data1


def test_single_task_input_resource_group(service_backend: ServiceBackend, upload_test_files: tuple) -> None:
    (url1, data1), _, _ = upload_test_files
    b = batch(service_backend)
    input = b.read_input_group(foo=url1)
    j = b.new_job()
    j.storage("10Gi")
    j.command(f"cat {input.foo}")
    j.command(f"cat {input}.foo")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(1)["main"].encode() == data1 * 2


def test_single_task_output(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job(attributes={"a": "bar", "b": "foo"})
    j.command(f"echo hello > {j.ofile}")
    res = b.run()
    succeeded(res)
    assert res.get_job(1).status()["attributes"] == {"a": "bar", "b": "foo"}


def test_single_task_write_output(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command(f"echo hello > {j.ofile}")
    b.write_output(j.ofile, os.path.join(output_tmpdir, "test_single_task_output.txt"))
    res = b.run()
    succeeded(res)
    assert local(output_tmpdir).joinpath("test_single_task_output.txt").read_text() == "hello\n"


def test_single_task_resource_group(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.declare_resource_group(output={"foo": "{root}.foo"})
    assert isinstance(j.output, ResourceGroup)
    j.command(f'echo "hello" > {j.output.foo}')
    succeeded(b.run())


def test_single_task_write_resource_group(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.declare_resource_group(output={"foo": "{root}.foo"})
    assert isinstance(j.output, ResourceGroup)
    j.command(f'echo "hello" > {j.output.foo}')
    b.write_output(j.output, os.path.join(output_tmpdir, "test_single_task_write_resource_group"))
    b.write_output(j.output.foo, os.path.join(output_tmpdir, "test_single_task_write_resource_group_file.txt"))
    succeeded(b.run())
    assert local(output_tmpdir).joinpath("test_single_task_write_resource_group.foo").read_text() == "hello\n"
    assert local(output_tmpdir).joinpath("test_single_task_write_resource_group_file.txt").read_text() == "hello\n"


def test_multiple_dependent_tasks(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    output_file = os.path.join(output_tmpdir, "test_multiple_dependent_tasks.txt")
    b = batch(service_backend)
    j = b.new_job()
    j.command(f'echo "0" >> {j.ofile}')
    for i in range(1, 3):
        j2 = b.new_job()
        j2.command(f'echo "{i}" > {j2.tmp1}')
        j2.command(f"cat {j.ofile} {j2.tmp1} > {j2.ofile}")
        j = j2
    b.write_output(j.ofile, output_file)
    succeeded(b.run())
    assert local(output_file).read_text() == "0\n1\n2\n"


def test_specify_cpu(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.cpu("0.5")
    j.command(f'echo "hello" > {j.ofile}')
    res = b.run()
    succeeded(res)
    assert res.get_job(1).status()["spec"]["resources"]["cores_mcpu"] == 500


def test_specify_memory(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.memory("100M")
    j.command(f'echo "hello" > {j.ofile}')
    res = b.run()
    succeeded(res)
    assert res.get_job(1).status()["spec"]["resources"]["memory_bytes"] == 100 * 10**6


def test_scatter_gather(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    for i in range(3):
        j = b.new_job(name=f"foo{i}")
        j.command(f'echo "{i}" > {j.ofile}')
    merger = b.new_job()
    merger.command("cat {files} > {ofile}; cat {ofile}".format(
        files=" ".join([j.ofile for j in sorted(b.select_jobs("foo"), key=lambda x: x.name, reverse=True)]),
        ofile=merger.ofile))
    res = b.run()
    succeeded(res)
    assert res.get_job_log(4)["main"] == "2\n1\n0\n"


def test_file_name_space(service_backend: ServiceBackend, upload_test_files: tuple, output_tmpdir: str) -> None:
    _, _, (url3, data3) = upload_test_files
    b = batch(service_backend)
    input = b.read_input(url3)
    j = b.new_job()
    j.command(f"cat {input} > {j.ofile}")
    b.write_output(j.ofile, os.path.join(output_tmpdir, "hello (foo) spaces.txt"))
    succeeded(b.run())
    assert local(output_tmpdir).joinpath("hello (foo) spaces.txt").read_bytes() == data3


def test_dry_run(service_backend: ServiceBackend, output_tmpdir: str, capsys: pytest.CaptureFixture[str]) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command(f"echo hello > {j.ofile}")
    b.write_output(j.ofile, os.path.join(output_tmpdir, "test_single_job_output.txt"))
    assert b.run(dry_run=True) is None
    assert "echo hello" in capsys.readouterr().out
    assert not local(output_tmpdir).exists()


def test_verbose(service_backend: ServiceBackend, upload_test_files: tuple, output_tmpdir: str) -> None:
    (url1, data1), _, _ = upload_test_files
    b = batch(service_backend)
    input = b.read_input(url1)
    j = b.new_job()
    j.command(f"cat {input}")
    b.write_output(input, os.path.join(output_tmpdir, "hello.txt"))
    succeeded(b.run(verbose=True))
    assert local(output_tmpdir).joinpath("hello.txt").read_bytes() == data1


@pytest.mark.skip(reason=NO_CLOUDFUSE)
def test_cloudfuse_fails_with_read_write_mount_option() -> None: ...


@pytest.mark.skip(reason=NO_CLOUDFUSE)
def test_cloudfuse_fails_with_io_mount_point() -> None: ...


@pytest.mark.skip(reason=NO_CLOUDFUSE)
def test_cloudfuse_read_only() -> None: ...


@pytest.mark.skip(reason=NO_CLOUDFUSE)
def test_cloudfuse_implicit_dirs() -> None: ...


def test_cloudfuse_empty_string_bucket_fails(service_backend: ServiceBackend) -> None:
    """The original expects a BatchException for an empty bucket; corral refuses every cloudfuse at once."""
    j = batch(service_backend).new_job()
    with pytest.raises(NotImplementedError, match="cloudfuse"):
        j.cloudfuse("", "/empty_bucket")


@pytest.mark.skip(reason=NO_CLOUDFUSE)
def test_cloudfuse_submount_in_io_doesnt_rm_bucket() -> None: ...


@pytest.mark.skip(reason=NO_REQUESTER_PAYS)
def test_fuse_requester_pays() -> None: ...


@pytest.mark.skip(reason=NO_REQUESTER_PAYS)
def test_fuse_non_requester_pays_bucket_when_requester_pays_project_specified() -> None: ...


@pytest.mark.skip(reason=NO_REQUESTER_PAYS)
def test_requester_pays() -> None: ...


def test_benchmark_lookalike_workflow(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    """As the original: built, not run ("too slow"); here the specs are checked instead."""
    b = batch(service_backend)
    setup_jobs = []
    for i in range(10):
        j = b.new_job(f"setup_{i}").cpu(0.25)
        j.command(f'echo "foo" > {j.ofile}')
        setup_jobs.append(j)
    jobs = []
    for i in range(500):
        j = b.new_job(f"create_file_{i}").cpu(0.25)
        j.command(f"echo {setup_jobs[i % len(setup_jobs)].ofile} > {j.ofile}")
        j.command(f'echo "bar" >> {j.ofile}')
        jobs.append(j)
    combine = b.new_job("combine_output").cpu(0.25)
    combine.command(f'cat {" ".join(j.ofile for j in jobs)} >> {combine.ofile}')
    b.write_output(combine.ofile, os.path.join(output_tmpdir, "pipeline_benchmark_test.txt"))
    from corral.pipeline.backend.service import compile_batch
    b._jobs = b._ordered()
    builder, _ = compile_batch(b, "default", "file:///x")
    combine_spec = builder.specs()[-1]
    assert len(builder) == 511 and len(combine_spec.input_files) == 501  # its 500 inputs and its script, over 10 KiB
    assert any(f.to_path.endswith("/code.sh") for f in combine_spec.input_files)


def test_envvar(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.env("SOME_VARIABLE", "123abcdef")
    j.command('[ $SOME_VARIABLE = "123abcdef" ]')
    succeeded(b.run())


def test_single_job_with_shell(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job(shell="/bin/sh")
    j.command('echo "hello world"')
    succeeded(b.run())


def test_single_job_with_nonsense_shell(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job(shell="/bin/ajdsfoijasidojf")
    j.command('echo "hello"')
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())


def test_single_job_with_intermediate_failure(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command('echoddd "hello"')
    j2 = b.new_job()
    j2.command('echo "world"')
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())


def test_input_directory(service_backend: ServiceBackend, upload_test_files: tuple) -> None:
    (url1, data1), _, _ = upload_test_files
    b = batch(service_backend)
    containing_folder = "/".join(url1.rstrip("/").split("/")[:-1])
    input1 = b.read_input(containing_folder)
    input2 = b.read_input(containing_folder + "/")
    j = b.new_job()
    j.command(f"ls {input1}/hello.txt")
    j.command(f"ls {input2}/hello.txt")
    succeeded(b.run())


def test_fail_fast(service_backend: ServiceBackend) -> None:
    b = batch(service_backend, cancel_after_n_failures=1)
    j1 = b.new_job()
    j1.command("false")
    j2 = b.new_job()
    j2.command("sleep 300")
    res = b.run()
    job_status = res.get_job(2).status()
    assert job_status["state"] == "Cancelled", str((job_status, res.debug_info()))


@pytest.mark.parametrize("slash", ["/", ""])
def test_service_backend_remote_tempdir_with_and_without_trailing_slash(storage: Path, slash: str) -> None:
    with ServiceBackend(billing_project="default", remote_tmpdir=f"file://{storage}/tmp{slash}") as backend:
        b = Batch(backend=backend)
        j1 = b.new_job()
        j1.command(f"echo hello > {j1.ofile}")
        j2 = b.new_job()
        j2.command(f"cat {j1.ofile}")
        res = b.run()
        succeeded(res)
        assert res.get_job_log(2)["main"] == "hello\n"


def test_large_command(service_backend: ServiceBackend) -> None:
    b = Batch(backend=service_backend)
    j1 = b.new_job()
    long_str = secrets.token_urlsafe(15 * 1024)
    j1.command(f'echo "{long_str}"')
    res = b.run()
    succeeded(res)
    assert res.get_job_log(1)["main"] == long_str + "\n"


def test_big_batch_which_uses_slow_path(service_backend: ServiceBackend) -> None:
    """Specs larger than one request (8 x 256 KiB of command): the library sends them in bunches."""
    b = Batch(backend=service_backend)
    for _ in range(8):
        j1 = b.new_job()
        long_str = secrets.token_urlsafe(256 * 1024)
        j1.command(f'echo "{long_str}" > /dev/null')
    res = b.run()
    succeeded(res)


def test_specify_job_region(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job("region")
    possible_regions = service_backend.supported_regions()
    j.regions(possible_regions)
    j.command("true")
    res = b.run()
    succeeded(res)


def test_use_default_region_when_not_specifying_any_regions(storage: Path, cluster: up.Cluster,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The original's ServiceBackend() takes its settings from hailctl's configuration; this one from the
    environment (and the connection from the CLI's profile)."""
    monkeypatch.setenv("CORRAL_BILLING_PROJECT", "default")
    monkeypatch.setenv("CORRAL_REMOTE_TMPDIR", f"file://{storage}/tmp")
    monkeypatch.delenv("CORRAL_REGIONS", raising=False)
    service_backend = ServiceBackend()
    default_region = service_backend.default_region()
    try:
        assert service_backend.regions == [default_region], str(service_backend.regions)
        # test default works when service backend `regions` has no default set
        service_backend.regions = None
        b = batch(service_backend)
        j = b.new_job("region")
        j.command("true")
        assert b._default_regions == [default_region], str(b._default_regions)
        assert j._regions == [default_region], str(j._regions)
        res = b.run()
        job_status = res.get_job(1).status()
        assert job_status["status"]["region"] == default_region, str((job_status, res.debug_info()))
    finally:
        service_backend.close()


def test_the_service_lists_corral_ups_one_region(service_backend: ServiceBackend) -> None:
    """Not in the original: what corral up answers (its workers are in the region 'local')."""
    assert (service_backend.supported_regions(), service_backend.default_region()) == ([LOCAL_REGION], LOCAL_REGION)


def test_job_regions_controls_job_execution_region(service_backend: ServiceBackend) -> None:
    the_region = service_backend.supported_regions()[0]
    b = batch(service_backend)
    j = b.new_job()
    j.regions([the_region])
    j.command("true")
    res = b.run()
    job_status = res.get_job(1).status()
    assert job_status["status"]["region"] == the_region, str((job_status, res.debug_info()))


def test_job_regions_overrides_batch_regions(service_backend: ServiceBackend) -> None:
    the_region = service_backend.supported_regions()[0]
    b = batch(service_backend, default_regions=["some-other-region"])
    j = b.new_job()
    j.regions([the_region])
    j.command("true")
    res = b.run()
    job_status = res.get_job(1).status()
    assert job_status["status"]["region"] == the_region, str((job_status, res.debug_info()))


def test_always_copy_output(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    output_path = os.path.join(output_tmpdir, "test_always_copy_output.txt")
    b = batch(service_backend)
    j = b.new_job()
    j.always_copy_output()
    j.command(f'echo "hello" > {j.ofile} && false')
    b.write_output(j.ofile, output_path)
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())
    b2 = batch(service_backend)
    input = b2.read_input(output_path)
    file_exists_j = b2.new_job()
    file_exists_j.command(f"cat {input}")
    res = b2.run()
    succeeded(res)
    assert res.get_job_log(1)["main"] == "hello\n", str(res.debug_info())


def test_no_copy_output_on_failure(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    output_path = os.path.join(output_tmpdir, "test_no_copy_output.txt")
    b = batch(service_backend)
    j = b.new_job()
    j.command(f'echo "hello" > {j.ofile} && false')
    b.write_output(j.ofile, output_path)
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())
    b2 = batch(service_backend)
    input = b2.read_input(output_path)
    file_exists_j = b2.new_job()
    file_exists_j.command(f"cat {input}")
    res = b2.run()
    assert res.status()["state"] == "failure", str(res.debug_info())


def test_update_batch(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command("true")
    res = b.run()
    succeeded(res)
    j2 = b.new_job()
    j2.command("true")
    res = b.run()
    succeeded(res)
    assert res.status()["n_jobs"] == 2


def test_update_batch_with_dependencies(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j1 = b.new_job()
    j1.command("true")
    j2 = b.new_job()
    j2.command("false")
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())
    j3 = b.new_job()
    j3.command("true")
    j3.depends_on(j1)
    j4 = b.new_job()
    j4.command("true")
    j4.depends_on(j2)
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())
    assert res.get_job(3).status()["state"] == "Success", str(res.debug_info())
    assert res.get_job(4).status()["state"] == "Cancelled", str(res.debug_info())


def test_update_batch_from_batch_id(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command("true")
    res = b.run()
    succeeded(res)
    b2 = Batch.from_batch_id(res.id, backend=b._backend)
    j2 = b2.new_job()
    j2.command("true")
    res = b2.run()
    succeeded(res)
    assert res.status()["n_jobs"] == 2


def test_wait_on_empty_batch_update(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    b.run(wait=True)
    b.run(wait=True)


def test_non_spot_job_and_batch(service_backend: ServiceBackend) -> None:
    """The original's four spot tests in one batch: a job is spot unless it or the batch says not."""
    b = batch(service_backend)
    b.new_job().spot(False).command("echo hello")
    b.new_job().command("echo hello")
    b.new_job().spot(True).command("echo hello")
    res = b.run()
    assert [res.get_job(n).status()["spec"]["resources"]["preemptible"] for n in (1, 2, 3)] == [False, True, True]
    b = batch(service_backend, default_spot=False)
    b.new_job().command("echo hello")
    b.new_job().spot(True).command("echo hello")
    res = b.run()
    assert [res.get_job(n).status()["spec"]["resources"]["preemptible"] for n in (1, 2)] == [False, True]


@pytest.mark.skip(reason=NOT_GOOGLE)
def test_validate_cloud_storage_policy() -> None: ...


@pytest.mark.skip(reason=NO_QUERY)
def test_submit_sequential_qob_pipelines() -> None: ...


@pytest.mark.skip(reason=NO_QUERY)
def test_race_qob_pipelines() -> None: ...


@pytest.mark.skip(reason=NO_QUERY)
def test_race_local_qob_pipelines() -> None: ...


def test_python_jobs_pass_results_and_files(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    """hailtop's test_python_job (local backend) on the service: results as arguments, as text and JSON."""
    output = os.path.join(output_tmpdir, "out.txt")
    b = batch(service_backend)
    head = b.new_job()
    head.command(f'echo "5" > {head.r5}')
    head.command(f'echo "3" > {head.r3}')

    def read(path):  # type: ignore[no-untyped-def]
        with open(path) as f:
            return int(f.read())

    def multiply(x, y):  # type: ignore[no-untyped-def]
        return x * y

    middle = b.new_python_job()
    r3 = middle.call(read, head.r3)
    r5 = middle.call(read, head.r5)
    r_mult = middle.call(multiply, r3, r5)
    middle2 = b.new_python_job()
    r_mult = middle2.call(multiply, r_mult, 2)
    r_dict = middle2.call(lambda x, y: {"x": x, "y": y}, r3, r5)
    tail = b.new_job()
    tail.command(f"cat {r3.as_str()} {r5.as_repr()} {r_mult.as_str()} {r_dict.as_json()} > {tail.ofile}")
    b.write_output(tail.ofile, output)
    succeeded(b.run())
    assert local(output).read_text() == '3\n5\n30\n{"x": 3, "y": 5}\n'


def test_a_python_jobs_exception_fails_it_with_the_traceback(service_backend: ServiceBackend) -> None:
    def broken(n):  # type: ignore[no-untyped-def]
        raise RuntimeError(f"sample {n} is broken")

    b = batch(service_backend)
    b.new_python_job().call(broken, 7)
    res = b.run()
    assert res.status()["state"] == "failure"
    log = res.get_job_log(1)["main"]
    assert "Traceback (most recent call last)" in log and "RuntimeError: sample 7 is broken" in log, log


def test_a_missing_output_fails_the_job_naming_the_file(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    b = batch(service_backend)
    j = b.new_job()
    j.command(f"echo nothing written to {j.ofile}")
    b.write_output(j.ofile, os.path.join(output_tmpdir, "never.txt"))
    res = b.run()
    status = res.get_job(1).status()
    assert status["state"] in ("Failed", "Error"), str(res.debug_info())
    assert f"/io/{j._dirname}/ofile" in status["error"], status


def test_the_same_script_gives_the_same_outputs_on_both_backends(service_backend: ServiceBackend, storage: Path,
                                                                 tmp_path: Path) -> None:
    """Issue 37, acceptance 3: one script, unchanged but for its backend and where it writes."""
    (storage / "inputs" / "samples.txt").write_text("b\na\nc\n")

    def script(backend: object, inputs: str, out: str) -> None:
        b = hb.Batch(backend=backend, name="same")  # type: ignore[arg-type]
        samples = b.read_input(f"{inputs}/samples.txt")
        counts = []
        for i in range(3):
            j = b.new_job(name=f"count-{i}")
            j.command(f"sort {samples} | head -n {i + 1} > {j.ofile}")
            counts.append(j.ofile)
        total = b.new_python_job().call(lambda *paths: sum(len(open(p).read().split()) for p in paths), *counts)
        merged = hb.concatenate(b, counts, branching_factor=2)
        b.write_output(merged, f"{out}/merged.txt")
        b.write_output(total.as_str(), f"{out}/total.txt")
        b.run()

    on_service = f"{storage}/outputs/same"
    script(service_backend, f"file://{storage}/inputs", f"file://{on_service}")
    with hb.LocalBackend(tmp_dir=str(tmp_path)) as local_backend:
        script(local_backend, str(storage / "inputs"), str(tmp_path / "out"))
    for name in ("merged.txt", "total.txt"):
        assert Path(on_service, name).read_text() == (tmp_path / "out" / name).read_text()
    assert (tmp_path / "out" / "merged.txt").read_text() == "a\na\nb\na\nb\nc\n"
    assert (tmp_path / "out" / "total.txt").read_text() == "6\n"


# hailtop's test_batch_pool_executor.py, on the same corral up.

def sleep_forever() -> None:
    while True:
        time.sleep(3600)


@pytest.fixture
def pool_backend(storage: Path) -> ServiceBackend:
    """A backend of the executor's own: leaving an executor closes nothing the other tests use."""
    return ServiceBackend(billing_project="default", remote_tmpdir=f"file://{storage}/tmp")


def test_simple_map(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        actual = list(bpe.map(lambda x: x * 3, range(4)))
        directory = local(bpe.directory)
        assert directory.is_dir()
    assert [0, 3, 6, 9] == actual
    assert not directory.exists()  # cleanup_bucket: its files are gone once every future is done


def test_empty_map(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        actual = list(bpe.map(lambda x: x * 3, []))
    assert [] == actual


def test_simple_submit_result(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        future_twenty_one = bpe.submit(lambda: 7 * 3)
    assert 21 == future_twenty_one.result()
    assert future_twenty_one.exception() is None


def test_cancel_future(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        future = bpe.submit(sleep_forever)
        was_cancelled = future.cancel()
    assert was_cancelled
    assert future.cancelled()
    assert future.batch.status()["state"] == "cancelled"


def test_cancel_future_after_shutdown_no_wait(pool_backend: ServiceBackend) -> None:
    bpe = BatchPoolExecutor(backend=pool_backend)
    future = bpe.submit(sleep_forever)
    bpe.shutdown(wait=False)
    was_cancelled = future.cancel()
    assert was_cancelled
    assert future.cancelled()


def test_cancel_future_after_exit_no_wait_on_exit(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend, wait_on_exit=False) as bpe:
        future = bpe.submit(sleep_forever)
    was_cancelled = future.cancel()
    assert was_cancelled
    assert future.cancelled()


def test_map_error_without_wait_no_error(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend, wait_on_exit=False) as bpe:
        bpe.map(lambda _: time.sleep(1), range(2), timeout=2)


def test_result_with_timeout(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        future = bpe.submit(sleep_forever)
        try:
            with pytest.raises(TimeoutError):
                future.result(timeout=2)
        finally:
            future.cancel()


def test_map_chunksize(pool_backend: ServiceBackend) -> None:
    row_args = [x for row in range(5) for x in [row, row, row, row, row]]
    col_args = [x for _ in range(5) for x in list(range(5))]
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        multiplication_table = list(bpe.map(lambda x, y: x * y, row_args, col_args, chunksize=5))
        assert len(bpe.futures) == 5
    assert multiplication_table == [0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 0, 2, 4, 6, 8, 0, 3, 6, 9, 12, 0, 4, 8, 12, 16]


def test_map_timeout(pool_backend: ServiceBackend) -> None:
    with BatchPoolExecutor(backend=pool_backend) as bpe:
        with pytest.raises(TimeoutError):
            list(bpe.map(lambda _: sleep_forever(), range(2), timeout=2))
        assert all(f.cancelled() for f in bpe.futures)


def test_exception_in_map_result_and_exception(pool_backend: ServiceBackend) -> None:
    """The original's test_exception_in_map, _in_result, _in_exception and _when_exiting_context. Where it
    expects exception() to raise, corral's returns the error, as concurrent.futures does (issue 37)."""
    def raise_value_error() -> None:
        raise ValueError("dead")

    with BatchPoolExecutor(backend=pool_backend) as bpe:
        gen = bpe.map(lambda _: raise_value_error(), range(1))
        with pytest.raises(ValueError, match="ValueError: dead"):
            next(gen)
        future = bpe.submit(raise_value_error)
        with pytest.raises(ValueError, match="ValueError: dead"):
            future.result()
        exiting = bpe.submit(raise_value_error)
    error = future.exception()
    assert isinstance(error, ValueError) and "ValueError: dead" in error.args[0]
    assert "ValueError: dead" in exiting.exception().args[0]  # type: ignore[union-attr]


# hailtop's test_python_job_in_service.py, on the same corral up (its image: corral's `python`).

def read_int(path):  # type: ignore[no-untyped-def]
    with open(path) as f:
        return int(f.read())


def multiply(x, y):  # type: ignore[no-untyped-def]
    return x * y


def reformat(x, y):  # type: ignore[no-untyped-def]
    return {"x": x, "y": y}


def test_python_job(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    head = b.new_job()
    head.command(f'echo "5" > {head.r5}')
    head.command(f'echo "3" > {head.r3}')
    middle = b.new_python_job()
    r3 = middle.call(read_int, head.r3)
    r5 = middle.call(read_int, head.r5)
    r_mult = middle.call(multiply, r3, r5)
    middle2 = b.new_python_job()
    r_mult = middle2.call(multiply, r_mult, 2)
    r_dict = middle2.call(reformat, r3, r5)
    tail = b.new_job()
    tail.command(f"cat {r3.as_str()} {r5.as_repr()} {r_mult.as_str()} {r_dict.as_json()}")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(4)["main"] == '3\n5\n30\n{"x": 3, "y": 5}\n', str(res.debug_info())


def test_python_job_w_resource_group_unpack_individually(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    head = b.new_job()
    head.declare_resource_group(count={"r5": "{root}.r5", "r3": "{root}.r3"})
    assert isinstance(head.count, ResourceGroup)
    head.command(f'echo "5" > {head.count.r5}')
    head.command(f'echo "3" > {head.count.r3}')
    middle = b.new_python_job()
    r3 = middle.call(read_int, head.count.r3)
    r5 = middle.call(read_int, head.count.r5)
    r_mult = middle.call(multiply, r3, r5)
    middle2 = b.new_python_job()
    r_mult = middle2.call(multiply, r_mult, 2)
    r_dict = middle2.call(reformat, r3, r5)
    tail = b.new_job()
    tail.command(f"cat {r3.as_str()} {r5.as_repr()} {r_mult.as_str()} {r_dict.as_json()}")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(4)["main"] == '3\n5\n30\n{"x": 3, "y": 5}\n', str(res.debug_info())


def test_python_job_can_write_to_resource_path(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)

    def write(path):  # type: ignore[no-untyped-def]
        with open(path, "w") as f:
            f.write("foo")

    head = b.new_python_job()
    head.call(write, head.ofile)
    tail = b.new_bash_job()
    tail.command(f"cat {head.ofile}")
    res = b.run()
    assert tail._job_id
    succeeded(res)
    assert res.get_job_log(tail._job_id)["main"] == "foo", str(res.debug_info())


def test_python_job_w_resource_group_unpack_jointly(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)
    head = b.new_job()
    head.declare_resource_group(count={"r5": "{root}.r5", "r3": "{root}.r3"})
    head.command(f'echo "5" > {head.count.r5}')
    head.command(f'echo "3" > {head.count.r3}')

    def read_rg(root):  # type: ignore[no-untyped-def]
        with open(root["r3"]) as f:
            r3 = int(f.read())
        with open(root["r5"]) as f:
            r5 = int(f.read())
        return (r3, r5)

    middle = b.new_python_job()
    r = middle.call(read_rg, head.count)
    r_mult = middle.call(lambda r: r[0] * r[1], r)
    tail = b.new_job()
    tail.command(f"cat {r_mult.as_str()}")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(3)["main"] == "15\n", str(res.debug_info())


def test_python_job_w_non_zero_ec(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)

    def error():  # type: ignore[no-untyped-def]
        raise Exception("this should fail")

    b.new_python_job().call(error)
    res = b.run()
    assert res.status()["state"] == "failure", str(res.debug_info())


def test_python_job_incorrect_signature(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)

    def foo(pos_arg1, pos_arg2, *, kwarg1, kwarg2=1):  # type: ignore[no-untyped-def]
        print(pos_arg1, pos_arg2, kwarg1, kwarg2)

    j = b.new_python_job()
    for args, kwargs in (((), {}), ((1,), {}), ((1, 2), {}), ((1,), {"kwarg1": 2}), ((1, 2, 3), {}),
                         ((1, 2), {"kwarg1": 3, "kwarg2": 4, "kwarg3": 5})):
        with pytest.raises(hb.BatchException):
            j.call(foo, *args, **kwargs)
    j.call(foo, 1, 2, kwarg1=3)
    j.call(foo, 1, 2, kwarg1=3, kwarg2=4)
    j.call(print, 5)  # print has no signature to check; abs has one
    j.call(abs, -1)
    with pytest.raises(hb.BatchException):
        j.call(abs, -1, 5)


@pytest.mark.skip(reason=NO_QUERY)
def test_query_on_batch_in_batch() -> None: ...


def test_basic_async_fun(service_backend: ServiceBackend) -> None:
    b = Batch(backend=service_backend)
    b.new_python_job().call(asyncio.sleep, 1)
    succeeded(b.run())


def test_async_fun_returns_value(service_backend: ServiceBackend) -> None:
    b = Batch(backend=service_backend)

    async def foo(i, j):  # type: ignore[no-untyped-def]
        await asyncio.sleep(1)
        return i * j

    result = b.new_python_job().call(foo, 2, 3)
    b.new_job().command(f"cat {result.as_str()}")
    res = b.run()
    succeeded(res)
    assert res.get_job_log(2)["main"] == "6\n", str(res.debug_info())


def test_update_batch_with_python_job_dependencies(service_backend: ServiceBackend) -> None:
    b = batch(service_backend)

    async def foo(i, j):  # type: ignore[no-untyped-def]
        await asyncio.sleep(1)
        return i * j

    b.new_python_job().call(foo, 2, 3)
    succeeded(b.run())
    j2 = b.new_python_job()
    j2.call(foo, 2, 3)
    succeeded(b.run())
    j3 = b.new_python_job()
    j3.depends_on(j2)
    j3.call(foo, 2, 3)
    res = b.run()
    succeeded(res)
    assert res.status()["n_jobs"] == 3


def test_python_job_with_kwarg(service_backend: ServiceBackend, output_tmpdir: str) -> None:
    def foo(*, kwarg):  # type: ignore[no-untyped-def]
        return kwarg

    b = batch(service_backend)
    r = b.new_python_job().call(foo, kwarg="hello world")
    output_path = os.path.join(output_tmpdir, "test_python_job_with_kwarg")
    b.write_output(r.as_json(), output_path)
    res = b.run()
    succeeded(res)
    assert json.loads(local(output_path).read_text()) == "hello world"


@pytest.mark.parametrize(("container", "expected"), [
    (lambda a, b: (a, b), "01"), (lambda a, b: [a, b], "01"), (lambda a, b: {"a": a, "b": b}, "ab")])
def test_recursive_resource_extraction_in_python_jobs(service_backend: ServiceBackend, container: Any,
                                                      expected: str) -> None:
    """The original's tuple, list and dict tests, in one: files inside an argument are found and passed."""
    b = batch(service_backend)

    def write(paths):  # type: ignore[no-untyped-def]
        items = paths.items() if isinstance(paths, dict) else enumerate(paths)
        for key, path in items:
            with open(path, "w") as f:
                f.write(f"{key}")

    head = b.new_python_job()
    head.call(write, container(head.ofile1, head.ofile2))
    tail = b.new_bash_job()
    tail.command(f"cat {head.ofile1}")
    tail.command(f"cat {head.ofile2}")
    res = b.run()
    assert tail._job_id
    succeeded(res)
    assert res.get_job_log(tail._job_id)["main"] == expected, str(res.debug_info())
