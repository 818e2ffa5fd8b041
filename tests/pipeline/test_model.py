"""The pipeline library's model with no process run: values refused where written, resource files as text,
dependencies from files, and the corral job specs a batch compiles to."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

import corral.pipeline as hb
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from corral.cli_config import Config, Profile
from corral.pipeline.backend.service import compile_batch

SCRATCH = "file:///storage/default/tmp/run1"


class Offline(hb.LocalBackend):
    """A backend for building batches that are never run."""


def batch(**kwargs: object) -> hb.Batch:
    return hb.Batch(backend=Offline(), **kwargs)


def test_the_public_names_are_hailtop_batchs() -> None:
    for name in ("Batch", "LocalBackend", "ServiceBackend", "ResourceFile", "ResourceGroup", "InputResourceFile",
                 "JobResourceFile", "PythonResult", "BatchException", "concatenate"):
        assert hasattr(hb, name), name


@pytest.mark.parametrize(("setter", "value", "named"), [
    ("memory", "4GB", "memory"), ("memory", "medium", "memory"), ("cpu", "two", "cpu"), ("cpu", "250k", "cpu"),
    ("storage", "10 Gi", "storage"), ("timeout", "5 minutes", "timeout"), ("cpu", 0, "cpu"),
])
def test_a_wrong_value_is_a_value_error_naming_it_where_it_is_written(setter: str, value: object,
                                                                      named: str) -> None:
    j = batch().new_job()
    with pytest.raises(ValueError, match=f"^{named}: "):
        getattr(j, setter)(value)


@pytest.mark.parametrize(("setting", "value"), [("default_memory", "1GB"), ("default_cpu", "x"),
                                                ("default_storage", "lots"), ("default_timeout", "-1s")])
def test_a_wrong_default_is_refused_by_the_batch(setting: str, value: object) -> None:
    with pytest.raises(ValueError):
        batch(**{setting: value})


def test_values_as_hailtop_batch_takes_them_reach_the_spec() -> None:
    b = batch(default_cpu="250m", default_storage="10Gi")
    j = b.new_job().cpu(2).memory("standard").timeout(90)
    j.command("true")
    k = b.new_job().memory("1Gi")
    k.command("true")
    low = b.new_job().cpu("500m").memory("lowmem")
    low.command("true")
    builder, _ = compile_batch(b, "default", SCRATCH)
    first, second, third = builder.specs()
    assert first.resources.cores_mcpu == 2000 and first.resources.memory_bytes == 8 * 2**30
    assert first.timeout.seconds == 90
    assert second.resources.cores_mcpu == 250 and second.resources.memory_bytes == 2**30
    assert second.resources.storage_bytes == 10 * 2**30
    assert third.resources.memory_bytes == 2**29


def test_resource_files_are_text_standing_for_their_paths() -> None:
    b = batch()
    jobs = [b.new_job() for _ in range(3)]
    for j in jobs:
        j.command(f"echo hi > {j.ofile}")
    files = [j.ofile for j in jobs]
    assert all(isinstance(f, str) and isinstance(f, hb.ResourceFile) for f in files)
    joined = " ".join(files)
    merge = b.new_job()
    merge.command(f"cat {joined} > {merge.ofile}")
    assert set(merge._dependencies) == set(jobs)
    assert "${BATCH_TMPDIR}/" + f"{jobs[0]._dirname}/ofile" in merge._command[0]


def test_an_empty_command_warns_and_is_ignored() -> None:
    j = batch().new_job(name="quiet")
    with pytest.warns(UserWarning, match="Ignoring empty command specified for job 'quiet'"):
        j.command("  \n")
    assert j._command == []


def test_call_checks_the_signature_at_once() -> None:
    j = batch().new_python_job()

    def add(x: int, y: int) -> int:
        return x + y

    with pytest.raises(hb.BatchException, match="Cannot call add"):
        j.call(add, 1, 2, 3)
    with pytest.raises(hb.BatchException, match="Cannot call add"):
        j.call(add, 1, z=2)
    with pytest.raises(hb.BatchException, match="cannot be other job objects"):
        j.call(add, 1, batch().new_job())
    assert isinstance(j.call(add, 1, 2), hb.PythonResult)
    j.call(print, "builtins have no signature to check")


def test_a_python_result_in_a_bash_command_must_be_converted() -> None:
    b = batch()
    result = b.new_python_job().call(lambda: 3)
    with pytest.raises(hb.BatchException, match="as_str"):
        b.new_job().command(f"cat {result}")
    tail = b.new_job()
    tail.command(f"cat {result.as_str()}")
    assert result.source() in tail._dependencies


def test_a_file_another_job_never_wrote_is_refused() -> None:
    b = batch()
    head = b.new_job()
    with pytest.raises(hb.BatchException, match="undefined resource 'ofile'"):
        b.new_job().command(f"cat {head.ofile}")
    with pytest.raises(hb.BatchException, match="undefined resource"):
        b.write_output(head.other, "/tmp/x")


def test_jobs_and_batches_in_a_command_are_refused() -> None:
    b = batch()
    j = b.new_job()
    with pytest.raises(hb.BatchException, match="Job object"):
        j.command(f"echo {b.new_job()}")
    with pytest.raises(hb.BatchException, match="Batch object"):
        j.command(f"echo {b}")


def test_a_cycle_is_refused_when_run() -> None:
    b = batch()
    first, second = b.new_job(), b.new_job()
    first.command("true")
    second.command("true")
    first.depends_on(second)
    second.depends_on(first)
    with pytest.raises(hb.BatchException, match="cycle"):
        b.run()


def test_resource_groups_are_files_under_one_root() -> None:
    b = batch()
    bfile = b.read_input_group(bed="/data/x.bed", bim="/data/x.bim")
    j = b.new_job()
    j.declare_resource_group(out={"bed": "{root}.bed", "bim": "{root}.bim"})
    j.command(f"plink --bfile {bfile} --out {j.out}")
    assert j.out.bed._value == "out.bed" and j.out["bim"]._value == "out.bim"
    assert bfile.bed._value.endswith(".bed") and bfile.bed._value.rsplit(".", 1)[0] == bfile._root
    assert {bfile.bed, bfile.bim} <= j._inputs
    with pytest.raises(hb.BatchException, match="'fam' not found"):
        bfile.fam  # noqa: B018


def test_concatenate_makes_a_tree_of_named_jobs() -> None:
    b = batch()
    files = []
    for _ in range(5):
        j = b.new_job()
        j.command(f"touch {j.ofile}")
        files.append(j.ofile)
    hb.concatenate(b, files, branching_factor=2)
    names = [j.name for j in b._jobs[5:]]
    assert names == ["concatenate-0-0", "concatenate-0-1", "concatenate-0-2", "concatenate-1-0",
                     "concatenate-1-1", "concatenate-2-0"]


def test_a_bash_job_compiles_to_a_script_with_its_files_staged() -> None:
    b = batch(name="align", attributes={"sample": "7"})
    data = b.read_input("/data/reads.fq")
    head = b.new_job(name="count")
    head.command(f"wc -l < {data} > {head.ofile}")
    tail = b.new_job(name="report").env("MODE", "fast")
    tail.command(f"cat {head.ofile} > {tail.report}")
    b.write_output(tail.report, "/results/report.txt")
    b._jobs = b._ordered()
    builder, calls = compile_batch(b, "default", SCRATCH)
    assert calls == {}
    assert builder.batch_fields()["attributes"] == {"sample": "7", "name": "align"}
    count, report = builder.specs()
    assert count.image == "debian" and count.argv.args[0] == "/bin/bash"
    assert count.attributes["name"] == "count"
    assert [(f.from_url, f.to_path) for f in count.input_files] == [
        ("file:///data/reads.fq", f"/io/{data._relative_path()}")]
    assert [(f.from_path, f.to_url) for f in count.output_files] == [
        (f"/io/{head._dirname}/ofile", f"{SCRATCH}/{head._dirname}/ofile")]
    assert [(f.from_url, f.to_path) for f in report.input_files] == [
        (f"{SCRATCH}/{head._dirname}/ofile", f"/io/{head._dirname}/ofile")]
    assert [(f.from_path, f.to_url) for f in report.output_files] == [
        (f"/io/{tail._dirname}/report", "file:///results/report.txt")]
    assert report.parents[0].in_update_offset == -1
    assert list(report.parents[0].accepted_states) == [job_state_pb2.JOB_STATE_SUCCEEDED]
    assert report.env["MODE"] == "fast"


def test_an_always_run_job_accepts_every_end_of_its_parents_and_spot_false_is_on_demand() -> None:
    b = batch()
    head = b.new_job()
    head.command("false")
    tail = b.new_job().always_run().spot(False)
    tail.depends_on(head)
    tail.command("echo cleanup")
    b._jobs = b._ordered()
    _, spec = compile_batch(b, "default", SCRATCH)[0].specs()
    assert spec.always_run
    assert len(spec.parents[0].accepted_states) == 4
    assert spec.provisioning_model == job_spec_pb2.PROVISIONING_MODEL_ON_DEMAND


def test_a_python_job_compiles_to_the_runner_and_a_call_file() -> None:
    b = batch()
    j = b.new_python_job()
    result = j.call(lambda x: x * 2, 21)
    result.as_json()
    b._jobs = b._ordered()
    builder, calls = compile_batch(b, "default", SCRATCH)
    (spec,) = builder.specs()
    assert spec.image == "python"
    (url,) = calls
    assert url == f"{SCRATCH}/{j._dirname}/call0.pkl"
    assert any(f.from_url == url for f in spec.input_files)
    assert "__CORRAL_PIPELINE_RUNNER__" in spec.argv.args[2]
    data = calls[url]
    version_end = len(pickle.dumps(pickle.loads(data)))  # the version comes first, with plain pickle
    function, args, _, outputs = pickle.loads(data[version_end:])
    assert function(args[0][1]) == 42
    assert outputs == {"result": f"{j._dirname}/result1", "json": f"{j._dirname}/result1-json.json"}


def test_service_backend_with_no_arguments_takes_the_environment_then_the_profile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As hailtop.batch reads hailctl's configuration: here `corral profile set`, which corral up's admin
    profile has already (the `default` project and a scratch directory under its storage)."""
    config = tmp_path / "config.json"
    monkeypatch.setenv("CORRAL_CONFIG", str(config))
    for variable in ("CORRAL_BILLING_PROJECT", "CORRAL_REMOTE_TMPDIR"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ValueError, match=r"`corral profile set billing_project NAME`"):
        hb.ServiceBackend()
    Config({"lab": Profile(token="t", billing_project="lab", remote_tmpdir="file:///data/lab/tmp")}, "lab").save()
    backend = hb.ServiceBackend()
    assert (backend._billing_project, backend.remote_tmpdir) == ("lab", "file:///data/lab/tmp")
    monkeypatch.setenv("CORRAL_BILLING_PROJECT", "other")
    assert hb.ServiceBackend()._billing_project == "other"
    assert hb.ServiceBackend(billing_project="given")._billing_project == "given"
    Config({"lab": Profile(token="t", billing_project="lab")}, "lab").save()
    with pytest.raises(ValueError, match=r"`corral profile set remote_tmpdir URL`"):
        hb.ServiceBackend()


def test_where_only_the_client_is_installed_the_local_backend_runs_processes_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The containers come from corral's worker, found as an entry point: without it, processes (or, asked for
    containers, a refusal naming what is missing)."""
    import corral.pipeline.backend.local as local
    monkeypatch.setattr(local, "entry_points", lambda group, name: [])
    monkeypatch.delenv("CORRAL_PIPELINE_CONTAINERS", raising=False)
    b = hb.Batch(backend=hb.LocalBackend(tmp_dir=str(tmp_path)))
    b.new_job().command("true")
    b.run()
    assert "corral's worker is not installed here" in capsys.readouterr().out.splitlines()[0]
    b = hb.Batch(backend=hb.LocalBackend(tmp_dir=str(tmp_path), containers=True))
    b.new_job().command("true")
    with pytest.raises(hb.BatchException, match="corral's worker is not installed here"):
        b.run()
