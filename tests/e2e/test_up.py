"""`corral up` as a real process: it starts every service, the CLI it configures
works, its output never holds the admin token, and SIGTERM stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BATCH = """
billing_project: default
jobs:
  - name: a
    image: busybox
    command: [echo, hello]
  - image: busybox
    command: [echo, after]
    parents: [a]
"""


def corral(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "corral.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.mark.timeout(180)
def test_corral_up_runs_everything_and_stops_cleanly(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "cli.json")}
    up = subprocess.Popen([sys.executable, "-m", "corral.cli", "up", "--data-dir", str(tmp_path / "data")],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        assert up.stdout is not None
        while time.monotonic() < deadline:
            line = up.stdout.readline()
            assert line, f"corral up exited: {''.join(lines)}"
            lines.append(line)
            if line.startswith("The CLI is configured"):
                break
        output = "".join(lines)
        assert "corral is up." in output
        # Its output goes to a pipe here, as to a log or the journal: it says where the admin token is, and
        # never prints the token (a credential a log would keep).
        admin = json.loads((tmp_path / "cli.json").read_text())["profiles"]["admin"]
        token = admin["token"]
        # The pipeline library's defaults (ServiceBackend() with no arguments): the admin's project, and a
        # scratch directory under its storage.
        assert (admin["billing_project"], admin["remote_tmpdir"]) == (
            "default", f"file://{(tmp_path / 'data' / 'storage').resolve()}/default/tmp")
        assert token and token not in output and token.split(".")[-1] not in output
        assert (f"  admin token: in {tmp_path / 'cli.json'}, profile 'admin' (the CLI uses it; "
                "`corral profile env admin` prints it)\n") in lines, output
        shown = corral(env, "profile", "env", "admin")
        assert f"export CORRAL_TOKEN={token}" in shown.stdout.splitlines(), shown
        started = children(up.pid)
        assert len(started) >= 5  # mariadbd, auth, two drivers, frontend

        batch_file = tmp_path / "batch.yaml"
        batch_file.write_text(BATCH)
        submitted = corral(env, "submit", str(batch_file))
        assert submitted.returncode == 0, submitted.stderr
        assert "jobs=2" in submitted.stdout
        listed = corral(env, "ls")
        assert listed.returncode == 0 and "batch 1" in listed.stdout

        # Each project's files go under the data directory's storage/, which only this account may
        # enter; callbacks into the machine are refused (corral up allows no networks by default).
        assert (tmp_path / "data" / "storage").stat().st_mode & 0o777 == 0o700
        batch_file.write_text(BATCH + "callback_url: http://127.0.0.1:9/done\n")
        refused = corral(env, "submit", str(batch_file))
        assert refused.returncode != 0 and "127.0.0.1 is a loopback address" in refused.stderr, refused.stderr
    finally:
        up.send_signal(signal.SIGTERM)
        try:
            rest, _ = up.communicate(timeout=60)
        finally:
            up.kill()
    # What it said while stopping is the diagnosis when it did not stop cleanly.
    assert up.returncode == 0, rest
    assert "corral stopped." in rest, rest
    for pid in started:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
