"""The clients' calls for jobs, logs, groups, billing and users, and the CLI
commands on them (`corral jobs`, `job`, `logs`, `rerun`, `cancel-group`,
`delete`, `billing`, `users`) as real subprocesses, against a real frontend
and auth service."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral import aio
from corral.auth.v1 import user_pb2
from corral.batch.v1 import job_explanation_pb2, job_group_pb2
from corral.cli_common import EXIT_NOT_FOUND, EXIT_PERMISSION_DENIED, EXIT_REFUSED
from corral.errors import NotFound, PermissionDenied, UsageError
from services.auth.app import AuthApp
from services.common.tls import DevCertificateAuthority
from services.worker.logs import LogSink
from tests.service.test_jobs import Env, complete, env, spec  # noqa: F401 - env is a fixture


async def corral(config: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    environment = {**os.environ, "CORRAL_CONFIG": str(config)}
    environment.pop("CORRAL_NEW_PASSWORD", None)
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "corral.cli", *args], env=environment,
                                   capture_output=True, timeout=60, input=stdin.encode() if stdin else None)


def logged_in(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority, tmp_path: Path, who: str) -> Path:
    """A CLI configuration file holding `who`'s token, as `corral login` writes it."""
    path = tmp_path / f"{who}.json"
    path.write_text(json.dumps({"frontend": f"localhost:{env.frontend.public_port}",
                                "auth": f"localhost:{auth_app.public_port}",
                                "ca_cert": str(certs.ca_cert_path), "token": env.tokens[who]}))
    return path


def out(result: subprocess.CompletedProcess[bytes]) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


async def test_jobs_job_logs_rerun_cancel_group_delete(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                                       tmp_path: Path) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(name="fetch"), spec(-1, name="align"))
    attempt = await w.run(batch_id, 1)
    sink = LogSink(tmp_path / "worker" / "main.log")
    sink.write(b"hello\nworld\n")
    sink.close()
    await sink.upload(f"file://{env.blobs}/logs/{batch_id}/1/{attempt}/main.log")
    await complete(env, batch_id, 1, attempt, "Failed", exit_code=3, error_message="boom")
    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    b = str(batch_id)

    listed, failed, job, log, tail, follow = await asyncio.gather(
        corral(alice, "jobs", b), corral(alice, "jobs", b, "state=failed", "--json"), corral(alice, "job", b, "2"),
        corral(alice, "logs", b, "1"), corral(alice, "logs", b, "1", "--tail", "6"),
        corral(alice, "logs", b, "1", "--follow"))
    assert out(listed).splitlines() == [
        "job 1  failed  exit=3  group=0  cost=$0.000000  name=fetch  error: boom",
        "job 2  ready  group=0  cost=$0.000000  name=align"]
    assert [(j["jobId"], j["exitCode"]) for j in json.loads(out(failed))] == [("1", 3)]
    assert "why: parent failed: parents ended in states their edge does not accept: 1 (failed)" in out(job)
    assert (log.stdout, tail.stdout, follow.stdout) == (b"hello\nworld\n", b"world\n", b"hello\nworld\n")
    assert follow.stderr.decode().splitlines() == [f"--- attempt 1 ({attempt}) on i1 ---", "--- job 1 failed ---"]

    rerun = await corral(alice, "rerun", b, "--token", "cli")
    assert out(rerun) == f"batch {b}: update 2 re-runs 2 job(s) as jobs 3-4\n"
    again = await corral(alice, "rerun", b, "--token", "cli", "--json")
    assert json.loads(out(again))[0]["startJobId"] == "3"
    cancelled = await corral(alice, "cancel-group", b, "0", "--reason", "enough")
    assert out(cancelled) == f"job group 0 of batch {b}: cancelled by alice: enough\n"
    bad = await corral(alice, "jobs", b, "cost>>1")
    assert bad.returncode == EXIT_REFUSED and b"error:" in bad.stderr and b"query" in bad.stderr
    assert out(await corral(alice, "delete", b)) == f"batch {b} deleted\n"
    gone = await corral(alice, "jobs", b)
    assert gone.returncode == EXIT_NOT_FOUND and f"no batch {b}".encode() in gone.stderr



async def test_cancel_and_cancel_group_of_a_finished_batch_say_so(env: Env, auth_app: AuthApp,
                                                                 certs: DevCertificateAuthority,
                                                                 tmp_path: Path) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec())
    await complete(env, batch_id, 1, await w.run(batch_id, 1), "Success")
    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    b = str(batch_id)
    group = await corral(alice, "cancel-group", b, "0")
    assert out(group) == f"job group 0 of batch {b} is already complete: nothing to cancel\n"
    batch = out(await corral(alice, "cancel", b)).splitlines()
    assert batch[0] == f"batch {b} is already complete: nothing to cancel"
    assert f"batch {b}  complete  user=alice" in batch[1] and "cancelled by" not in batch[1]


async def test_cancel_group_of_an_empty_group_cancels_it(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                                        tmp_path: Path) -> None:
    """Issue 36: a group with no jobs yet is not finished: `corral cancel-group` cancels it (before, it said
    `already complete: nothing to cancel` and recorded nothing)."""
    batch_id = await env.submit(spec(), groups=(job_group_pb2.JobGroupSpec(),))
    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    cancelled = await corral(alice, "cancel-group", str(batch_id), "1", "--reason", "wrong input")
    assert out(cancelled) == f"job group 1 of batch {batch_id}: cancelled by alice: wrong input\n"


async def test_billing_and_users(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority,
                                 tmp_path: Path) -> None:
    root = logged_in(env, auth_app, certs, tmp_path, "root")
    created = await corral(root, "users", "create", "dave", "--role", "developer", "--password-stdin",
                           stdin="a long password\n")
    assert out(created) == "dave  person  active  roles=developer\n"
    listed = json.loads(out(await corral(root, "users", "list", "--json")))
    assert [u["username"] for u in listed] == ["alice", "bob", "carol", "dave", "root"]
    secret = out(await corral(root, "users", "token", "dave", "--name", "ci")).strip()
    dave = tmp_path / "dave.json"
    dave.write_text(root.read_text().replace(env.tokens["root"], secret))

    lab = await corral(root, "billing", "create", "lab", "--member", "dave", "--limit", "5")
    assert out(lab) == "lab  open  members=dave,root  limit=$5.000000  max_job_duration=3600s  spend=$0.000000\n"
    for args, expected in ((("add-member", "lab", "alice"), "members=alice,dave,root"),
                           (("remove-member", "lab", "alice"), "members=dave,root"),
                           (("limit", "lab", "none"), "limit=none"),
                           (("close", "lab"), "lab  closed"),
                           (("reopen", "lab"), "lab  open")):
        assert expected in out(await corral(root, "billing", *args))
    shown = json.loads(out(await corral(dave, "billing", "show", "lab", "--json")))
    assert (shown[0]["name"], shown[0]["members"]) == ("lab", ["dave", "root"])
    assert out(await corral(dave, "billing", "spend", "lab", "--by", "user")) == "lab  spend=$0.000000\n"
    assert [line.split()[0] for line in out(await corral(dave, "billing", "list")).splitlines()] == ["elsewhere",
                                                                                                      "lab", "proj"]

    alice = logged_in(env, auth_app, certs, tmp_path, "alice")
    refused = await asyncio.gather(corral(alice, "billing", "create", "mine"), corral(alice, "users", "list"),
                                   corral(alice, "billing", "show", "lab"))
    for result, code in zip(refused, (EXIT_PERMISSION_DENIED, EXIT_PERMISSION_DENIED, EXIT_NOT_FOUND)):
        assert result.returncode == code and result.stderr.startswith(b"error: "), result.stderr
    assert b"no billing project lab" in refused[2].stderr  # outsiders are told what a missing one gets


async def test_the_async_client(env: Env, auth_app: AuthApp, certs: DevCertificateAuthority) -> None:
    w = env.world
    await w.instance()
    batch_id = await env.submit(spec(name="a"), spec(-1, name="b"), groups=())
    attempt = await w.run(batch_id, 1)
    sink = LogSink(env.blobs.parent / "worker" / "main.log")
    sink.write(b"x" * 100)
    sink.close()
    await sink.upload(f"file://{env.blobs}/logs/{batch_id}/1/{attempt}/main.log")
    await complete(env, batch_id, 1, attempt, "Failed", exit_code=1)
    address = f"localhost:{env.frontend.public_port}"
    async with aio.Client(address, env.tokens["alice"], certs.ca_cert_path) as client:
        assert [j.job_id async for j in client.jobs(batch_id, page_size=1)] == [1, 2]
        assert (await client.get_job(batch_id, 2)).spec.parents[0].job_id == 1
        assert (await client.explain_job(batch_id, 2)).reasons[0].code == \
            job_explanation_pb2.WAIT_REASON_CODE_PARENT_FAILED
        assert await client.job_log(batch_id, 1, start_byte=-10) == b"x" * 10
        assert b"".join([chunk async for chunk in client.follow_log(batch_id, 1, attempt)]) == b"x" * 100
        assert [g.job_group_id async for g in client.job_groups(batch_id)] == [0]
        update = await client.rerun_failed(batch_id, ["failed"], token="t")
        assert update is not None and (update.start_job_id, update.n_jobs) == (3, 2)
        assert (await client.cancel_job_group(batch_id, 0, "done")).cancellation.reason == "done"
        assert [p.name async for p in client.billing_projects()] == ["proj"]
        assert await client.spend("proj", "day") == (0, [])
        with pytest.raises(UsageError, match="auth_address"):
            await client.create_user("eve")
        with pytest.raises(PermissionDenied):
            await client.set_limit("proj", 1.0)
        await client.delete_batch(batch_id)
        with pytest.raises(NotFound):
            await client.get_job(batch_id, 1)
    async with aio.Client(address, env.tokens["root"], certs.ca_cert_path,
                          auth_address=f"localhost:{auth_app.public_port}") as admin:
        assert (await admin.create_user("eve", ["user"], service=True)).kind == user_pb2.USER_KIND_SERVICE
        token, secret = await admin.create_token("ci", "eve", ttl_s=3600)
        assert token.username == "eve" and secret
        assert [u.username async for u in admin.users()][-2:] == ["eve", "root"]
        assert (await admin.set_limit("proj", 2.5)).limit_micro_usd == 2_500_000
