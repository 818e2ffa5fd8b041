"""`corral up` as a child process, for end-to-end tests and benchmarks: start
it, wait until it says it is up, read the endpoints it printed and the admin
token from the CLI profile it wrote (it never prints the token), keep reading
what it says afterwards (its supervision's lines), and stop it (and so
everything it started) by its pid."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from corral.cli_config import ADMIN_PROFILE, CONFIG_VARIABLE, Config

REPO_DIR = Path(__file__).resolve().parents[2]


@dataclasses.dataclass
class UpProcess:
    """A running `corral up`."""

    process: subprocess.Popen[str]
    data_dir: Path
    """Its --data-dir."""
    env: dict[str, str]
    """Environment for the CLI: CORRAL_CONFIG names the file `corral up` wrote."""
    endpoints: dict[str, str]
    """What it printed: frontend, auth, drivers, database, ca_cert, logs."""
    admin_token: str
    """The administrator's token, from the `admin` profile it wrote in CORRAL_CONFIG."""
    output: list[str]
    """The lines it printed: up to 'The CLI is configured ...' once started, and every line since
    as it comes (read in the background, so that it never blocks on a full pipe)."""
    reader: threading.Thread | None = None
    """Reads `output` until `corral up` exits."""

    def said(self, text: str) -> bool:
        """Whether a line it printed contains `text`."""
        return any(text in line for line in list(self.output))

    def wait(self, timeout_s: float = 90) -> int:
        """Wait for `corral up` to exit (however it was asked to); its exit code."""
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            if self.reader is not None and self.process.poll() is not None:
                self.reader.join(timeout=10)
            if self.process.stdout is not None and (self.reader is None or not self.reader.is_alive()):
                self.process.stdout.close()
        return code

    def stop(self, timeout_s: float = 90) -> int:
        """SIGTERM `corral up`; it stops everything it started. Waits for it; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.wait(timeout_s)


def start(work_dir: Path, *up_args: str, command: Sequence[str] | None = None,
          timeout_s: float = 180, repo: Path = REPO_DIR) -> UpProcess:
    """Start `corral up --data-dir WORK_DIR/data UP_ARGS` (or `command` instead of
    `corral up`, e.g. the README's scripts/up.sh) with CORRAL_CONFIG in WORK_DIR,
    and wait until it says it is up. Its workers use the process runtime, it runs no gateway and seeds its
    registry with busybox alone, unless UP_ARGS (or `command`) say otherwise. It runs in `repo`, whose
    code it and what it starts then import (another release's tree, say)."""
    env = {**os.environ, CONFIG_VARIABLE: str(work_dir / "cli.json")}
    data_dir = work_dir / "data"
    if command is None and "--worker-runtime" not in up_args:
        # Tests, faults and benchmarks run host programs in their jobs (python3, their own files):
        # the process runtime unless they ask for containers.
        up_args = ("--worker-runtime", "process", *up_args)
    if command is None and "--base-images" not in up_args:
        # busybox alone: the Debian images take minutes to build and seconds to push, which only the tests
        # that run them should pay.
        up_args = ("--base-images", "busybox", *up_args)
    if command is None and not {"--gateway", "--no-gateway"} & set(up_args):
        # Straight to the services unless they ask for the gateways, whose default ports are fixed (two at
        # once would clash) and whose hops the benchmarks' figures do not include.
        up_args = ("--no-gateway", *up_args)
    argv = [*(command or [sys.executable, "-m", "corral.cli", "up"]), "--data-dir", str(data_dir), *up_args]
    process = subprocess.Popen(argv, env=env, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + timeout_s
        assert process.stdout is not None
        while True:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError("corral up exited:\n" + "".join(lines))
            lines.append(line)
            if line.startswith("The CLI is configured"):
                break
            if time.monotonic() > deadline:
                raise RuntimeError("corral up did not come up:\n" + "".join(lines))
        token = Config.load(Path(env[CONFIG_VARIABLE])).profile(ADMIN_PROFILE).token
        if not token:
            raise RuntimeError(f"corral up wrote no admin token in {env[CONFIG_VARIABLE]}:\n" + "".join(lines))
    except BaseException:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
        raise
    endpoints = {}
    for line in lines:
        match = re.match(r"^  (\w+)\s+(\S.*)$", line.rstrip("\n"))
        if match and not line.startswith("  admin token:"):  # where the token is, not an endpoint
            endpoints[match.group(1)] = match.group(2)
    reader = threading.Thread(target=_read_rest, args=(process, lines), name="corral-up-output", daemon=True)
    reader.start()
    return UpProcess(process, data_dir, env, endpoints, token, lines, reader)


def _read_rest(process: subprocess.Popen[str], lines: list[str]) -> None:
    assert process.stdout is not None
    with contextlib.suppress(ValueError, OSError):  # closed under it: the process is gone
        for line in process.stdout:
            lines.append(line)
