"""A job's secrets in the process runtime (services/worker/secret_files.py,
runtime.py, jobinit.py), tried from inside real jobs: the job reads its
secret from files below its working directory that it cannot change,
chmod or remove; another attempt running beside it cannot reach them; the
worker removes them when the attempt ends, whatever it keeps; nothing of
them is in the attempt's log, status or isolation note unless the job
prints it. And the worker's side alone: what it accepts from the driver,
how it writes the files, what a dead worker left.

The jobs need isolation (root): those skip otherwise."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import stat
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from corral.driver.v1 import worker_session_pb2 as ws
from services.worker.runtime import JobRun, ProcessRuntime, ProcessRuntimeConfig, can_isolate
from services.worker.runtime_api import SecretVolume
from services.worker.secret_files import delivered_secrets, remove_leftover_secrets, write_secret_dir
from tests.unit.test_job_isolation import WAIT_FOR_GO, fields, go, start
from tests.unit.test_process_runtime import job, run, spec

pytestmark = pytest.mark.timeout(60)
isolated_only = pytest.mark.skipif(not can_isolate(), reason="mounting secrets needs a worker running as root on "
                                                             "Linux (isolated jobs)")


def mounting(tmp_path: Path, script: str, files: dict[str, bytes], attempt_id: str = "a1",
             mount_path: str = "/run/secrets/db") -> JobRun:
    run_job = job(tmp_path, spec(script=script, secrets=[js.SecretMount(name="db", mount_path=mount_path)]),
                  attempt_id=attempt_id)
    return JobRun(run_job.batch_id, run_job.job_id, run_job.attempt_id, run_job.spec, run_job.cores_mcpu,
                  run_job.memory_bytes, run_job.scratch, (SecretVolume("db", mount_path, files),))


PROBE = """
cd run/secrets/db
echo sha=$(sha256sum password | cut -d' ' -f1)
echo files=$(ls | tr '\\n' ,)
echo modes=$(stat -c %a:%u . password user | tr '\\n' ,)
echo me=$(id -u)
echo write=$( (echo x > password) 2>/dev/null && echo yes || echo no)
echo chmod=$(chmod 600 password 2>/dev/null && echo yes || echo no)
echo remove=$(rm -f password 2>/dev/null && echo yes || echo no)
echo create=$(touch new 2>/dev/null && echo yes || echo no)
echo still=$(sha256sum password | cut -d' ' -f1)
"""


@isolated_only
async def test_a_job_reads_its_secret_from_read_only_files_that_are_gone_afterwards(tmp_path: Path) -> None:
    value = secrets.token_urlsafe(32).encode()
    run_job = mounting(tmp_path, PROBE, {"password": value, "user": b"corral"})
    outcome, output = await run(ProcessRuntime(ProcessRuntimeConfig(keep_work_dirs=True)), run_job)
    assert outcome.state == "Success", (outcome, output)
    seen = fields(output)
    uid = seen["me"]
    assert seen["sha"] == seen["still"] == hashlib.sha256(value).hexdigest()
    assert seen["files"] == "password,user,"
    assert seen["modes"] == f"500:{uid},400:{uid},400:{uid},"  # the job's own, and read only
    assert (seen["write"], seen["chmod"], seen["remove"], seen["create"]) == ("no", "no", "no", "no")
    assert value not in output and value.decode() not in outcome.error_message + outcome.isolation
    assert "mounted read-only below its working directory: 'run/secrets/db'" in outcome.isolation
    # Kept work directories keep the (empty) mount point; the secrets themselves are gone.
    assert not (run_job.attempt_dir / "secrets").exists()
    assert list((run_job.attempt_dir / "work" / "run" / "secrets" / "db").iterdir()) == []
    assert value not in b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink())


@isolated_only
async def test_another_attempt_cannot_reach_a_running_jobs_secret(tmp_path: Path) -> None:
    value = secrets.token_urlsafe(32).encode()
    runtime = ProcessRuntime()
    holder = mounting(tmp_path, f"cat run/secrets/db/password > /dev/null; {WAIT_FOR_GO}", {"password": value})
    task, _ = start(runtime, holder)
    source = holder.attempt_dir / "secrets" / "0" / "password"
    mounted = holder.attempt_dir / "work" / "run" / "secrets" / "db" / "password"
    deadline = asyncio.get_running_loop().time() + 20
    while not source.exists():
        assert asyncio.get_running_loop().time() < deadline, "the secret was never written"
        await asyncio.sleep(0.02)
    assert stat.S_IMODE(source.stat().st_mode) == 0o400
    try:
        probe = spec(script=f"cat {source} {mounted} {source.parent} 2>&1; ls {holder.attempt_dir} 2>&1; true")
        outcome, output = await run(runtime, job(tmp_path, probe, attempt_id="a2"))
        assert outcome.state == "Success"
        assert value not in output and b"No such file or directory" in output
    finally:
        go(holder)
        assert (await task).state == "Success"
    assert not source.parent.exists()


@isolated_only
async def test_a_mount_point_through_a_link_an_input_brought_is_refused(tmp_path: Path) -> None:
    """A link in an input (copied as a link) cannot lead the mount point, or the secret, elsewhere."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "run").symlink_to("/etc")
    run_job = mounting(tmp_path, "cat run/secrets/db/password", {"password": b"hunter2"}, mount_path="/in/run/secrets")
    run_job.spec.input_files.add(from_url=f"file://{source}", to_path="/in")
    outcome, output = await run(ProcessRuntime(), run_job)
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert "mount points" in outcome.error_message and "symbolic link" in outcome.error_message
    assert b"hunter2" not in output and not (Path("/etc") / "secrets").exists()


async def test_the_unisolated_runtime_refuses_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.worker import runtime as runtime_module

    monkeypatch.setattr(runtime_module, "can_isolate", lambda: False)
    marker = tmp_path / "ran"
    outcome, _ = await run(ProcessRuntime(ProcessRuntimeConfig(allow_unisolated=True)),
                           mounting(tmp_path, f"touch {marker}", {"password": b"hunter2"}))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "secrets cannot be mounted" in outcome.error_message and not marker.exists()


# ---------------------------------------------------------------- the worker's side alone


def test_what_the_driver_delivered_is_matched_to_the_spec() -> None:
    job_spec = spec("true", secrets=[js.SecretMount(name="db", mount_path="/s/db"),
                                     js.SecretMount(name="key", mount_path="/s/key")])
    good = [ws.SecretFiles(name="db", mount_path="/s/db", files={"password": b"p"}),
            ws.SecretFiles(name="key", mount_path="/s/key", files={"id_rsa": b"k"})]
    volumes, refusals = delivered_secrets(job_spec, good)
    assert refusals == [] and [(v.name, dict(v.files)) for v in volumes] == [("db", {"password": b"p"}),
                                                                           ("key", {"id_rsa": b"k"})]
    assert "b'p'" not in repr(volumes)  # contents never in a repr
    deleted = ws.SecretFiles(name="key", mount_path="/s/key", error="secret 'key' no longer exists")
    _, refusals = delivered_secrets(job_spec, [good[0], deleted])
    assert refusals == ["secret 'key' no longer exists"]
    _, refusals = delivered_secrets(job_spec, [good[0]])
    assert refusals == ["secret 'key' was not delivered with the job"]
    _, refusals = delivered_secrets(job_spec, [good[1], good[0]])
    assert len(refusals) == 2
    sneaky = ws.SecretFiles(name="key", mount_path="/s/key", files={"../escape": b"k"})
    _, refusals = delivered_secrets(job_spec, [good[0], sneaky])
    assert refusals == ["secret 'key' has a file whose name is not a plain file name ('../escape')"]


def test_secret_files_are_written_without_following_anything(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    write_secret_dir(directory, {"a": b"1", "b": b""}, os.getuid(), os.getgid())
    assert stat.S_IMODE(directory.stat().st_mode) == 0o500
    assert {p.name: (stat.S_IMODE(p.stat().st_mode), p.read_bytes()) for p in directory.iterdir()} == {
        "a": (0o400, b"1"), "b": (0o400, b"")}
    with pytest.raises(FileExistsError):  # never into a directory that is there already
        write_secret_dir(directory, {"c": b""}, os.getuid(), os.getgid())
    with pytest.raises(ValueError, match="plain file name"):
        write_secret_dir(tmp_path / "t", {"../x": b""}, os.getuid(), os.getgid())


def test_a_new_worker_removes_what_a_dead_one_left(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    for attempt in ("1-1-a", "1-2-b"):
        (scratch / attempt / "work").mkdir(parents=True)
    (scratch / "1-1-a" / "secrets").mkdir()
    write_secret_dir(scratch / "1-1-a" / "secrets" / "0", {"password": b"p"}, os.getuid(), os.getgid())
    assert remove_leftover_secrets(scratch) == 1
    assert not (scratch / "1-1-a" / "secrets").exists() and (scratch / "1-1-a" / "work").exists()
    assert remove_leftover_secrets(tmp_path / "none") == 0
