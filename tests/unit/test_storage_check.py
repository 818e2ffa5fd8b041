"""The worker's own check of a job's file URLs (services/worker/storage_check.py)."""

from __future__ import annotations

from pathlib import Path

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.storage_check import file_url_refusals


def spec(inputs: tuple[str, ...] = (), outputs: tuple[str, ...] = ()) -> js.JobSpec:
    return js.JobSpec(image="x", script="true",
                      input_files=[js.InputFile(from_url=u, to_path="/in/x") for u in inputs],
                      output_files=[js.OutputFile(from_path="/out/x", to_url=u) for u in outputs])


def test_files_under_the_roots_pass(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/storage/proj/"
    assert file_url_refusals(spec((f"{root}in.txt",), (f"{root}new/out.txt",)), [root]) == []


def test_files_elsewhere_and_jobs_without_roots_are_refused(tmp_path: Path) -> None:
    root = f"file://{tmp_path}/storage/proj/"
    assert file_url_refusals(spec(("file:///etc/shadow",), (f"{root}../x",)), [root]) == [
        f"input URL 'file:///etc/shadow' refused: not under a storage root of the billing project ({root})",
        f"output URL '{root}../x' refused: '..' path segments are not accepted (storage backends disagree on them)"]
    [refusal] = file_url_refusals(spec((f"{root}in.txt",)), [])
    assert "no storage roots are configured" in refusal


def test_a_symbolic_link_out_of_the_root_is_refused(tmp_path: Path) -> None:
    storage = tmp_path / "storage" / "proj"
    storage.mkdir(parents=True)
    (tmp_path / "secret").write_text("key")
    (storage / "escape").symlink_to(tmp_path / "secret")
    (storage / "dir").symlink_to(tmp_path)
    (storage / "inside").symlink_to(storage / "real")
    root = f"file://{storage}/"
    assert file_url_refusals(spec((f"{root}escape", f"{root}inside"), (f"{root}dir/new",)), [root]) == [
        f"input URL '{root}escape' refused: a symbolic link leads it out of the storage roots",
        f"output URL '{root}dir/new' refused: a symbolic link leads it out of the storage roots"]


def test_a_root_that_is_itself_a_link_still_holds_its_files(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    root = f"file://{tmp_path}/link/"
    assert file_url_refusals(spec((f"{root}a",)), [root]) == []
