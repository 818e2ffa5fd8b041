"""How workers reach the object stores that jobs' files live in: endpoints,
and where the deployment's credentials are. Never per job, never from a
user: a job names `gs://bucket/...` or `az://container/...` and the worker
copies it with the deployment's own rights, which is why the storage roots
(services/common/urls.py) keep each project under its own prefix.

Secrets (an Azure connection string or account key) stay in files the
operator made private (0600): the settings hold their paths, which may go on
a command line, and only the worker reads what is in them
(services/worker/object_stores.py). A Google service-account key is such a
file too. `corral up` takes these options and hands them to its drivers, and
each driver to the workers it starts (`to_args`), so the frontend and the
drivers never hold a secret of storage themselves.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
from pathlib import Path

DEFAULT_COPY_TIMEOUT_S = 3600.0


@dataclasses.dataclass(frozen=True)
class StorageAccess:
    """The deployment's settings for object storage; every field may be left at its default."""

    gcs_endpoint: str = ""
    """Base URL of the GCS JSON API, e.g. `http://127.0.0.1:9023` for an emulator; empty: Google's."""
    gcs_token_file: Path | None = None
    """A service-account key (JSON), private to the account running corral; None: Google's application
    default credentials (the machine's service account on GCE, $GOOGLE_APPLICATION_CREDENTIALS), unless
    `gcs_anonymous`."""
    gcs_anonymous: bool = False
    """Send no credentials to GCS (an emulator, public buckets)."""
    azure_connection_string_file: Path | None = None
    """A file holding an Azure Storage connection string (account, key and endpoint), private to the
    account running corral."""
    azure_account: str = ""
    """The Azure Storage account, when there is no connection string: with `azure_account_key_file`, or
    alone to use Azure's default credentials (a managed identity, $AZURE_CLIENT_ID...)."""
    azure_account_key_file: Path | None = None
    """A file holding `azure_account`'s key, private to the account running corral."""
    copy_timeout_s: float = DEFAULT_COPY_TIMEOUT_S
    """Most time one file's copy to or from an object store may take, retries included; past it the
    attempt ends in Error naming the file. Stalls end sooner (`connect_timeout_s`, `read_timeout_s`)."""
    connect_timeout_s: float = 30.0
    """Most time to open a connection to an object store, each try."""
    read_timeout_s: float = 120.0
    """Most time an object store may go without sending a byte it owes, each try."""

    def secret_files(self) -> dict[str, Path]:
        """The files this configuration names, by option."""
        named = {"--gcs-token-file": self.gcs_token_file,
                 "--azure-blob-connection-string-file": self.azure_connection_string_file,
                 "--azure-account-key-file": self.azure_account_key_file}
        return {option: path for option, path in named.items() if path is not None}

    def problems(self) -> list[str]:
        """What is wrong with these settings (contradictions; secret files missing, unreadable or readable by
        other accounts); empty if nothing. Reads no secret."""
        found = []
        if self.gcs_anonymous and self.gcs_token_file is not None:
            found.append("--gcs-anonymous and --gcs-token-file contradict each other")
        if self.azure_connection_string_file is not None and (self.azure_account or self.azure_account_key_file):
            found.append("--azure-blob-connection-string-file names the account already: give it without "
                         "--azure-account and --azure-account-key-file")
        if self.azure_account_key_file is not None and not self.azure_account:
            found.append("--azure-account-key-file needs --azure-account")
        if self.copy_timeout_s <= 0 or self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            found.append("storage timeouts must be positive")
        for option, path in self.secret_files().items():
            if problem := secret_file_problem(path):
                found.append(f"{option} {path}: {problem}")
        return found

    def to_args(self) -> list[str]:
        """The command-line options that give a process these settings (`add_arguments`, `from_args`)."""
        args = []
        if self.gcs_endpoint:
            args += ["--gcs-endpoint", self.gcs_endpoint]
        if self.gcs_anonymous:
            args += ["--gcs-anonymous"]
        if self.azure_account:
            args += ["--azure-account", self.azure_account]
        for option, path in self.secret_files().items():
            args += [option, str(path)]
        if self.copy_timeout_s != DEFAULT_COPY_TIMEOUT_S:
            args += ["--storage-timeout", repr(self.copy_timeout_s)]
        return args

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> StorageAccess:
        """The settings of options added by `add_arguments`."""
        return cls(gcs_endpoint=args.gcs_endpoint, gcs_token_file=args.gcs_token_file,
                   gcs_anonymous=args.gcs_anonymous,
                   azure_connection_string_file=args.azure_blob_connection_string_file,
                   azure_account=args.azure_account, azure_account_key_file=args.azure_account_key_file,
                   copy_timeout_s=args.storage_timeout)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `StorageAccess`, for `corral up`, the drivers (which pass them to the workers they
    start) and the workers."""
    group = parser.add_argument_group(
        "object storage", "how workers reach gs:// and az:// storage roots (secrets stay in files, 0600)")
    group.add_argument("--gcs-endpoint", default="", metavar="URL",
                       help="GCS JSON API base URL, e.g. an emulator's http://127.0.0.1:PORT (default: Google's)")
    group.add_argument("--gcs-token-file", type=Path, metavar="FILE",
                       help="service-account key (JSON) for GCS (default: application default credentials)")
    group.add_argument("--gcs-anonymous", action="store_true", help="send no credentials to GCS (emulators)")
    group.add_argument("--azure-blob-connection-string-file", type=Path, metavar="FILE",
                       help="file holding an Azure Storage connection string")
    group.add_argument("--azure-account", default="", metavar="NAME",
                       help="Azure Storage account, with --azure-account-key-file or alone for Azure's default "
                            "credentials (managed identity)")
    group.add_argument("--azure-account-key-file", type=Path, metavar="FILE",
                       help="file holding the Azure Storage account's key")
    group.add_argument("--storage-timeout", type=float, default=DEFAULT_COPY_TIMEOUT_S, metavar="SECONDS",
                       help="most time one file's copy to or from object storage may take (default: %(default)s)")


def secret_file_problem(path: Path) -> str | None:
    """Why `path` cannot hold a secret of the deployment: missing, not a regular file, or readable or writable
    by other accounts (like ssh, corral refuses a key others can read: they could have copied it)."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_mode & 0o077:
        return f"other accounts may read or change it (mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it"
    return None


def read_secret(path: Path) -> str:
    """The secret in `path`, without surrounding whitespace; ValueError saying why if it cannot be used."""
    if problem := secret_file_problem(path):
        raise ValueError(f"{path}: {problem}")
    secret = path.read_text().strip()
    if not secret:
        raise ValueError(f"{path} is empty")
    return secret
