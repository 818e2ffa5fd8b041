"""The `corral` command line as a real subprocess against real services."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.cli_common import EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_UNAUTHENTICATED
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database
from services.db.store import JobStore
from services.frontend.app import FrontendApp

BATCH_YAML = """
billing_project: proj
attributes: {name: cli-dag}
jobs:
  - name: fetch
    image: busybox
    command: [echo, fetch]
  - name: work
    image: busybox
    command: "echo work"
    parents: [fetch]
  - image: busybox
    command: [echo, cleanup]
    parents: [fetch, work]
    accept: [succeeded, failed]
    always_run: true
"""


async def corral(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "corral.cli", *args], env=env,
                                   capture_output=True, text=True, timeout=60)


async def logged_in(who: str, frontend_port: int, auth_app: AuthApp, certs: DevCertificateAuthority,
                    tmp_path: Path, admin: bool = False) -> dict[str, str]:
    """A new user `who` (an administrator if `admin`) and the environment of a CLI logged in as them."""
    await AuthStore(auth_app.db).create_user(who, roles=frozenset({"admin"}) if admin else frozenset(),
                                             password=f"{who}'s password")
    certs.ensure()
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / f"{who}.json"), "CORRAL_PASSWORD": f"{who}'s password"}
    login = await corral(env, "login", who, "--frontend", f"localhost:{frontend_port}",
                         "--auth", f"localhost:{auth_app.public_port}", "--ca-cert", str(certs.ca_cert_path))
    assert login.returncode == 0, login.stderr
    return env


@pytest.fixture
async def cli_env(frontend: FrontendApp, auth_app: AuthApp, certs: DevCertificateAuthority,  # noqa: F811
                  tmp_path: Path, db: Database) -> dict[str, str]:
    await AuthStore(auth_app.db).create_user("alice", password="correct horse")
    await JobStore(db).create_billing_project("proj", ["alice"])
    certs.ensure()
    return {**os.environ, "CORRAL_CONFIG": str(tmp_path / "config.json"), "CORRAL_PASSWORD": "correct horse"}


async def test_login_submit_ls_status_cancel(cli_env, frontend: FrontendApp, auth_app: AuthApp,  # noqa: F811
                                             certs: DevCertificateAuthority, tmp_path: Path) -> None:
    login = await corral(cli_env, "login", "alice", "--frontend", f"localhost:{frontend.public_port}",
                         "--auth", f"localhost:{auth_app.public_port}", "--ca-cert", str(certs.ca_cert_path))
    assert login.returncode == 0, login.stderr
    assert oct(Path(cli_env["CORRAL_CONFIG"]).stat().st_mode & 0o777) == "0o600"

    batch_file = tmp_path / "dag.yaml"
    batch_file.write_text(BATCH_YAML)
    submitted = await corral(cli_env, "submit", str(batch_file), "--json")
    assert submitted.returncode == 0, submitted.stderr
    batch = json.loads(submitted.stdout)[0]
    assert (batch["counts"]["nJobs"], batch["attributes"]["name"]) == ("3", "cli-dag")

    listed = await corral(cli_env, "ls", "name=cli-dag")
    assert listed.returncode == 0 and f"batch {batch['batchId']}" in listed.stdout
    status = await corral(cli_env, "status", batch["batchId"])
    assert "running" in status.stdout and "jobs=3" in status.stdout
    held = await corral(cli_env, "hold", batch["batchId"])
    assert held.returncode == 0 and held.stdout.startswith(f"batch {batch['batchId']} is held"), held.stderr
    assert "was already held" in (await corral(cli_env, "hold", batch["batchId"])).stdout
    assert "running (held by alice)" in (await corral(cli_env, "status", batch["batchId"])).stdout
    job = await corral(cli_env, "hold", batch["batchId"], "1", "--json")
    assert json.loads(job.stdout) == {"change": "held"}, job.stderr
    assert "job group" in (await corral(cli_env, "release", batch["batchId"], "--group", "0")).stdout
    assert "is released" in (await corral(cli_env, "release", batch["batchId"], "1")).stdout
    assert "was not held" in (await corral(cli_env, "release", batch["batchId"])).stdout
    both = await corral(cli_env, "hold", batch["batchId"], "1", "--group", "0")
    assert both.returncode != 0 and "not both" in both.stderr
    nothing = await corral(cli_env, "hold", batch["batchId"], "99")
    assert nothing.returncode == EXIT_NOT_FOUND and "no job 99" in nothing.stderr
    cancelled = await corral(cli_env, "cancel", batch["batchId"], "--reason", "typo")
    assert "cancelled by alice: typo" in cancelled.stdout

    bad = await corral(cli_env, "ls", "cost>>1")
    assert bad.returncode == EXIT_REFUSED and "error:" in bad.stderr and "query" in bad.stderr
    missing = await corral(cli_env, "status", "9999")
    assert missing.returncode == EXIT_NOT_FOUND and "no batch 9999" in missing.stderr


async def test_commands_need_a_login(tmp_path: Path) -> None:
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.json")}
    result = await corral(env, "ls")
    assert result.returncode == EXIT_UNAUTHENTICATED and "corral login" in result.stderr
