"""The `corral` command line says a real server's refusals in the words its user typed (issue 36, items 5, 7
and 9): a batch file's key, line, column and units; a command's option; a query's key with "did you mean".
Real subprocesses against a real frontend and auth service."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from corral.cli_common import EXIT_REFUSED, EXIT_USAGE
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.frontend.app import FrontendApp
from tests.service.test_cli import cli_env, corral  # noqa: F401 - cli_env is a fixture

CORES = """\
billing_project: proj
jobs:
  - name: small
    image: busybox
    cores: 100
    command: [echo, hi]
"""


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert result.returncode == code, result.stderr
    return lines[0].removeprefix("error: ")


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stderr
    return result.stdout


async def test_refusals_in_the_users_words(cli_env, frontend: FrontendApp, auth_app: AuthApp,  # noqa: F811
                                           certs: DevCertificateAuthority, tmp_path: Path) -> None:
    servers = ["--frontend", f"localhost:{frontend.public_port}", "--auth", f"localhost:{auth_app.public_port}",
               "--ca-cert", str(certs.ca_cert_path)]
    without_password = {k: v for k, v in cli_env.items() if k != "CORRAL_PASSWORD"}
    # Item 7: the password from stdin, as `users create` takes one.
    login = await _corral_stdin(without_password, "correct horse\n", "login", "alice", "--password-stdin", *servers)
    assert "logged in as alice" in ok(login)

    # Item 5: `cores: 100` said as the file wrote it, where it wrote it, in cores.
    batch_file = tmp_path / "batch.yaml"
    batch_file.write_text(CORES)
    refused = await corral(cli_env, "submit", str(batch_file))
    assert one_error(refused, EXIT_REFUSED) == (
        f"{batch_file}:5:12: jobs[0] (name: small): cores: must be between 0 and 64")
    debug = await corral(cli_env, "--debug", "submit", str(batch_file))
    assert "field jobs[0].resources.cores_mcpu: must be between 0 and 64000" in debug.stderr  # the API's path

    # Item 9: a slip of a keyword is refused at its position; `failed` and `failure` both work.
    assert one_error(await corral(cli_env, "ls", "stat=running"), EXIT_REFUSED) == (
        "the query: at character 0: unknown key 'stat'; did you mean state? (an attribute of that name is written "
        'quoted: "stat"=...)')
    ok(await corral(cli_env, "ls", "state=failed"))
    batch_file.write_text(CORES.replace("cores: 100", "cores: 1"))
    batch_id = ok(await corral(cli_env, "submit", "-q", str(batch_file))).strip()
    ok(await corral(cli_env, "jobs", batch_id, "state=failure"))

    # Item 5: an option's name and unit; item 9: a token of 0 days is refused, not 30 days.
    await AuthStore(auth_app.db).create_user("root", roles=frozenset({"admin"}), password="admin horse")
    root = await _corral_stdin({**without_password, "CORRAL_CONFIG": str(tmp_path / "root.json")}, "admin horse\n",
                               "login", "root", "--password-stdin", *servers)
    ok(root)
    as_root = {**cli_env, "CORRAL_CONFIG": str(tmp_path / "root.json")}
    assert one_error(await corral(as_root, "billing", "limit", "proj", "-5"), EXIT_REFUSED) == (
        "the limit (USD): must be between 0 and 1,000,000,000 (1e9 USD)")
    assert one_error(await corral(as_root, "users", "token", "alice", "--ttl-days", "0"), EXIT_REFUSED) == (
        "--ttl-days: must be positive and at most a year")
    ok(await corral(as_root, "users", "token", "alice", "--ttl-days", "1"))
    # A usage mistake is found before any call.
    assert one_error(await corral(as_root, "login", "--token", "-", "--password-stdin"), EXIT_USAGE).startswith(
        "--password-stdin is for a username's password")


async def _corral_stdin(env: dict[str, str], stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "corral.cli", *args], env=env,
                                   capture_output=True, text=True, timeout=60, input=stdin)
