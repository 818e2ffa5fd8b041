"""What a job in the isolated process runtime can reach, tried from inside real
jobs: its user is its own and unprivileged; it sees only its own processes
and cannot signal another attempt's; it cannot read or list the worker's
files or another attempt's; a process it hides with setsid dies with it;
NETWORK_MODE_NONE leaves it loopback only; its outputs cannot smuggle out a
file through a link. Isolating needs root, so these skip otherwise."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.job_uids import JobUids
from services.worker.logs import LogSink
from services.worker.runtime import JobOutcome, JobRun, ProcessRuntime, ProcessRuntimeConfig, can_isolate
from tests.job_processes import marked, processes_marked
from tests.unit.test_process_runtime import PY, eventually, job, needs_py, run, spec

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not can_isolate(), reason="isolating jobs needs a worker running as root on Linux; "
                                                           "without it the process runtime refuses to run jobs")]

WAIT_FOR_GO = "until [ -e go ]; do sleep 0.02; done"


def start(runtime: ProcessRuntime, run_job: JobRun) -> tuple[asyncio.Task[JobOutcome], LogSink]:
    """Run the attempt in a task; its log to watch."""
    log = LogSink(run_job.log_path)

    async def nothing(pid: int) -> None:
        pass

    return asyncio.create_task(runtime.run(run_job, log, nothing)), log


def go(run_job: JobRun) -> None:
    """Let a job waiting with WAIT_FOR_GO finish (the test, as root, writes into its working directory)."""
    (run_job.attempt_dir / "work" / "go").touch()


def fields(output: bytes) -> dict[str, str]:
    """`key=value` lines of a job's output."""
    return dict(line.split("=", 1) for line in output.decode().splitlines() if "=" in line)


@pytest.fixture
def visible_dir() -> Iterator[Path]:
    """A directory every user may pass through and list, outside the directories jobs get private copies
    of: what a job sees there is the host's, so only permissions protect it."""
    if not os.path.isdir("/run"):
        pytest.skip("no /run to make a directory the job can see")
    path = Path(tempfile.mkdtemp(prefix="corral-isolation-", dir="/run"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def secret_file(directory: Path, name: str = "ca.key") -> Path:
    """A file only root may read, as the CA's key is."""
    path = directory / name
    path.write_text("-----BEGIN PRIVATE KEY----- SECRET\n")
    path.chmod(0o600)
    return path


# ---------------------------------------------------------------- who the job is


async def test_each_attempt_runs_as_its_own_unprivileged_user(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    script = ("echo uid=$(id -u); echo gid=$(id -g); echo groups=$(id -G | tr ' ' ,); echo host=$(hostname); "
              "echo home=$(stat -c %a:%u $HOME); echo tmpdir=$(stat -c %a:%u $TMPDIR); "
              "grep -E '^(CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs):' /proc/self/status | tr -d '\\t' | tr : =; "
              f"echo ready; {WAIT_FOR_GO}")
    first, second = job(tmp_path, spec(script=script), attempt_id="one"), job(tmp_path, spec(script=script),
                                                                             attempt_id="two")
    (task1, log1), (task2, log2) = start(runtime, first), start(runtime, second)
    await eventually(lambda: b"ready" in log1.read() and b"ready" in log2.read())
    seen = [fields(log1.read()), fields(log2.read())]
    uids = [int(s["uid"]) for s in seen]
    assert 0 not in uids and os.getuid() not in uids
    assert uids[0] != uids[1]  # concurrent attempts never share a user
    config = ProcessRuntimeConfig()
    for values, uid in zip(seen, uids):
        assert config.uid_first <= uid < config.uid_first + config.uid_count
        assert values["gid"] == str(uid) and values["groups"] == str(uid)  # no supplementary group
        assert {values[c] for c in ("CapPrm", "CapEff", "CapBnd", "CapAmb")} == {"0000000000000000"}
        assert values["NoNewPrivs"] == "1"
        assert values["host"] == "job-7-3"
        assert values["home"] == values["tmpdir"] == f"700:{uid}"  # private, and its own
    go(first)
    go(second)
    assert [(await task1).state, (await task2).state] == ["Success", "Success"]
    # Their uids are free again: a claim on each succeeds.
    for uid in uids:
        JobUids(config.uid_claims_dir, uid, 1).claim().release()


# ---------------------------------------------------------------- processes


async def test_a_job_sees_only_its_own_processes(tmp_path: Path) -> None:
    host = subprocess.Popen(["sleep", "97.531"])  # a process of the host with a recognisable argument
    try:
        outcome, output = await run(ProcessRuntime(), job(tmp_path, spec(
            script="for p in /proc/[0-9]*; do echo \"$(basename $p) $(tr '\\0' ' ' < $p/cmdline)\"; done")))
    finally:
        host.kill()
        host.wait()
    assert outcome.state == "Success", output
    lines = output.decode().splitlines()
    assert b"97.531" not in output and b"pytest" not in output
    pids = sorted(int(line.split()[0]) for line in lines)
    assert pids[:2] == [1, 2]  # the job's init and the command; the rest are the loop's own children
    assert len(pids) <= 5, lines


async def test_a_job_cannot_signal_another_attempts_processes(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    victim, mark = marked(spec(script=f"echo ready; {WAIT_FOR_GO}"))
    victim_job = job(tmp_path, victim, attempt_id="victim")
    task, log = start(runtime, victim_job)
    await eventually(lambda: b"ready" in log.read())
    host_pids = " ".join(str(p) for p in processes_marked(mark))
    assert host_pids
    # Every pid it can name is in its own namespace; kill -1 reaches every process it may signal.
    outcome, output = await run(runtime, job(tmp_path, spec(
        script=f"kill -KILL {host_pids} 2>/dev/null; kill -KILL -1; echo tried"), attempt_id="attacker"))
    assert b"tried" in output
    assert processes_marked(mark)
    go(victim_job)
    assert (await task).state == "Success"


async def test_a_setsid_grandchild_dies_with_the_attempt(tmp_path: Path) -> None:
    if shutil.which("setsid") is None:
        pytest.skip("no setsid program")
    # output_drain_s long: the run must not wait for the escaped process's hold on the log pipe.
    runtime = ProcessRuntime(ProcessRuntimeConfig(output_drain_s=30))
    escaping, mark = marked(spec(script="setsid sleep 100 & echo escaped"))
    started = time.monotonic()
    outcome, output = await run(runtime, job(tmp_path, escaping))
    assert (outcome.state, output) == ("Success", b"escaped\n")
    assert time.monotonic() - started < 10
    await eventually(lambda: not processes_marked(mark))


# ---------------------------------------------------------------- files


@pytest.mark.parametrize("where", ["scratch_under_tmp", "scratch_in_visible_dir"])
async def test_a_job_cannot_reach_the_workers_files(where: str, tmp_path: Path, visible_dir: Path) -> None:
    base = tmp_path if where == "scratch_under_tmp" else visible_dir
    secret = secret_file(base)
    (base / "public.txt").write_text("anyone may read this\n")
    (base / "public.txt").chmod(0o644)
    scratch = base / "scratch"
    other = scratch / "7-3-other"
    other.mkdir(parents=True)
    (other / "main.log").write_text("another attempt's log\n")
    run_job = JobRun(7, 3, "a1", spec(script=(
        f"cat {base}/public.txt; cat {secret}; echo secret=$?; ls {scratch}; echo list_scratch=$?; "
        f"cat {other}/main.log; echo other_log=$?; ls {base}/..; ls -d $HOME; echo home=$?; "
        f"echo mine > $TMPDIR/t && echo tmpdir=$? && echo x > /tmp/{base.name} && echo tmp=$?")),
        1000, 0, scratch)
    outcome, output = await run(ProcessRuntime(), run_job)
    assert outcome.state == "Success", output
    assert b"SECRET" not in output and b"another attempt" not in output
    values = fields(output)
    assert values["secret"] != "0" and values["list_scratch"] != "0" and values["other_log"] != "0"
    assert (values["home"], values["tmpdir"], values["tmp"]) == ("0", "0", "0")
    if where == "scratch_in_visible_dir":
        assert b"anyone may read this" in output  # the directory is the host's: its permissions held
    assert not (Path("/tmp") / base.name).exists()  # the job's /tmp was its own


async def test_a_job_cannot_read_another_running_attempts_work_dir(tmp_path: Path) -> None:
    runtime = ProcessRuntime()
    owner = job(tmp_path, spec(script=f"echo SECRET-OF-A > mine.txt; chmod 644 mine.txt; echo ready; {WAIT_FOR_GO}"),
                attempt_id="owner")
    task, log = start(runtime, owner)
    await eventually(lambda: b"ready" in log.read())
    work = owner.attempt_dir / "work"
    outcome, output = await run(runtime, job(tmp_path, spec(
        script=f"cat {work}/mine.txt; echo read=$?; ls {work}; echo list=$?; ls {owner.attempt_dir}; echo up=$?"),
        attempt_id="reader"))
    assert b"SECRET-OF-A" not in output
    assert fields(output)["read"] != "0" and fields(output)["list"] != "0"
    assert (work / "mine.txt").read_text() == "SECRET-OF-A\n"  # it was there all along
    go(owner)
    assert (await task).state == "Success"


# ---------------------------------------------------------------- outputs


@pytest.mark.parametrize("make, from_path", [
    ("ln -s {secret} out.txt", "/out.txt"),
    ("ln -s /etc/shadow out.txt", "/out.txt"),
    ("mkdir d && ln -s {secret} d/key", "/d"),
    ("ln -s {secret_dir} link", "/link/ca.key"),
    ("ln {secret} out.txt || echo x > out.txt && chmod 600 out.txt", "/out.txt"),
    ("mkfifo out.txt", "/out.txt"),
], ids=["link_to_key", "link_to_shadow", "link_in_a_directory", "link_on_the_way", "hard_link", "fifo"])
async def test_outputs_never_follow_a_link_out_of_the_job(make: str, from_path: str, tmp_path: Path,
                                                         visible_dir: Path) -> None:
    secret = secret_file(visible_dir)
    store = tmp_path / "store"
    command = make.format(secret=secret, secret_dir=visible_dir)
    outcome, output = await run(ProcessRuntime(), job(tmp_path, spec(script=command, output_files=[
        js.OutputFile(from_path=from_path, to_url=f"file://{store}/out")])))
    copied = [p.read_bytes() for p in store.rglob("*") if p.is_file()] if store.exists() else []
    assert not any(b"SECRET" in data or b"root:" in data for data in copied)
    if make.startswith("ln {secret}"):  # a hard link: refused by the kernel, or unreadable by the job
        assert outcome.state in ("Success", "Error")
        return
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error"), (outcome, output)
    assert "copying output files failed" in outcome.error_message
    assert "symbolic link" in outcome.error_message or "neither a regular file" in outcome.error_message


# ---------------------------------------------------------------- network


@needs_py
@pytest.mark.parametrize("mode", ["NETWORK_MODE_NONE", "NETWORK_MODE_PUBLIC"])
async def test_network_none_is_loopback_only(mode: str, tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        probe = ("import socket\n"
                 "def attempt(port):\n"
                 "    try:\n"
                 "        socket.create_connection(('127.0.0.1', port), timeout=5).close(); return 'connected'\n"
                 "    except OSError as e: return type(e).__name__\n"
                 f"print('host=' + attempt({port}))\n"
                 "own = socket.socket(); own.bind(('127.0.0.1', 0)); own.listen()\n"
                 "print('own=' + attempt(own.getsockname()[1]))\n")
        outcome, output = await run(ProcessRuntime(), job(tmp_path, spec(
            PY, "-c", probe, network_mode=js.NetworkMode.Value(mode))))
    assert outcome.state == "Success", output
    values = fields(output)
    assert values["own"] == "connected"  # loopback is up either way
    assert values["host"] == ("ConnectionRefusedError" if mode == "NETWORK_MODE_NONE" else "connected")
    if mode == "NETWORK_MODE_NONE":
        assert "none but its own loopback" in outcome.isolation



# ---------------------------------------------------------------- inputs


async def test_inputs_copy_links_as_links_and_never_write_through_one(tmp_path: Path, visible_dir: Path) -> None:
    secret = secret_file(visible_dir)
    source = tmp_path / "source"
    source.mkdir()
    (source / "data.txt").write_text("data\n")
    (source / "key").symlink_to(secret)
    (source / "escape").symlink_to(visible_dir)
    inputs = [js.InputFile(from_url=f"file://{source}", to_path="/in/dir")]
    outcome, output = await run(ProcessRuntime(), job(tmp_path, spec(
        script="cat in/dir/data.txt; cat in/dir/key; echo key=$?; echo link=$(readlink in/dir/key)",
        input_files=inputs), attempt_id="links"))
    assert outcome.state == "Success", output
    assert b"SECRET" not in output and fields(output) == {"key": "1", "link": str(secret)}
    # A later input whose path goes through a link of an earlier one is refused, not written where it leads.
    outcome, _ = await run(ProcessRuntime(), job(tmp_path, spec(script="true", input_files=[
        *inputs, js.InputFile(from_url=f"file://{source}/data.txt", to_path="/in/dir/escape/planted")]),
        attempt_id="through"))
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error")
    assert "symbolic link" in outcome.error_message
    assert not (visible_dir / "planted").exists()
