"""corral's own registry as the frontend reaches it: the registry's HTTP API (distribution's `/v2/`), with
the push login, for `corral images ls` and `rm` (imports go through skopeo: services.frontend.image_import).

The one narrow method is `_request`: every call is one HTTP request over `http.client`, run in a thread,
with the login as a Basic authorization header (never in a URL or a log line). The registry is on loopback
or the deployment's private network, so a call has a short timeout, and a registry that does not answer is
UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import http.client
import json
import urllib.parse

from services.common.errors import FailedPrecondition, Unavailable
from services.common.image_refs import Registry
from services.common.registry_logins import Credentials

MANIFEST_TYPES = (
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
"""The manifests corral's registry holds: skopeo writes one of these for every image it imports."""
CATALOG_PAGE = 1000
"""Repositories asked for per catalog request."""
MAX_REPOSITORIES = 100_000
"""Most repositories one listing reads from the catalog (a registry with more is not corral's own)."""
TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a tag names now."""

    digest: str
    """`sha256:...` of the manifest as stored."""
    size_bytes: int
    """Its layers' and configuration's sizes, as the manifest gives them."""
    layers: int
    media_type: str
    body: bytes = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    body: bytes


class OwnRegistry:
    """The registry at `url` (`http://host:port` or `https://host[:port]`), asked with `login`."""

    def __init__(self, url: str, login: Credentials, timeout_s: float = TIMEOUT_S):
        self.registry = Registry.parse(url)
        self.login = login
        self.timeout_s = timeout_s

    @property
    def address(self) -> str:
        """host[:port], as skopeo names it."""
        return self.registry.host

    def _request_now(self, method: str, path: str, headers: dict[str, str], body: bytes | None) -> Response:
        connection_class = http.client.HTTPConnection if self.registry.plain_http else http.client.HTTPSConnection
        connection = connection_class(self.registry.host, timeout=self.timeout_s)
        token = base64.b64encode(f"{self.login.username}:{self.login.password}".encode()).decode()
        try:
            connection.request(method, path, body=body, headers={**headers, "Authorization": f"Basic {token}"})
            response = connection.getresponse()
            data = response.read()
            return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, data)
        except OSError as e:
            raise Unavailable(f"corral's registry does not answer ({type(e).__name__}); try again later") from None
        finally:
            connection.close()

    async def _request(self, method: str, path: str, headers: dict[str, str] | None = None,
                       body: bytes | None = None) -> Response:
        response = await asyncio.to_thread(self._request_now, method, path, headers or {}, body)
        if response.status == 401:
            # The frontend's push login is the deployment's to fix, not the user's.
            raise FailedPrecondition("corral's registry refused this frontend's push login "
                                     "(operator setting --own-registry-push-login-file)")
        return response

    async def repositories(self, prefix: str) -> list[str]:
        """Every repository whose name starts with `prefix`, sorted (the catalog is sorted; it is read from
        `prefix` on, page by page, until a name past it)."""
        found: list[str] = []
        last = prefix.rstrip("/")
        seen = 0
        while seen < MAX_REPOSITORIES:
            query = urllib.parse.urlencode({"n": CATALOG_PAGE, "last": last} if last else {"n": CATALOG_PAGE})
            response = await self._request("GET", f"/v2/_catalog?{query}")
            if response.status != 200:
                raise Unavailable(f"corral's registry could not list its repositories (HTTP {response.status})")
            names = json.loads(response.body).get("repositories") or []
            seen += len(names)
            for name in names:
                if name.startswith(prefix):
                    found.append(name)
                elif name > prefix:
                    return found
            if len(names) < CATALOG_PAGE or "link" not in response.headers:
                return found
            last = names[-1]
        return found

    async def tags(self, repository: str) -> list[str]:
        """The repository's tags, sorted; none if it has none (or no longer exists)."""
        response = await self._request("GET", f"/v2/{repository}/tags/list")
        if response.status == 404:
            return []
        if response.status != 200:
            raise Unavailable(f"corral's registry could not list the tags of {repository} (HTTP {response.status})")
        return sorted(json.loads(response.body).get("tags") or [])

    async def manifest(self, repository: str, reference: str) -> Manifest | None:
        """What `repository:reference` (a tag or digest) names; None if nothing."""
        response = await self._request("GET", f"/v2/{repository}/manifests/{reference}",
                                       {"Accept": ", ".join(MANIFEST_TYPES)})
        if response.status == 404:
            return None
        if response.status != 200:
            raise Unavailable(f"corral's registry could not read {repository}:{reference} (HTTP {response.status})")
        document = json.loads(response.body)
        layers = document.get("layers") or []
        size = sum(int(part.get("size", 0)) for part in [*layers, document.get("config") or {}])
        digest = response.headers.get("docker-content-digest") or f"sha256:{hashlib.sha256(response.body).hexdigest()}"
        media_type = response.headers.get("content-type") or document.get("mediaType") or MANIFEST_TYPES[0]
        return Manifest(digest, size, len(layers), media_type, response.body)

    async def delete_tag(self, repository: str, tag: str) -> bool:
        """Remove `repository:tag`; False if there is no such tag. The registry deletes manifests, not tags
        (distribution 2.8): the manifest goes, with every tag that names it, and the repository's other
        tags that named it are put back (their blobs stay until the registry's garbage collection)."""
        manifest = await self.manifest(repository, tag)
        if manifest is None:
            return False
        others = []
        for other in await self.tags(repository):
            if other != tag:
                found = await self.manifest(repository, other)
                if found is not None and found.digest == manifest.digest:
                    others.append(other)
        response = await self._request("DELETE", f"/v2/{repository}/manifests/{manifest.digest}")
        if response.status == 404:
            return False
        if response.status not in (200, 202):
            raise Unavailable(f"corral's registry could not delete {repository}:{tag} (HTTP {response.status})")
        for other in others:
            put = await self._request("PUT", f"/v2/{repository}/manifests/{other}",
                                      {"Content-Type": manifest.media_type}, manifest.body)
            if put.status not in (200, 201):
                raise Unavailable(f"corral's registry deleted {repository}:{tag} but could not keep its tag "
                                  f"{other} (HTTP {put.status})")
        return True
