"""The registry login a job pulls its image with (services/worker/pull_secrets.py, `pull_credentials`):
read from the secret the driver delivered (RunJob.image_pull_secret), its files `username` and `password` or
Docker's config.json as `.dockerconfigjson` (the entry of the image's registry), and each way it can be
wrong is a refusal that names the secret and the file, never what they hold."""

from __future__ import annotations

import base64
import json

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from corral.driver.v1 import worker_session_pb2 as ws
from services.worker.image_tools import Credentials
from services.worker.pull_secrets import pull_credentials

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
                                      "'username' and 'password', or '.dockerconfigjson'"),
    ({"username": b"alice"}, "image pull secret 'registry' has no file 'password'"),
    ({"token": b"x"}, "has no file 'username'"),
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


def docker_config(auths: object) -> bytes:
    return json.dumps({"auths": auths}).encode()


def basic(username: str, password: str) -> str:
    return base64.b64encode(f"{username}:{password}".encode()).decode()


@pytest.mark.parametrize("image, key", [
    ("registry.example.com/lab/tool:1", "registry.example.com"),
    ("registry.example.com/lab/tool:1", "https://registry.example.com/v2/"),
    ("127.0.0.1:5000/tool:1", "http://127.0.0.1:5000"),
    ("127.0.0.1:5000/tool:1", "127.0.0.1:5000"),
    ("ubuntu:24.04", "https://index.docker.io/v1/"),  # a bare name is Docker Hub's
    ("lab/tool:1", "docker.io"),
    ("docker.io/library/ubuntu", "docker.io"),
])
def test_a_docker_config_gives_the_login_of_the_images_registry(image: str, key: str) -> None:
    spec = js.JobSpec(image=image, script="true", image_pull_secret="registry")
    config = docker_config({"other.example.com": {"auth": basic("bob", "not this one")},
                            key: {"auth": basic("alice", PASSWORD)}})
    assert pull_credentials(spec, delivered(**{".dockerconfigjson": config})) == (
        Credentials("alice", PASSWORD), [])
    plain = docker_config({key: {"username": "alice", "password": PASSWORD}})
    assert pull_credentials(spec, delivered(**{".dockerconfigjson": plain})) == (
        Credentials("alice", PASSWORD), [])


def test_username_and_password_files_win_over_a_docker_config() -> None:
    config = docker_config({"registry.example.com": {"auth": basic("bob", "not this one")}})
    both = delivered(**{".dockerconfigjson": config, "username": b"alice", "password": PASSWORD.encode()})
    assert pull_credentials(js.JobSpec(image="registry.example.com/x", image_pull_secret="registry"), both) == (
        Credentials("alice", PASSWORD), [])


@pytest.mark.parametrize("config, words", [
    (b"{not json", "its file '.dockerconfigjson' is not JSON"),
    (b'{"credsStore": "desktop"}', "has no \"auths\" object (credential helpers are not used)"),
    (docker_config({"elsewhere.example.com": {"auth": basic("alice", PASSWORD)}}),
     "has no login for the image's registry 'registry.example.com' in \"auths\""),
    (docker_config({"registry.example.com": {"auth": "%%%"}}), "an \"auth\" that is not base64 of USER:PASSWORD"),
    (docker_config({"registry.example.com": {"auth": base64.b64encode(b"no-colon-in-it").decode()}}),
     "an \"auth\" that is not base64 of USER:PASSWORD"),
    (docker_config({"registry.example.com": {"auth": basic("alice", "")}}), "has an empty password"),
    (docker_config({"registry.example.com": {"identitytoken": PASSWORD}}),
     "has neither \"auth\" nor \"username\" and \"password\" (identity tokens are not used)"),
])
def test_a_docker_config_without_a_usable_login_is_refused_naming_the_file(config: bytes, words: str) -> None:
    spec = js.JobSpec(image="registry.example.com/lab/tool:1", script="true", image_pull_secret="registry")
    credentials, refusals = pull_credentials(spec, delivered(**{".dockerconfigjson": config}))
    assert credentials is None and len(refusals) == 1 and words in refusals[0], refusals
    assert refusals[0].startswith("image pull secret 'registry': its file '.dockerconfigjson'")
    assert PASSWORD not in refusals[0] and "alice" not in refusals[0]


def test_a_docker_config_for_an_image_that_is_not_one_is_refused() -> None:
    spec = js.JobSpec(image="Tool:1", script="true", image_pull_secret="registry")
    config = docker_config({"registry.example.com": {"auth": basic("alice", PASSWORD)}})
    _, [refusal] = pull_credentials(spec, delivered(**{".dockerconfigjson": config}))
    assert "cannot be matched to the image's registry" in refusal and "repositories are lowercase" in refusal


@pytest.mark.parametrize("image", ["localhost/proj/tool:1", "127.0.0.1:5000/proj/tool:1"])
def test_a_secret_is_not_used_for_corrals_own_registry(image: str) -> None:
    """corral's own registry is pulled with the deployment's login alone: a job's secret, whatever it holds, is
    neither used nor a reason to refuse the job there."""
    spec = js.JobSpec(image=image, script="true", image_pull_secret="registry")
    config = docker_config({"registry.example.com": {"auth": basic("alice", PASSWORD)}})
    assert pull_credentials(spec, delivered(**{".dockerconfigjson": config}), "http://127.0.0.1:5000") == (None, [])
    assert pull_credentials(spec, delivered(username=b"alice", password=b"x"), "http://127.0.0.1:5000") == (None, [])
    assert pull_credentials(js.JobSpec(image="127.0.0.1:5001/x", image_pull_secret="registry"),
                            delivered(username=b"alice", password=b"x"), "http://127.0.0.1:5000")[0] is not None


def test_a_bare_name_is_docker_hubs_not_another_registrys() -> None:
    spec = js.JobSpec(image="tool:1", script="true", image_pull_secret="registry")
    config = docker_config({"registry.example.com": {"auth": basic("alice", PASSWORD)}})
    _, [refusal] = pull_credentials(spec, delivered(**{".dockerconfigjson": config}))
    assert "has no login for the image's registry 'docker.io'" in refusal
