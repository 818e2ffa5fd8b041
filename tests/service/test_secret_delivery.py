"""A job's secrets from submission to its files, through a real frontend,
driver and worker (issue 13, acceptance 6): the driver opens the secret for
the attempt it sends, the job reads it from a file (and prints only its
hash), and the value is in no log, spec or event; a secret deleted after
submission, or a driver without the key, ends the attempt in Error, refused,
saying why, without running it. The frontend alone: test_secrets.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.batch.v1 import job_service_pb2 as jpb
from corral.batch.v1 import job_spec_pb2
from corral.batch.v1 import secret_service_pb2 as spb
from services.auth.app import AuthApp
from services.common.sealing import Opener
from services.common.tls import DevCertificateAuthority
from services.db.database import Database, DatabaseConfig
from services.db.store import JobStore
from services.driver.app import DriverApp, DriverConfig
from services.driver.app import start as start_driver
from services.driver.secret_delivery import SecretDelivery
from services.driver.servicer import SessionSettings
from services.driver.store import DriverStore
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from services.worker.runtime import can_isolate
from tests.conftest import service_url
from tests.service.test_driver_app import eventually
from tests.service.test_jobs import Env, make_env, secrets_key_pair, start_frontend
from tests.world import FakeClock

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not can_isolate(), reason="the process runtime mounts secrets for isolated jobs "
                                                           "only (a worker running as root on Linux)")]

READ_SECRET = "sha256sum secrets/db/password | cut -d' ' -f1"


class Deployment:
    """A frontend, a driver with the key, and a worker started on demand, on the test's database."""

    def __init__(self, env: Env, driver: DriverApp, start_worker_now) -> None:
        self.env = env
        self.driver = driver
        self.start_worker = start_worker_now

    async def create_secret(self, value: bytes) -> None:
        assert self.env.secrets is not None
        await self.env.secrets.CreateSecret(spb.CreateSecretRequest(
            billing_project="proj", name="db", files={"password": value}, replace=True),
            metadata=self.env.as_("alice"))

    async def outcome(self, batch_id: int) -> tuple[str, str, bytes]:
        """The job's final state, its error message, and its log."""
        env = self.env

        async def final() -> str | None:
            state = await env.world.state(batch_id, 1)
            return state if state in ("Success", "Failed", "Error", "Cancelled") else None

        deadline = asyncio.get_running_loop().time() + 60
        while (state := await final()) is None:
            assert asyncio.get_running_loop().time() < deadline, "the job did not end"
            await asyncio.sleep(0.05)
        attempts = await env.jobs.GetJobAttempts(jpb.GetJobAttemptsRequest(batch_id=batch_id, job_id=1),
                                                 metadata=env.as_("alice"))
        error = attempts.attempts[-1].error_message if attempts.attempts else ""
        log = b""
        if state == "Success":
            log = (await env.jobs.GetJobLog(jpb.GetJobLogRequest(batch_id=batch_id, job_id=1),
                                            metadata=env.as_("alice"))).data
        return state, error, log


@pytest.fixture
async def deployment(auth_app: AuthApp, db_config: DatabaseConfig, db: Database, clock: FakeClock,
                     certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[Deployment]:
    await db.execute("UPDATE instance_collections SET max_instances = 0")  # no worker processes: ours only
    blobs = tmp_path / "blobs"
    private, public = secrets_key_pair(tmp_path)
    driver = await start_driver(DriverConfig(
        service_url(db_config, "driver"), certs.directory, f"file://{blobs}", tmp_path / "driver",
        session=SessionSettings(heartbeat_interval_s=0.2, heartbeat_timeout_s=10.0, idle_timeout_s=30.0),
        secrets_key_file=private))
    address = f"localhost:{driver.port}"
    frontend = await start_frontend(auth_app, db_config, certs, blobs, driver_addresses=(address,),
                                    secrets_public_key_file=public)
    workers = []

    async def start_worker_now() -> None:
        await eventually(lambda: driver.election.is_leader)
        assert driver.election.state.epoch is not None
        await JobStore(db).create_instance(driver.election.state.epoch, "w-secret", "standard", 2000, "activate")
        certs.issue("worker-w-secret")
        workers.append(await start_worker(WorkerConfig(
            "w-secret", "activate", 2000, (address,), certs.directory, tmp_path / "scratch", f"file://{blobs}",
            heartbeat_interval_s=0.2)))

    try:
        async for env in make_env(frontend, auth_app, db, clock, certs, blobs, elect=False, secrets_key=private):
            yield Deployment(env, driver, start_worker_now)
    finally:
        for worker in workers:
            await worker.stop()
        await frontend.stop()
        await driver.stop()


def mounting(script: str) -> job_spec_pb2.JobSpec:
    return job_spec_pb2.JobSpec(image="busybox", script=script,
                                secrets=[job_spec_pb2.SecretMount(name="db", mount_path="/secrets/db")])


def everything_in(directory: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file() and not p.is_symlink())


async def test_a_job_reads_its_secret_and_the_value_goes_nowhere_else(deployment: Deployment,
                                                                      tmp_path: Path) -> None:
    value = secrets.token_urlsafe(32).encode()
    await deployment.create_secret(value)
    await deployment.start_worker()
    env = deployment.env
    batch_id = await env.submit(mounting(READ_SECRET))
    state, error, log = await deployment.outcome(batch_id)
    assert (state, error) == ("Success", "")
    assert log.strip() == hashlib.sha256(value).hexdigest().encode()
    # Not in the stored spec, the logs (stored and the worker's), the worker's scratch, nor any event.
    assert value not in everything_in(tmp_path)
    for table in ("batch_events", "attempts", "jobs"):
        rows = await env.world.db.fetchall(f"SELECT * FROM {table}")
        assert value.decode() not in repr(rows), table


async def test_a_secret_deleted_after_submission_ends_the_job_refused(deployment: Deployment) -> None:
    env = deployment.env
    await deployment.create_secret(b"hunter2")
    batch_id = await env.submit(mounting(READ_SECRET))
    assert env.secrets is not None
    await env.secrets.DeleteSecret(spb.DeleteSecretRequest(billing_project="proj", name="db"),
                                   metadata=env.as_("alice"))
    await deployment.start_worker()
    state, error, _ = await deployment.outcome(batch_id)
    assert state == "Error"
    assert "secret 'db' of billing project 'proj' no longer exists" in error
    end = await env.world.db.fetchone("SELECT reason FROM attempts WHERE batch_id = %s", (batch_id,))
    assert end == {"reason": "refused"}


async def test_the_driver_delivers_only_what_it_can_open(db: Database, tmp_path: Path,
                                                         deployment: Deployment) -> None:
    """SecretDelivery alone: a driver without the key, with another key, or asked for another project's
    secret sends the error, never the files."""
    await deployment.create_secret(b"hunter2")
    job = mounting("true")
    job.secrets.add(name="elsewhere/db", mount_path="/other")
    assert deployment.env.secrets_key is not None
    opener = Opener.from_file(deployment.env.secrets_key)
    [delivered] = await SecretDelivery(DriverStore(db), opener).files([("proj", job)])
    db_secret, foreign = delivered.mounts
    assert dict(db_secret.files) == {"password": b"hunter2"} and not db_secret.error
    assert not foreign.files and "not of the job's billing project 'proj'" in foreign.error
    [delivered] = await SecretDelivery(DriverStore(db), None).files([("proj", job)])
    keyless, _ = delivered.mounts
    assert not keyless.files and "--secrets-key-file" in keyless.error
    (tmp_path / "other").mkdir()
    other, _ = secrets_key_pair(tmp_path / "other")
    [delivered] = await SecretDelivery(DriverStore(db), Opener.from_file(other)).files([("proj", job)])
    wrong, _ = delivered.mounts
    assert not wrong.files and "sealed with key" in wrong.error
    assert os.stat(deployment.env.secrets_key).st_mode & 0o077 == 0
    # More than a job may mount together (a RunJob must fit the session's 4 MiB messages): errors only.
    [delivered] = await SecretDelivery(DriverStore(db), opener, max_bytes_per_job=6).files([("proj", mounting_twice())])
    big, small = delivered.mounts
    assert not big.files and not small.files
    assert big.error == small.error == "the job's secrets hold 14 bytes together, more than the 6 one job may mount"
    # The secret a job pulls its image with comes in the same query, apart from its mounts, and counts too.
    pulling = job_spec_pb2.JobSpec(image="private/tool", script="true", image_pull_secret="db")
    [delivered, none] = await SecretDelivery(DriverStore(db), opener).files([("proj", pulling), ("proj", mounting("true"))])
    assert delivered.mounts == [] and delivered.image_pull is not None and not delivered.image_pull.error
    assert (delivered.image_pull.name, dict(delivered.image_pull.files)) == ("db", {"password": b"hunter2"})
    assert none.image_pull is None
    pulling.image_pull_secret = "elsewhere/db"
    [foreign_pull] = await SecretDelivery(DriverStore(db), opener).files([("proj", pulling)])
    assert foreign_pull.image_pull is not None and not foreign_pull.image_pull.files
    assert "not of the job's billing project 'proj'" in foreign_pull.image_pull.error
    pulling.MergeFrom(mounting("true"))
    pulling.image_pull_secret = "db"
    [both] = await SecretDelivery(DriverStore(db), opener, max_bytes_per_job=10).files([("proj", pulling)])
    assert both.image_pull is not None and not both.image_pull.files and not both.mounts[0].files
    assert both.image_pull.error == "the job's secrets hold 14 bytes together, more than the 10 one job may mount"


def mounting_twice() -> job_spec_pb2.JobSpec:
    job = mounting("true")
    job.secrets.add(name="proj/db", mount_path="/again")
    return job
