"""What a cloud machine's worker reads from its cloud's metadata server: its boot data, and its own name.

The metadata server answers on the machine itself, over plain HTTP at a link-local address, and only to
requests carrying the cloud's header (which a redirected or forged request from a web page cannot set):

- GCP: `{root}/instance/attributes/corral-worker` with `Metadata-Flavor: Google`, the provider's
  instance metadata item (https://cloud.google.com/compute/docs/metadata/querying-metadata);
- Azure: `{root}/instance/compute/userData?api-version=2021-01-01&format=text` with `Metadata: true`,
  base64 of the VM's userData (https://learn.microsoft.com/azure/virtual-machines/instance-metadata-service).

`{root}` is the cloud's metadata root, or `CORRAL_CLOUD_METADATA_URL` when set (the tests' loopback clouds).
Every read is bounded in size and time; a machine that just booted may find its metadata server not yet
answering, so the boot data is asked for again, with back-off, for a while.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import time

import httpx

from services.driver.providers.worker_metadata import MAX_BYTES, METADATA_KEY, METADATA_URL_ENV, WorkerBootstrap

log = logging.getLogger(__name__)

CLOUDS = ("gcp", "azure")
DEFAULT_ROOTS = {"gcp": "http://metadata.google.internal/computeMetadata/v1",
                 "azure": "http://169.254.169.254/metadata"}
"""Each cloud's metadata root on its machines."""
HEADERS = {"gcp": {"Metadata-Flavor": "Google"}, "azure": {"Metadata": "true"}}
"""The header each cloud's metadata server requires on every request."""
MAX_RESPONSE_BYTES = 2 * MAX_BYTES
"""Largest metadata answer read (base64 of the largest boot data, with room to spare)."""


class MetadataError(Exception):
    """The metadata server did not give what was asked for, or gave something unusable."""


class UnusableBootstrap(MetadataError):
    """Boot data that is there but cannot be used: asking again will not help."""


def metadata_root(cloud: str) -> str:
    """Where `cloud`'s metadata server is: CORRAL_CLOUD_METADATA_URL if set, else the cloud's own."""
    if cloud not in CLOUDS:
        raise ValueError(f"unknown cloud {cloud!r}: one of {', '.join(CLOUDS)}")
    return os.environ.get(METADATA_URL_ENV, DEFAULT_ROOTS[cloud]).rstrip("/")


async def read_text(client: httpx.AsyncClient, cloud: str, url: str, timeout_s: float = 10.0,
                    params: dict[str, str] | None = None) -> str:
    """GET `url` from the metadata server with `cloud`'s header: its body as text, at most
    MAX_RESPONSE_BYTES; MetadataError on any status but 200."""
    async with client.stream("GET", url, params=params, headers=HEADERS[cloud], timeout=timeout_s) as response:
        if response.status_code != 200:
            raise MetadataError(f"{url}: HTTP {response.status_code}")
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_RESPONSE_BYTES:
                raise MetadataError(f"{url}: more than {MAX_RESPONSE_BYTES} bytes")
    try:
        return body.decode()
    except UnicodeDecodeError as e:
        raise MetadataError(f"{url}: not UTF-8 text: {e}") from None


async def read_bootstrap_once(client: httpx.AsyncClient, cloud: str, root: str) -> WorkerBootstrap:
    """The boot data the provider put on this machine (services.driver.providers.worker_metadata)."""
    if cloud == "gcp":
        text = await read_text(client, cloud, f"{root}/instance/attributes/{METADATA_KEY}")
    else:
        encoded = await read_text(client, cloud, f"{root}/instance/compute/userData",
                                  params={"api-version": "2021-01-01", "format": "text"})
        try:
            text = base64.b64decode(encoded.strip(), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as e:
            raise UnusableBootstrap(f"the VM's userData is not base64 of UTF-8 text: {e}") from None
    try:
        return WorkerBootstrap.from_json(text)
    except ValueError as e:  # json's errors are ValueErrors too
        raise UnusableBootstrap(f"the worker's boot data is unusable: {e}") from None


async def read_bootstrap(cloud: str, root: str | None = None, patience_s: float = 120.0) -> WorkerBootstrap:
    """The boot data, asked for again (with back-off, for up to `patience_s`) while the metadata server does
    not answer or has none yet: a machine's metadata may not be ready the moment it boots. Boot data that is
    there but unusable is not asked for again."""
    root = root or metadata_root(cloud)
    deadline = time.monotonic() + patience_s
    delay_s = 0.2
    async with httpx.AsyncClient(trust_env=False) as client:  # never through a proxy: it is the local machine
        while True:
            try:
                return await read_bootstrap_once(client, cloud, root)
            except (httpx.HTTPError, MetadataError) as e:
                if isinstance(e, UnusableBootstrap):
                    raise
                if time.monotonic() + delay_s > deadline:
                    raise MetadataError(f"no boot data from the {cloud} metadata server at {root}: {e}") from e
                log.warning("no boot data yet from %s (%s); asking again in %.1f s", root, e, delay_s)
                await asyncio.sleep(delay_s)
                delay_s = min(5.0, delay_s * 2)
