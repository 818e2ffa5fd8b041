"""The deployment's object-storage settings (services/common/storage_access.py):
they survive the trip through command lines (corral up -> driver -> worker),
secrets travel as paths of private files and never as values, and settings
that cannot work are refused before anything starts."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from services.common.storage_access import StorageAccess, add_arguments, read_secret
from services.common.tls import DevCertificateAuthority
from services.driver.app import DriverConfig, local_worker_command
from services.driver.providers.interface import InstanceRequest
from services.worker.object_stores import ObjectStores


def parsed(argv: list[str]) -> StorageAccess:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return StorageAccess.from_args(parser.parse_args(argv))


def private(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o600)
    return path


def test_settings_survive_the_command_line(tmp_path: Path) -> None:
    assert parsed([]) == StorageAccess()
    assert StorageAccess().to_args() == []
    every = StorageAccess(gcs_endpoint="http://127.0.0.1:9023", gcs_token_file=tmp_path / "sa.json",
                          azure_account="acct", azure_account_key_file=tmp_path / "key", copy_timeout_s=12.5)
    assert parsed(every.to_args()) == every
    anonymous = StorageAccess(gcs_anonymous=True, azure_connection_string_file=tmp_path / "conn")
    assert parsed(anonymous.to_args()) == anonymous


def test_workers_get_the_paths_of_the_secrets_never_the_secrets(tmp_path: Path) -> None:
    connection = private(tmp_path / "conn", "AccountName=a;AccountKey=the-secret-key")
    access = StorageAccess(gcs_endpoint="http://127.0.0.1:9023", gcs_anonymous=True,
                           azure_connection_string_file=connection)
    config = DriverConfig("mysql://unused", DevCertificateAuthority(tmp_path / "certs").issue_services().directory,
                          "file:///unused", tmp_path / "data", storage_access=access)
    argv = local_worker_command(config, lambda: "localhost:1")(
        InstanceRequest("w1", "standard", 2000, 0, "local", "token"))
    assert not any("the-secret-key" in arg for arg in argv)
    assert argv[argv.index("--azure-blob-connection-string-file") + 1] == str(connection)
    assert argv[argv.index("--gcs-endpoint") + 1] == "http://127.0.0.1:9023" and "--gcs-anonymous" in argv


def test_settings_that_cannot_work_are_refused_before_anything_starts(tmp_path: Path) -> None:
    key = private(tmp_path / "key", "k")
    assert StorageAccess(azure_account="acct", azure_account_key_file=key).problems() == []
    assert StorageAccess(gcs_anonymous=True, gcs_token_file=key).problems() == [
        "--gcs-anonymous and --gcs-token-file contradict each other"]
    assert StorageAccess(azure_account_key_file=key).problems() == ["--azure-account-key-file needs --azure-account"]
    assert StorageAccess(azure_connection_string_file=key, azure_account="acct").problems() == [
        "--azure-blob-connection-string-file names the account already: give it without --azure-account and "
        "--azure-account-key-file"]
    assert StorageAccess(copy_timeout_s=0).problems() == ["storage timeouts must be positive"]

    missing = tmp_path / "missing"
    assert StorageAccess(azure_connection_string_file=missing).problems() == [
        f"--azure-blob-connection-string-file {missing}: No such file or directory"]
    shared = tmp_path / "shared"
    shared.write_text("AccountKey=k")
    shared.chmod(0o644)
    assert StorageAccess(gcs_token_file=shared).problems() == [
        f"--gcs-token-file {shared}: other accounts may read or change it (mode 0644); chmod 600 it"]
    with pytest.raises(ValueError, match="chmod 600"):
        ObjectStores(StorageAccess(azure_connection_string_file=shared))  # a worker refuses to start with it


def test_a_secret_is_read_without_its_surrounding_whitespace(tmp_path: Path) -> None:
    assert read_secret(private(tmp_path / "s", "  value\n")) == "value"
    with pytest.raises(ValueError, match="is empty"):
        read_secret(private(tmp_path / "empty", "\n"))


def test_a_worker_without_azure_settings_says_what_the_operator_sets(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(variable, raising=False)
    stores = ObjectStores(StorageAccess())
    with pytest.raises(ValueError, match="--azure-blob-connection-string-file or --azure-account"):
        stores.locate("az://container/x")
    with pytest.raises(ValueError, match="s3://bucket/x' is not a URL this worker copies"):
        stores.locate("s3://bucket/x")
    stores.close()
