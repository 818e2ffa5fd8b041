"""Batch files against a real frontend: a generated file that sets every JobSpec and JobGroupSpec field
submits and reads back equal (GetJob, ListJobGroups), and `corral submit` refuses a bad file with one
`error: FILE:LINE:COLUMN: ...` line, sending nothing."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import corral
from corral import aio
from corral.batch.v1 import batch_pb2, job_spec_pb2
from corral.batch_file import parse_batch_file, read_batch_file
from corral.cli_common import EXIT_REFUSED, EXIT_USAGE
from services.auth.app import AuthApp
from services.auth.store import AuthStore
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.frontend.app import FrontendApp
from services.frontend.validate import retry_policy_json
from tests.every_field import every_field_yaml, expected_specs
from tests.service.test_submission_urls import frontend_with


@pytest.fixture
async def storage_frontend(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                           tmp_path: Path) -> AsyncIterator[FrontendApp]:
    """A frontend whose projects keep their files under tmp_path/storage/PROJECT/."""
    app = await frontend_with(auth_app, db_config, certs, tmp_path,
                              storage_roots=(f"file://{tmp_path}/storage/{{project}}/",))
    try:
        yield app
    finally:
        await app.stop()


@pytest.fixture
async def alice_token(auth_app: AuthApp, db: Database) -> str:
    """alice's API token; she is a member of billing project 'proj', which has the secrets the every-field
    file mounts and pulls its image with (submission checks only that they exist: their rows hold no real
    box)."""
    store = AuthStore(auth_app.db)
    await store.create_user("alice")
    await JobStore(db).create_billing_project("proj", ["alice"])
    await db.execute("""INSERT INTO secrets (billing_project, name, file_names, sealed, key_id, created_by,
                                             time_created_ms)
                        VALUES ('proj', 'bucket-key', '["key"]', '', '', 'alice', 0),
                               ('proj', 'registry-login', '["password", "username"]', '', '', 'alice', 0)""")
    return (await store.create_token("alice", "api"))[1]


async def test_a_file_with_every_field_submits_and_reads_back_equal(
        storage_frontend: FrontendApp, alice_token: str, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    root = f"file://{tmp_path}/storage/proj"
    batch_file = tmp_path / "every.yaml"
    batch_file.write_text(every_field_yaml(root))
    async with aio.Client(f"localhost:{storage_frontend.public_port}", alice_token, certs.ca_cert_path) as client:
        # machine_type is refused: no deployment makes job-private machines yet (services.policy.runnable).
        with pytest.raises(corral.errors.InvalidArgument) as refused:
            await client.submit(read_batch_file(batch_file))
        assert [v.field for v in refused.value.field_violations] == ["jobs[1].machine_type"]
        # Every other field submits and reads back.
        batch_file.write_text(every_field_yaml(root, runnable=True))
        groups, jobs = expected_specs(root, runnable=True)
        batch = await client.submit(read_batch_file(batch_file))
        assert (batch.counts.n_jobs, batch.attributes["name"], batch.cancel_after_n_failures) == \
            (len(jobs), "every-field", 4)
        read_groups = [g async for g in client.job_groups(batch.batch_id)]
        read_jobs = [await client.get_job(batch.batch_id, job_id) for job_id in range(1, len(jobs) + 1)]

    group_ids = [g.job_group_id for g in read_groups if g.job_group_id != 0]
    assert group_ids == [1, 2]
    for group, expected in zip([g for g in read_groups if g.job_group_id != 0], groups, strict=True):
        assert dict(group.attributes) == dict(expected.attributes)
        assert group.cancel_after_n_failures == expected.cancel_after_n_failures
        # As applied: a delay the file leaves out reads back as its default.
        assert group.HasField("retry_policy") and retry_policy_json(group.retry_policy) == \
            retry_policy_json(expected.retry_policy)
        parent = expected.parent.in_update_index + 1 if expected.HasField("parent") else 0
        assert group.parent_job_group_id == parent

    for job_id, (job, expected) in enumerate(zip(read_jobs, jobs, strict=True), start=1):
        absolute = job_spec_pb2.JobSpec()
        absolute.CopyFrom(expected)  # the server answers with absolute ids: resolve the file's references
        group = expected.job_group.in_update_index + 1 if expected.HasField("job_group") else 0
        absolute.job_group.CopyFrom(job_spec_pb2.JobGroupRef(job_group_id=group))
        del absolute.parents[:]
        for parent in expected.parents:
            absolute.parents.add(job_id=job_id + parent.in_update_offset, accepted_states=parent.accepted_states)
        assert job.spec == absolute, f"job {job_id}"
        assert job.job_group_id == group


async def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "corral.cli", *args], env=env,
                                   capture_output=True, text=True, timeout=60)


async def test_corral_submit_refuses_a_bad_file_with_one_line_and_sends_nothing(
        storage_frontend: FrontendApp, alice_token: str, auth_app: AuthApp, certs: DevCertificateAuthority,
        tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": f"localhost:{storage_frontend.public_port}",
                                  "auth": f"localhost:{auth_app.public_port}", "ca_cert": str(certs.ca_cert_path),
                                  "token": alice_token}))
    env = {**os.environ, "CORRAL_CONFIG": str(config)}
    bad = tmp_path / "batch.yaml"
    bad.write_text("billing_project: proj\njobs:\n  - name: a\n    image: busybox\n    command: [echo]\n"
                   "  - image: busybox\n    command: [echo]\n    parent: [a]\n")
    refused = await run_cli(env, "submit", str(bad))
    assert refused.returncode == EXIT_USAGE
    assert refused.stderr == f"error: {bad}:8:5: jobs[1]: unknown key 'parent'; did you mean 'parents'?\n"
    missing = await run_cli(env, "submit", str(tmp_path / "missing.yaml"))
    assert (missing.returncode, missing.stderr) == (
        EXIT_USAGE, f"error: {tmp_path / 'missing.yaml'}: cannot read the batch file: No such file or directory\n")

    async with aio.Client(f"localhost:{storage_frontend.public_port}", alice_token, certs.ca_cert_path) as client:
        assert [b async for b in client.list_batches()] == []

    good = tmp_path / "every.yaml"
    good.write_text(every_field_yaml(f"file://{tmp_path}/storage/proj", runnable=True))
    submitted = await run_cli(env, "submit", str(good), "--json")
    assert submitted.returncode == 0, submitted.stderr
    assert json.loads(submitted.stdout)[0]["counts"]["nJobs"] == str(len(expected_specs("", runnable=True)[1]))


@pytest.mark.parametrize("client_kind", ["aio", "sync"])
async def test_a_large_batch_sends_its_groups_before_its_bunches(
        storage_frontend: FrontendApp, alice_token: str, certs: DevCertificateAuthority, client_kind: str) -> None:
    """More jobs than one SubmitBatch: CreateBatch reserves the groups, CreateJobGroups sends them, then the
    bunches (both clients)."""
    text = "billing_project: proj\njob_groups:\n  - {name: outer, attributes: {g: outer}}\n" \
           "  - {name: inner, parent: outer}\ndefaults: {image: busybox, command: [echo], job_group: inner}\njobs:\n"
    text += "".join(f"  - {{name: j{i}}}\n" for i in range(aio.SMALL_BATCH + 5))
    builder = parse_batch_file(text)
    address = f"localhost:{storage_frontend.public_port}"
    if client_kind == "aio":
        async with aio.Client(address, alice_token, certs.ca_cert_path) as client:
            batch = await client.submit(builder, bunch_size=400)
    else:
        def submit() -> batch_pb2.Batch:
            with corral.Client(address, alice_token, certs.ca_cert_path) as client:
                return client.submit(builder, bunch_size=400)
        batch = await asyncio.to_thread(submit)
    assert batch.counts.n_jobs == aio.SMALL_BATCH + 5
    async with aio.Client(address, alice_token, certs.ca_cert_path) as client:
        groups = {g.job_group_id: g async for g in client.job_groups(batch.batch_id)}
        last = await client.get_job(batch.batch_id, aio.SMALL_BATCH + 5)
    assert (groups[1].attributes["g"], groups[2].parent_job_group_id) == ("outer", 1)
    assert groups[2].counts.n_jobs == aio.SMALL_BATCH + 5 and last.job_group_id == 2


async def test_corral_submit_refuses_images_that_are_not_references_one_line_each_and_writes_nothing(
        storage_frontend: FrontendApp, alice_token: str, auth_app: AuthApp, certs: DevCertificateAuthority,
        db: Database, tmp_path: Path) -> None:
    """Issue 35, acceptance 3: `image: Busybox`, `image: busybox:` and a malformed digest are each refused at
    submission (INVALID_ARGUMENT, exit 4) with one `error:` line naming the job's `image` and what is wrong, and
    no batch exists afterwards."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": f"localhost:{storage_frontend.public_port}",
                                  "auth": f"localhost:{auth_app.public_port}", "ca_cert": str(certs.ca_cert_path),
                                  "token": alice_token}))
    env = {**os.environ, "CORRAL_CONFIG": str(config)}
    for image, words in (
            ("Busybox", "image 'Busybox': 'Busybox' is not a valid repository component (repositories are lowercase)"),
            ("'busybox:'", "image 'busybox:': tag '' is not letters, digits, '_', '.' and '-'"),
            ("busybox@sha256:0123", "image 'busybox@sha256:0123': digest 'sha256:0123' is not sha256: and 64 "
                                    "lowercase hex digits")):
        bad = tmp_path / "image.yaml"
        bad.write_text(f"billing_project: proj\njobs:\n  - image: busybox\n    command: [echo, fine]\n"
                       f"  - image: {image}\n    command: [echo]\n")
        refused = await run_cli(env, "submit", str(bad))
        assert refused.returncode == EXIT_REFUSED, refused.stdout + refused.stderr
        [line] = refused.stderr.splitlines()
        assert line.startswith(f"error: {bad}:5:12: jobs[1]: image: ") and words in line, line
    assert await db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 0}
    assert await db.fetchone("SELECT COUNT(*) AS n FROM jobs") == {"n": 0}
    async with aio.Client(f"localhost:{storage_frontend.public_port}", alice_token, certs.ca_cert_path) as client:
        assert [b async for b in client.list_batches()] == []


async def test_a_token_reused_for_a_changed_file_is_refused_in_one_line(
        storage_frontend: FrontendApp, alice_token: str, auth_app: AuthApp, certs: DevCertificateAuthority,
        db: Database, tmp_path: Path) -> None:
    """Issue 36, item 4: `corral submit` of a file with an `idempotency_token` gives the same batch for the
    same file, and for a changed one refuses in one line (ALREADY_EXISTS, exit 4) naming the token and the
    batch; the client raises AlreadyExists, and its retries of one builder keep the same batch."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"frontend": f"localhost:{storage_frontend.public_port}",
                                  "auth": f"localhost:{auth_app.public_port}", "ca_cert": str(certs.ca_cert_path),
                                  "token": alice_token}))
    env = {**os.environ, "CORRAL_CONFIG": str(config)}
    batch_file = tmp_path / "nightly.yaml"
    batch_file.write_text("billing_project: proj\nidempotency_token: nightly-3\n"
                          "jobs:\n  - image: busybox\n    command: [echo, one]\n")
    first = await run_cli(env, "submit", str(batch_file), "--json")
    assert first.returncode == 0, first.stderr
    batch_id = int(json.loads(first.stdout)[0]["batchId"])
    again = await run_cli(env, "submit", str(batch_file), "--json")
    assert again.returncode == 0 and int(json.loads(again.stdout)[0]["batchId"]) == batch_id
    batch_file.write_text(batch_file.read_text().replace("one", "two"))
    changed = await run_cli(env, "submit", str(batch_file))
    assert (changed.returncode, changed.stderr) == (
        EXIT_REFUSED, f'error: idempotency token "nightly-3" was used for batch {batch_id} with a different '
                      "request; use a new token to submit a changed batch\n")

    async with aio.Client(f"localhost:{storage_frontend.public_port}", alice_token, certs.ca_cert_path) as client:
        builder = read_batch_file(batch_file)
        builder.idempotency_token = "client-1"
        made = await client.submit(builder)
        assert (await client.submit(builder)).batch_id == made.batch_id  # a retry of the same builder
        builder.job("busybox", ["echo", "three"])
        with pytest.raises(corral.AlreadyExists, match=f'"client-1" was used for batch {made.batch_id} '):
            await client.submit(builder)
    assert await db.fetchone("SELECT COUNT(*) AS n FROM batches") == {"n": 2}
