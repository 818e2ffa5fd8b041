"""The registry login a job pulls its image with: read from the secret its spec names
(JobSpec.image_pull_secret), which the driver delivers with the RunJob (RunJob.image_pull_secret).

The secret is in one of two forms:

- the files `username` and `password` (UTF-8 text; one trailing newline, as `echo` leaves, is not part
  of either), the form `corral secrets create NAME --from-file username --from-file password` makes;
- one file `.dockerconfigjson` (Kubernetes' name for it): Docker's `config.json`, whose `auths` maps
  registries (`registry.example.com`, `https://index.docker.io/v1/`, ...) to logins, each `auth`
  (base64 of `USER:PASSWORD`) or `username` and `password`. The entry of the image's registry is used;
  credential helpers (`credsStore`, `credHelpers`) and identity tokens are not.

Given both, the files `username` and `password` win. Nothing is written: the login goes to the image
cache in memory, which writes it for skopeo into an auth file of its own (services.worker.images).
Every refusal names the secret and the file, never what they hold. Pure functions.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from corral.batch.v1 import job_spec_pb2
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.image_refs import InvalidImageReference, Registry, names_own_registry, parse_reference
from services.worker.image_tools import Credentials

DOCKER_CONFIG = ".dockerconfigjson"
"""The file of a secret holding Docker's config.json."""


class _NotALogin(Exception):
    """Why a secret is not a login (naming it and its file, never what they hold)."""


def pull_credentials(spec: job_spec_pb2.JobSpec, delivered: ws.SecretFiles | None,
                     own_registry: str | None = None) -> tuple[Credentials | None, list[str]]:
    """The login `spec` pulls its image with, from the secret the driver delivered for it (None if none
    came), and why the attempt cannot run with it: a secret not delivered, or in neither form (see the module
    docstring). The image's registry (a bare name's is docker.io) says which entry of a `.dockerconfigjson`
    applies. (None, []) when the spec names no such secret, or when its image is of corral's own registry
    (`localhost/...`, or `own_registry`'s address), which is pulled with the deployment's login alone."""
    name = spec.image_pull_secret
    if not name or _of_own_registry(spec.image, own_registry):
        return None, []
    what = f"image pull secret {name!r}"
    if delivered is None or delivered.name != name:
        return None, [f"{what} was not delivered with the job"]
    if delivered.error:
        return None, [delivered.error]
    files = delivered.files
    try:
        if "username" in files or "password" in files or DOCKER_CONFIG not in files:
            return _plain_login(what, files), []
        return _docker_config_login(what, files[DOCKER_CONFIG], spec.image), []
    except _NotALogin as e:
        return None, [str(e)]


def _of_own_registry(image: str, own_registry: str | None) -> bool:
    try:
        return names_own_registry(parse_reference(image), Registry.parse(own_registry) if own_registry else None)
    except InvalidImageReference:
        return False


def _plain_login(what: str, files: Any) -> Credentials:
    text = {}
    for key in ("username", "password"):
        if key not in files:
            raise _NotALogin(f"{what} has no file {key!r}: it must hold the files 'username' and 'password', "
                             f"or {DOCKER_CONFIG!r}")
        try:
            text[key] = files[key].decode().removesuffix("\n").removesuffix("\r")
        except UnicodeDecodeError:
            raise _NotALogin(f"{what}: its file {key!r} is not UTF-8 text") from None
    return _checked(text["username"], text["password"],
                    f"{what}: its file 'username' must hold a user name without ':' or control characters",
                    f"{what}: its file 'password' is empty")


def _docker_config_login(what: str, content: bytes, image: str) -> Credentials:
    where = f"{what}: its file {DOCKER_CONFIG!r}"
    try:
        document = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        raise _NotALogin(f"{where} is not JSON") from None
    auths = document.get("auths") if isinstance(document, dict) else None
    if not isinstance(auths, dict):
        raise _NotALogin(f"{where} has no \"auths\" object (credential helpers are not used)")
    try:
        host = parse_reference(image).registry
    except InvalidImageReference as e:
        raise _NotALogin(f"{where} cannot be matched to the image's registry: {e}") from None
    entry = next((login for key, login in auths.items() if _auths_host(key) == host), None)
    if not isinstance(entry, dict):
        raise _NotALogin(f"{where} has no login for the image's registry {host!r} in \"auths\"")
    at = f"{where}: the login for {host!r}"
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            username, colon, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise _NotALogin(f"{at} has an \"auth\" that is not base64 of USER:PASSWORD") from None
        if not colon:
            raise _NotALogin(f"{at} has an \"auth\" that is not base64 of USER:PASSWORD")
        return _checked(username, password, f"{at} needs a user name without ':' or control characters",
                        f"{at} has an empty password")
    if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
        return _checked(entry["username"], entry["password"],
                        f"{at} needs a user name without ':' or control characters", f"{at} has an empty password")
    raise _NotALogin(f"{at} has neither \"auth\" nor \"username\" and \"password\" (identity tokens are not used)")


def _checked(username: str, password: str, bad_username: str, no_password: str) -> Credentials:
    """A login a registry's basic authentication can carry: a user name without ':' (it would end there)
    or control characters, and a password; else the words given for what is wrong."""
    if not username or ":" in username or not username.isprintable():
        raise _NotALogin(bad_username)
    if not password:
        raise _NotALogin(no_password)
    return Credentials(username, password)


def _auths_host(key: str) -> str | None:
    """The registry an `auths` key names (`https://index.docker.io/v1/` is docker.io), as references name
    it; None if it names none."""
    text = key.strip()
    for scheme in ("http://", "https://"):
        if text.startswith(scheme):
            text = text[len(scheme):]
    try:
        return Registry.parse(text.split("/", 1)[0]).host
    except InvalidImageReference:
        return None
