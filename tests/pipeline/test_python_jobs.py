"""Issue 37, acceptance 4 for Python jobs: an exception in the function, and a client whose Python differs
from the image's, each give one clear message."""

from __future__ import annotations

import io
import pickle
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest

import corral.pipeline as hb
from corral.pipeline import runner
from corral.pipeline.backend import service


def test_an_exception_fails_the_job_with_its_traceback(tmp_path: Path) -> None:
    def broken(n: int) -> None:
        raise RuntimeError(f"sample {n} is broken")

    with hb.LocalBackend(tmp_dir=str(tmp_path)) as backend:
        b = hb.Batch(backend=backend)
        b.new_python_job(name="qc").call(broken, 7)
        with pytest.raises(subprocess.CalledProcessError) as failed:
            b.run()
    output = failed.value.output.decode()
    assert "Traceback (most recent call last)" in output and "RuntimeError: sample 7 is broken" in output, output


def test_a_client_of_another_python_than_the_images_is_refused_before_submission(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "DEFAULT_PYTHON_IMAGE_VERSION", (3, 99))
    b = hb.Batch(backend=hb.LocalBackend())
    b.new_python_job().call(len, "abc")
    b._jobs = b._ordered()
    with pytest.raises(hb.BatchException, match=r"this client runs Python 3\.\d+ and the image 'python' Python 3\.99"):
        service.compile_batch(b, "default", "file:///scratch")
    named = hb.Batch(backend=hb.LocalBackend(), default_python_image="my-python:3.99")
    named.new_python_job().call(len, "abc")
    named._jobs = named._ordered()
    service.compile_batch(named, "default", "file:///scratch")  # its own image: the runner checks (below)


def test_the_runner_refuses_a_call_pickled_by_another_python(tmp_path: Path) -> None:
    call = io.BytesIO()
    pickle.dump((3, 0), call)
    cloudpickle.dump((len, [("value", "abc")], {}, {"result": "result1"}), call)
    (tmp_path / "call0.pkl").write_bytes(call.getvalue())
    done = subprocess.run([sys.executable, runner.__file__, "call0.pkl"], env={"BATCH_TMPDIR": str(tmp_path)},
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"corral.pipeline: this Python job was made by Python 3.0 and its image runs Python {sys.version_info[0]}."
        f"{sys.version_info[1]}; a function pickled by one minor version cannot be loaded by another: use an image "
        "with the client's Python version"]
    assert not (tmp_path / "result1").exists()
