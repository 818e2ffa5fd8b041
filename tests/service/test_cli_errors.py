"""The `corral` command line against real services: a refused or unauthenticated call, or a closed pipe,
is one `error: ...` line (or nothing) and its exit code (docs/cli.md#exit-codes)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from corral.cli_common import (
    EXIT_BROKEN_PIPE,
    EXIT_NOT_FOUND,
    EXIT_PERMISSION_DENIED,
    EXIT_REFUSED,
    EXIT_UNAUTHENTICATED,
)
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.frontend.app import FrontendApp
from tests.service.test_cli import cli_env, corral  # noqa: F401 - cli_env is a fixture


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one `error: ...` line, checking it is all of stderr and that the exit code is `code`."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.returncode == code, result.stderr
    return lines[0]


async def test_refused_calls_are_one_line_and_their_exit_code(cli_env, frontend: FrontendApp,  # noqa: F811
                                                              auth_app: AuthApp, certs: DevCertificateAuthority,
                                                              tmp_path: Path) -> None:
    people = AuthStore(auth_app.db)
    token, expired = await people.create_token("alice", "api", name="expiring")
    await auth_app.db.execute("UPDATE tokens SET time_expires_ms = 1 WHERE token_id = %s", (token.token_id,))
    _, valid = await people.create_token("alice", "api", name="cli")
    config = Path(cli_env["CORRAL_CONFIG"])

    def as_alice(secret: str) -> None:
        config.write_text(json.dumps({"frontend": f"localhost:{frontend.public_port}",
                                      "auth": f"localhost:{auth_app.public_port}",
                                      "ca_cert": str(certs.ca_cert_path), "token": secret}))

    as_alice(expired)
    assert "token" in one_error(await corral(cli_env, "ls"), EXIT_UNAUTHENTICATED)
    as_alice(valid)
    assert "no batch 9999" in one_error(await corral(cli_env, "status", "9999"), EXIT_NOT_FOUND)
    assert "query" in one_error(await corral(cli_env, "ls", "cost>>1"), EXIT_REFUSED)
    one_error(await corral(cli_env, "users", "list"), EXIT_PERMISSION_DENIED)

    # `corral jobs B | head`: the reader is gone before the jobs are written.
    batch_file = tmp_path / "many.yaml"
    batch_file.write_text("billing_project: proj\njobs:\n" + "".join(
        f"  - image: busybox\n    command: [echo, '{i}']\n" for i in range(200)))
    submitted = await corral(cli_env, "submit", "-q", str(batch_file))
    assert submitted.returncode == 0, submitted.stderr
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        jobs = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "corral.cli", "jobs",
                                                        submitted.stdout.strip()],
                                       stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60,
                                       env={k: v for k, v in cli_env.items() if k != "PYTHONUNBUFFERED"})
    finally:
        os.close(write_end)
    assert (jobs.returncode, jobs.stderr) == (EXIT_BROKEN_PIPE, "")
