"""Issue 13, Images, on a real `corral up --worker-runtime oci` that allows a private registry asking for a
login (the htpasswd registry of tests/registry.py, plain HTTP on loopback: `--allowed-registries http://...`;
not corral's own registry, which workers pull with the deployment's login, whatever a job brings): a job
whose image_pull_secret holds the login (files username and password, or Docker's config.json as
.dockerconfigjson) runs in a container of the private image; a job without one, or with a secret that is
not a login, ends in Error saying why (in corral's words: not authorised; the secret's name), never Failed;
and afterwards the password, as written and in base64 (as an auth file holds it), is nowhere: not in any
table of the database, not in any file under the working directory of `corral up` (the blob store, the
services' and workers' logs, the workers' image cache and scratch), not in any answer or event of the
batch."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

import corral
from corral.batch.v1 import job_spec_pb2, job_state_pb2
from tests import registry as test_registry
from tests.e2e import cluster as up
from tests.e2e.cluster import Cluster
from tests.e2e.test_secrets import events, every_row, files_holding
from tests.oci.host import WHY_NOT

pytestmark = [pytest.mark.timeout(400), pytest.mark.usefixtures("host_ip_forwarding")]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.SeededRegistry]:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    yield from test_registry.running(tmp_path_factory.mktemp("registry"))


def job(image: str, **fields) -> job_spec_pb2.JobSpec:
    # One attempt, whatever the outcome (a login the registry refuses is not tried again anyway).
    return job_spec_pb2.JobSpec(image=image, script="echo ran in $(hostname)", max_attempts=1,
                                network_mode=job_spec_pb2.NETWORK_MODE_NONE, **fields)


def test_a_private_image_runs_with_its_pull_secret_and_the_password_is_nowhere_else(
        registry: test_registry.SeededRegistry, tmp_path: Path) -> None:
    work_dir = tmp_path / "up"
    work_dir.mkdir()
    cluster: Cluster = up.start(work_dir, "--worker-runtime", "oci", "--allowed-registries",
                                f"http://{registry.login_server.address}")
    private = registry.at("busybox", login=True)
    password = test_registry.PASSWORD
    needles = [password.encode(), base64.b64encode(f"{test_registry.USERNAME}:{password}".encode())]
    try:
        login = tmp_path / "login"
        login.mkdir()
        (login / "username").write_text(test_registry.USERNAME + "\n")
        (login / "password").write_text(password + "\n")  # as `echo` leaves it: the newline is not the password
        (tmp_path / "token").write_text(password)
        docker_config = tmp_path / "config.json"  # as `docker login` leaves it
        docker_config.write_text(json.dumps({"auths": {f"http://{registry.login_server.address}": {
            "auth": base64.b64encode(f"{test_registry.USERNAME}:{password}".encode()).decode()}}}))
        for name, files in (("registry", [str(login / "username"), str(login / "password")]),
                            ("not-a-login", [f"token={tmp_path / 'token'}"]),
                            ("docker-config", [f".dockerconfigjson={docker_config}"])):
            created = cluster.cli("secrets", "create", name, "--project", "default",
                                  *(arg for path in files for arg in ("--from-file", path)))
            assert created.returncode == 0, created.stderr

        builder = corral.BatchBuilder("default", attributes={"test": "private-images"})
        for spec in (job(private, image_pull_secret="registry"), job(private),
                     job(private, image_pull_secret="not-a-login"), job(private, image_pull_secret="docker-config")):
            builder.add_job(spec)
        with cluster.client() as client:
            batch = client.submit(builder)
            done = client.wait(batch.batch_id)
            jobs = [client.get_job(batch.batch_id, job_id) for job_id in (1, 2, 3, 4)]
            succeeded, error = job_state_pb2.JOB_STATE_SUCCEEDED, job_state_pb2.JOB_STATE_ERROR
            assert [j.state for j in jobs] == [succeeded, error, error, succeeded], [
                j.attempts[-1].error_message for j in jobs]
            assert (done.counts.n_succeeded, done.counts.n_failed) == (2, 0)
            for job_id in (1, 4):
                assert client.job_log(batch.batch_id, job_id).decode().startswith("ran in job-")
            anonymous, not_a_login = (j.attempts[-1].error_message for j in jobs[1:3])
            # corral's words (issue 33): the registry's own, and its address, are the worker's log's only.
            assert anonymous == f"image: could not get {private!r}: not authorised", anonymous
            assert not_a_login == ("image pull secret 'not-a-login' has no file 'username': it must hold the files "
                                   "'username' and 'password', or '.dockerconfigjson'")
            answers = [*jobs, client.get_batch(batch.batch_id), *client.jobs(batch.batch_id),
                       *client.secrets("default"), *events(client, done)]
            assert not any(needle in a.SerializeToString() for a in answers for needle in needles)
        shown = cluster.cli("job", str(batch.batch_id), "1")
        assert shown.returncode == 0 and f"of the image {private!r} (sha256:" in shown.stdout, \
            shown.stdout + shown.stderr

        # Another project's jobs, with the image now in the worker's cache: neither without a login nor with a
        # secret of that project's own that the registry refuses do they get it (acceptance 4 of issue 35).
        bob = cluster.user("bob")
        with cluster.client() as admin:
            admin.create_billing_project("lab-b", ["bob"])
        (login / "password").write_text("not-the-password\n")
        created = cluster.cli("secrets", "create", "registry", "--project", "lab-b", "--from-file",
                              str(login / "username"), "--from-file", str(login / "password"),
                              env={"CORRAL_TOKEN": bob})
        assert created.returncode == 0, created.stderr
        builder = corral.BatchBuilder("lab-b")
        builder.add_job(job(private))
        builder.add_job(job(private, image_pull_secret="registry"))
        with cluster.client(bob) as client:
            other = client.wait(client.submit(builder).batch_id)
            refused = [client.get_job(other.batch_id, job_id) for job_id in (1, 2)]
        assert [j.state for j in refused] == [job_state_pb2.JOB_STATE_ERROR] * 2, refused
        assert [j.attempts[-1].error_message for j in refused] == [
            f"image: could not get {private!r}: not authorised"] * 2
        assert not any(needle in every_row(cluster) for needle in needles)
    finally:
        cluster.stop()
    assert files_holding(work_dir, needles) == []
    assert files_holding(work_dir, [b"ran in job-"]) != []  # the search finds what is there: the job's log
