"""The README works as written: its run command brings corral up, and the
quickstart lines that follow it (make a user, log in, submit a small DAG from
YAML, wait, read a log) run verbatim in a shell; then docs/client.md's first
example runs verbatim as the user the quickstart logged in."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e import cluster as up

README = up.REPO_DIR / "README.md"
CLIENT_DOC = up.REPO_DIR / "docs" / "client.md"


def readme_block(after_marker: str) -> str:
    """The first ```sh block after the line containing `after_marker`."""
    text = README.read_text()
    start = text.index(after_marker)
    match = re.search(r"```sh\n(.*?)```", text[start:], re.S)
    assert match, f"no sh block after {after_marker!r} in README.md"
    return match.group(1)


def run_command() -> list[str]:
    """The README's run command (the block under '## Run')."""
    [line] = [line for line in readme_block("## Run").splitlines() if line.strip()]
    return [str(up.REPO_DIR / word) if word.startswith("scripts/") else word for word in line.split()]


@pytest.mark.timeout(420)
def test_readme_run_command_and_quickstart_verbatim(tmp_path: Path) -> None:
    cluster = up.start(tmp_path, command=run_command())
    try:
        quickstart = readme_block("<!-- quickstart")
        venv_bin = up.REPO_DIR / ".venv" / "bin"
        work = tmp_path / "work"
        work.mkdir()
        result = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", quickstart], cwd=work, capture_output=True, text=True, timeout=240,
            env={**cluster.env, "PATH": f"{venv_bin}{os.pathsep}{os.environ['PATH']}",
                 "CORRAL_PASSWORD": "choose-a-password"})
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        out = result.stdout
        assert "logged in as alice" in out
        assert re.search(r"batch \d+ +complete +user=alice .*jobs=4 .*succeeded=4", out), out
        assert len(re.findall(r"^job \d+ +succeeded", out, re.M)) == 4, out
        assert out.rstrip().endswith("says HELLO"), out  # the log of job 2

        example = re.search(r"```python\n(.*?)```", CLIENT_DOC.read_text(), re.S)
        assert example, "no python block in docs/client.md"
        result = subprocess.run(
            [str(venv_bin / "python"), "-c", example.group(1)], cwd=work, capture_output=True, text=True,
            timeout=120, env=cluster.env)
        assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        batch_id, n_jobs = result.stdout.split()[:2]
        assert n_jobs == "102", result.stdout
        # The listing names states, not numbers: the new batch (running or, if cancelled by then, not listed).
        assert all(line.split()[1].startswith("BATCH_STATE_") for line in result.stdout.splitlines()[1:]), result.stdout
    finally:
        cluster.stop()
    assert cluster.process.returncode == 0
