"""The file systems behind jobs' storage URLs, opened with the deployment's
settings (`StorageAccess`, services/common/storage_access.py): `file://` is
the worker's disk, `gs://` (and `gcs://`) Google Cloud Storage through
gcsfs, `az://` (and `abfs://`, `abfss://`) Azure Blob Storage through adlfs.
Each is opened on first use, once per worker, and shared by its copies; the
secrets are read when the worker starts, so a bad file stops it at once.

Nothing hangs: every connection has a connect and a read (stall) timeout,
and job_files bounds each whole transfer, retries included, by
`StorageAccess.copy_timeout_s`. Listings are not cached: a file another job
wrote a moment ago is seen.

GCS: gcsfs's default class (`ExtendedGcsFileSystem`, chosen by the
environment variable GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT, on unless set to
false) first asks the Storage Control API over gRPC what kind of bucket it
is about to read or write (zonal, hierarchical), retrying for up to 60 s
where nothing answers gRPC, as with an emulator or a JSON-only endpoint.
corral opens gcsfs's plain JSON-API class, `gcsfs.core.GCSFileSystem` (what
that variable set to false selects), whatever the environment says: reading
and writing whole objects is all a job's files need. Zonal (Rapid) buckets,
which gcsfs handles only on the gRPC path, are therefore not supported.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable

import fsspec
from fsspec.asyn import sync
from fsspec.implementations.local import LocalFileSystem

from services.common.storage_access import StorageAccess, read_secret

LOCAL_SCHEMES = frozenset({"file"})
GCS_SCHEMES = frozenset({"gs", "gcs"})
AZURE_SCHEMES = frozenset({"az", "abfs", "abfss"})
SCHEMES = LOCAL_SCHEMES | GCS_SCHEMES | AZURE_SCHEMES
"""The URL schemes a worker copies job files from and to."""
_CLOSE_S = 5.0
"""How long closing one file system's connections may take."""

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Location:
    """Where one storage URL points: its file system and the path in it."""

    url: str
    fs: fsspec.AbstractFileSystem
    path: str
    """`bucket/key` in an object store, `/absolute/path` on the local disk."""

    @property
    def local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)


class ObjectStores:
    """Opens the file system of each storage URL with the deployment's endpoints and credentials."""

    def __init__(self, access: StorageAccess = StorageAccess()):
        """Read the secrets `access` names now; ValueError saying which and why if one cannot be used."""
        if problems := access.problems():
            raise ValueError("object storage settings: " + "; ".join(problems))
        self.access = access
        self._azure = _azure_options(access)  # reads its secret (gcsfs reads its key file itself)
        self._opened: dict[str, tuple[fsspec.AbstractFileSystem, Callable[[], None]]] = {}
        self._lock = threading.Lock()  # copies run in threads

    @property
    def timeout_s(self) -> float:
        """Most time one object's transfer may take, retries included."""
        return self.access.copy_timeout_s

    def locate(self, url: str) -> Location:
        """The file system and path of `url`; ValueError for a scheme a worker does not copy."""
        scheme, sep, _ = url.partition("://")
        if not sep or scheme not in SCHEMES:
            raise ValueError(f"{url!r} is not a URL this worker copies ({describe_schemes()})")
        fs = self._open(scheme)
        return Location(url, fs, fs._strip_protocol(url))

    def _open(self, scheme: str) -> fsspec.AbstractFileSystem:
        kind = "file" if scheme in LOCAL_SCHEMES else "gs" if scheme in GCS_SCHEMES else "az"
        with self._lock:
            if kind not in self._opened:
                self._opened[kind] = self._connect(kind)
            return self._opened[kind][0]

    def _connect(self, kind: str) -> tuple[fsspec.AbstractFileSystem, Callable[[], None]]:
        if kind == "file":
            return LocalFileSystem(), lambda: None
        if kind == "gs":
            return _open_gcs(self.access)
        return _open_azure(self._azure)

    def close(self) -> None:
        """Close the connections of every file system opened (the worker is stopping; from any thread but
        fsspec's own, whose loop does the closing)."""
        with self._lock:
            opened, self._opened = self._opened, {}
        for kind, (_, close) in opened.items():
            try:
                close()
            except Exception as e:  # noqa: BLE001 - the worker is going away: say so, close the others
                log.warning("could not close the %s:// file system: %s", kind, e)


def _open_gcs(access: StorageAccess) -> tuple[fsspec.AbstractFileSystem, Callable[[], None]]:
    import gcsfs.core  # imported when first needed: it takes half a second

    gcs = gcsfs.core.GCSFileSystem(**_gcs_options(access))

    def close() -> None:
        if gcs._session is not None:  # made on the first request
            sync(gcs.loop, gcs._session.close, timeout=_CLOSE_S)

    return gcs, close


def _open_azure(options: dict[str, object]) -> tuple[fsspec.AbstractFileSystem, Callable[[], None]]:
    import adlfs.spec

    try:
        azure = adlfs.spec.AzureBlobFileSystem(**options)
    except ValueError as e:  # adlfs says "unable to connect to account for ..."
        raise ValueError(f"Azure Blob Storage is not configured for this worker ({e}); the operator sets "
                         "--azure-blob-connection-string-file or --azure-account") from None
    return azure, lambda: sync(azure.loop, adlfs.spec.close_service_client, azure, timeout=_CLOSE_S)


def describe_schemes() -> str:
    """The schemes a worker copies, in words."""
    return ", ".join(f"{s}://" for s in sorted(SCHEMES))


def _gcs_options(access: StorageAccess) -> dict[str, object]:
    import aiohttp  # gcsfs's HTTP client, imported with it

    options: dict[str, object] = {
        # Per request (gcsfs's own default is no timeout at all): a connection, then a stall.
        "requests_timeout": aiohttp.ClientTimeout(total=None, connect=access.connect_timeout_s,
                                                  sock_read=access.read_timeout_s),
        "use_listings_cache": False, "skip_instance_cache": True,
    }
    if access.gcs_endpoint:
        options["endpoint_url"] = access.gcs_endpoint.rstrip("/")
    if access.gcs_anonymous:
        options["token"] = "anon"
    elif access.gcs_token_file is not None:
        options["token"] = str(access.gcs_token_file)  # its mode was checked with the other settings
    return options


def _azure_options(access: StorageAccess) -> dict[str, object]:
    options: dict[str, object] = {
        "connection_timeout": access.connect_timeout_s, "read_timeout": access.read_timeout_s,
        "use_listings_cache": False, "skip_instance_cache": True,
    }
    if access.azure_connection_string_file is not None:
        options["connection_string"] = read_secret(access.azure_connection_string_file)
    elif access.azure_account:
        options["account_name"] = access.azure_account
        if access.azure_account_key_file is not None:
            options["account_key"] = read_secret(access.azure_account_key_file)
        else:
            options["anon"] = False  # Azure's default credentials: a managed identity, $AZURE_CLIENT_ID...
    return options
