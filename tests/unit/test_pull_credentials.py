"""The registry login a job pulls its image with (services/worker/secret_files.py, `pull_credentials`):
read from the secret the driver delivered (RunJob.image_pull_secret), and each way it can be wrong is a
refusal that names the secret and the file, never what they hold."""

from __future__ import annotations

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from corral.driver.v1 import worker_session_pb2 as ws
from services.worker.image_tools import Credentials
from services.worker.secret_files import pull_credentials

PASSWORD = "s3cret: with spaces\tand a tab"


def pulling(name: str = "registry") -> js.JobSpec:
    return js.JobSpec(image="private/tool:1", script="true", image_pull_secret=name)


def delivered(name: str = "registry", error: str = "", **files: bytes) -> ws.SecretFiles:
    return ws.SecretFiles(name=name, files=files, error=error)


def test_no_pull_secret_means_no_credentials_whatever_came() -> None:
    assert pull_credentials(js.JobSpec(image="busybox"), None) == (None, [])
    assert pull_credentials(js.JobSpec(image="busybox"), delivered(username=b"a", password=b"b")) == (None, [])


@pytest.mark.parametrize("username, password", [(b"alice", PASSWORD.encode()), (b"alice\n", PASSWORD.encode() + b"\n"),
                                                (b"alice\r\n", PASSWORD.encode() + b"\r\n")])
def test_the_files_username_and_password_are_the_login(username: bytes, password: bytes) -> None:
    credentials, refusals = pull_credentials(pulling(), delivered(username=username, password=password, other=b"x"))
    assert (credentials, refusals) == (Credentials("alice", PASSWORD), [])
    assert PASSWORD not in repr(credentials)


@pytest.mark.parametrize("files, words", [
    ({"password": PASSWORD.encode()}, "image pull secret 'registry' has no file 'username': it must hold the files "
                                      "'username' and 'password'"),
    ({"username": b"alice"}, "image pull secret 'registry' has no file 'password'"),
    ({".dockerconfigjson": b'{"auths": {}}'}, "has no file 'username'"),
    ({"username": b"alice", "password": b"\xff" + PASSWORD.encode()}, "its file 'password' is not UTF-8 text"),
    ({"username": b"al:ice", "password": PASSWORD.encode()}, "its file 'username' must hold a user name without ':'"),
    ({"username": b"", "password": PASSWORD.encode()}, "its file 'username' must hold a user name"),
    ({"username": b"al\x00ice", "password": PASSWORD.encode()}, "its file 'username' must hold a user name"),
    ({"username": b"alice", "password": b"\n"}, "image pull secret 'registry': its file 'password' is empty"),
])
def test_a_secret_that_is_not_a_login_is_refused_naming_it_not_its_contents(files: dict[str, bytes],
                                                                            words: str) -> None:
    credentials, refusals = pull_credentials(pulling(), delivered(**files))
    assert credentials is None and len(refusals) == 1 and words in refusals[0], refusals
    assert PASSWORD not in refusals[0] and "alice" not in refusals[0]


def test_a_secret_the_driver_could_not_deliver_is_refused_with_its_words() -> None:
    assert pull_credentials(pulling(), None) == (None, ["image pull secret 'registry' was not delivered with the job"])
    assert pull_credentials(pulling(), delivered("other", username=b"a", password=b"b"))[1] == [
        "image pull secret 'registry' was not delivered with the job"]
    gone = "secret 'registry' of billing project 'proj' no longer exists: it was deleted after the job was submitted"
    assert pull_credentials(pulling(), delivered(error=gone)) == (None, [gone])
