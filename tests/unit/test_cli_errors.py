"""Every failure of the `corral` command line is one `error: ...` line on stderr and a documented exit code
(docs/cli.md#exit-codes); `--debug` shows the traceback instead. These need no server: the mistakes are
found before any call, or the server is not there."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from corral import cli_batches, errors
from corral.cli import main
from corral.cli_common import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_PERMISSION_DENIED,
    EXIT_REFUSED,
    EXIT_UNAUTHENTICATED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)


@pytest.fixture(autouse=True)
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A configuration file of the test's own (none yet), and no token from the environment."""
    path = tmp_path / "config.json"
    monkeypatch.setenv("CORRAL_CONFIG", str(path))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    return path


def corral(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run the CLI in this process: its exit code and what it wrote to stderr."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own exit
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


def one_error(stderr: str) -> str:
    """The one `error: ...` line, checking it is the only thing on stderr."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    return lines[0]


def batch_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "batch.yaml"
    path.write_text(text)
    return str(path)


JOB = "billing_project: p\njobs:\n  - name: a\n    image: busybox\n    command: [echo, hi]\n"


@pytest.mark.parametrize(("name", "text"), [
    ("cores: lots", JOB + "    cores: lots\n"),
    ("accept: [done]", JOB + "  - image: busybox\n    command: [echo]\n    parents: [a]\n    accept: [done]\n"),
    ("env is a mapping", JOB + "    env: [A]\n"),
    ("priority is a number", JOB + "    priority: high\n"),
    ("jobs is a list", "billing_project: p\njobs: 5\n"),
    ("a job is a mapping", "billing_project: p\njobs: [1]\n"),
    ("a list, not a mapping", "- billing_project: p\n"),
])
def test_a_batch_file_with_wrong_values(capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str,
                                        text: str) -> None:
    code, stderr = corral(capsys, "submit", batch_file(tmp_path, text))
    one_error(stderr)
    assert code == EXIT_USAGE, name


def test_a_yaml_syntax_error_says_where(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = batch_file(tmp_path, "billing_project: p\njobs:\n  - image: [busybox\n    command: x\n")
    code, stderr = corral(capsys, "submit", path)
    line = one_error(stderr)
    assert code == EXIT_USAGE and f"{path}:" in line and "YAML" in line, line


def test_a_missing_or_unreadable_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, stderr = corral(capsys, "submit", str(tmp_path / "nowhere.yaml"))
    line = one_error(stderr)
    assert code == EXIT_USAGE and "nowhere.yaml" in line and "No such file or directory" in line, line
    code, stderr = corral(capsys, "submit", str(tmp_path))  # a directory: root reads any file, not this
    line = one_error(stderr)
    assert code == EXIT_USAGE and "Is a directory" in line, line


@pytest.mark.parametrize("argv", [["status", "seven"], ["jobs", "7", "--limit", "lots"], [], ["nonsense"]])
def test_a_wrong_command_line_is_one_line_too(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, stderr = corral(capsys, *argv)
    assert code == EXIT_USAGE and "--help" in one_error(stderr)


def test_not_logged_in(capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr = corral(capsys, "ls")
    assert code == EXIT_UNAUTHENTICATED and "corral login" in one_error(stderr)


def test_a_broken_configuration_file(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    config.write_text("{not json")
    code, stderr = corral(capsys, "ls")
    assert code == EXIT_USAGE and str(config) in one_error(stderr)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_server(capsys: pytest.CaptureFixture[str], config: Path) -> None:
    config.write_text(json.dumps({"frontend": f"localhost:{closed_port()}", "auth": "localhost:1",
                                  "token": "secret"}))
    code, stderr = corral(capsys, "status", "1")
    one_error(stderr)
    assert code == EXIT_UNAVAILABLE


def test_a_server_that_is_down_is_a_sentence_naming_its_address(config: Path) -> None:
    """gRPC's "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:8443" was the line
    (issue 36): the CLI says which address, as configured, and why, as a real process does."""
    port = closed_port()
    config.write_text(json.dumps({"frontend": f"localhost:{port}", "auth": "localhost:1", "token": "secret"}))
    done = subprocess.run([sys.executable, "-m", "corral.cli", "ls"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "CORRAL_CONFIG": str(config)})
    assert (done.returncode, done.stderr) == (
        EXIT_UNAVAILABLE, f"error: cannot reach corral at localhost:{port}: connection refused; is corral up running?\n")
    debug = subprocess.run([sys.executable, "-m", "corral.cli", "--debug", "ls"], capture_output=True, text=True,
                           timeout=60, env={**os.environ, "CORRAL_CONFIG": str(config)})
    assert "debug: status UNAVAILABLE: failed to connect" in debug.stderr  # gRPC's own words, for --debug


def test_login_without_a_terminal_says_how_to_give_the_password(config: Path, tmp_path: Path) -> None:
    """No terminal, no --password-stdin, no $CORRAL_PASSWORD: a GetPassWarning and `error: EOFError` were the
    answer (issue 36). A session of its own has no controlling terminal, as under cron or CI."""
    environment = {k: v for k, v in os.environ.items() if k not in ("CORRAL_PASSWORD", "CORRAL_TOKEN")}
    done = subprocess.run([sys.executable, "-m", "corral.cli", "login", "alice", "--frontend", "localhost:1",
                           "--auth", "localhost:2"], capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL, start_new_session=True,
                          env={**environment, "CORRAL_CONFIG": str(config)})
    assert (done.returncode, done.stderr) == (EXIT_USAGE, "error: no terminal to ask for a password: pipe it with "
                                                          "--password-stdin or set CORRAL_PASSWORD\n")


@pytest.mark.parametrize(("error", "code"), [
    (errors.InvalidArgument, EXIT_REFUSED),
    (errors.FailedPrecondition, EXIT_REFUSED),
    (errors.NotFound, EXIT_NOT_FOUND),
    (errors.Unauthenticated, EXIT_UNAUTHENTICATED),
    (errors.PermissionDenied, EXIT_PERMISSION_DENIED),
    (errors.Unavailable, EXIT_UNAVAILABLE),
    (errors.CorralError, EXIT_FAILED),
    (RuntimeError, EXIT_FAILED),  # a bug: still one line, and --debug shows where
])
def test_each_server_error_has_its_exit_code(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                             error: type[Exception], code: int) -> None:
    def refused(args: object) -> int:
        raise error("the server says no\n(on two lines)")

    monkeypatch.setattr(cli_batches, "_status", refused)
    exit_code, stderr = corral(capsys, "status", "1")
    assert (exit_code, "the server says no (on two lines)" in one_error(stderr)) == (code, True)


def test_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(args: object) -> int:
        raise errors.NotFound("no batch 1")

    monkeypatch.setattr(cli_batches, "_status", refused)
    with pytest.raises(errors.NotFound):
        main(["--debug", "status", "1"])


def test_ctrl_c_is_quiet(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_batches, "_status", interrupted)
    assert corral(capsys, "status", "1") == (EXIT_INTERRUPTED, "")


def buffered_environment() -> dict[str, str]:
    """The environment, with stdout buffered as it is by default (the pipe then fails when stdout is
    flushed, not at the first print)."""
    return {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}


def test_a_closed_pipe_ends_quietly(config: Path) -> None:
    """`corral ... | head`: the reader went away before the output was written."""
    config.write_text(json.dumps({"current": "p0", "profiles": {
        f"p{i}": {"frontend": "localhost:1", "auth": "localhost:2", "token": "t"} for i in range(100)}}))
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "corral.cli", "profile", "list"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60,
                              env={**buffered_environment(), "CORRAL_CONFIG": str(config)})
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (EXIT_BROKEN_PIPE, "")
