"""Sealed secrets (services/common/sealing.py): only the private key opens a
box, only for the row it was sealed for, and a box shows nothing of what it
holds."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.sealing import (
    KeyFileError,
    Opener,
    SealError,
    Sealer,
    ensure_key_files,
    pack_files,
    secret_row,
    unpack_files,
)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Sealer, Opener]:
    ensure_key_files(tmp_path / "key.pem", tmp_path / "key.pub")
    return Sealer.from_file(tmp_path / "key.pub"), Opener.from_file(tmp_path / "key.pem")


files_strategy = st.dictionaries(st.text("abc.-_", min_size=1, max_size=8), st.binary(max_size=300), max_size=5)


@given(files=files_strategy)
def test_what_is_sealed_opens_as_it_was(files: dict[str, bytes], tmp_path_factory: pytest.TempPathFactory) -> None:
    directory = tmp_path_factory.mktemp("keys")
    ensure_key_files(directory / "key.pem", directory / "key.pub")
    sealer, opener = Sealer.from_file(directory / "key.pub"), Opener.from_file(directory / "key.pem")
    box = sealer.seal(pack_files(files), secret_row("proj", "db"))
    assert unpack_files(opener.open(box, secret_row("proj", "db"))) == files


def test_a_box_opens_only_for_its_own_row(keys: tuple[Sealer, Opener]) -> None:
    sealer, opener = keys
    box = sealer.seal(b"hunter2", secret_row("proj", "db"))
    assert opener.open(box, secret_row("proj", "db")) == b"hunter2"
    for project, name in (("other", "db"), ("proj", "db2"), ("proj\0db", ""), ("", "proj")):
        with pytest.raises(SealError):
            opener.open(box, secret_row(project, name))


def test_a_box_opens_only_with_its_key_and_whole(keys: tuple[Sealer, Opener], tmp_path: Path) -> None:
    sealer, _ = keys
    ensure_key_files(tmp_path / "other.pem", tmp_path / "other.pub")
    stranger = Opener.from_file(tmp_path / "other.pem")
    assert stranger.key_id != sealer.key_id
    box = sealer.seal(b"hunter2", secret_row("proj", "db"))
    with pytest.raises(SealError):
        stranger.open(box, secret_row("proj", "db"))
    _, opener = keys
    for damaged in (box[:-1], box[:1] + bytes(32) + box[33:], bytes([2]) + box[1:], b"",
                    box[:40] + bytes([box[40] ^ 1]) + box[41:], box[:-1] + bytes([box[-1] ^ 1])):
        with pytest.raises(SealError):
            opener.open(damaged, secret_row("proj", "db"))


def test_a_box_shows_nothing_of_its_contents(keys: tuple[Sealer, Opener]) -> None:
    sealer, _ = keys
    value = b"correct horse battery staple"
    plain = pack_files({"password": value})
    boxes = [sealer.seal(plain, secret_row("proj", "db")) for _ in range(2)]
    assert boxes[0] != boxes[1]  # a fresh ephemeral key each time
    for box in boxes:
        for shown in (value, base64.b64encode(value), plain, b"password"):
            assert shown not in box


def test_the_frontend_side_refuses_a_private_key_and_the_driver_side_a_readable_one(tmp_path: Path) -> None:
    private, public = tmp_path / "key.pem", tmp_path / "key.pub"
    key_id = ensure_key_files(private, public)
    assert private.stat().st_mode & 0o777 == 0o600
    with pytest.raises(KeyFileError, match="private key"):
        Sealer.from_file(private)
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        Opener.from_file(public)
    private.chmod(0o640)
    with pytest.raises(KeyFileError, match="make it 0600"):
        Opener.from_file(private)
    private.chmod(0o600)
    with pytest.raises(KeyFileError, match="cannot read"):
        Sealer.from_file(tmp_path / "missing.pub")
    assert Opener.from_file(private).key_id == Sealer.from_file(public).key_id == key_id


def test_the_key_pair_is_made_once_and_its_public_key_rewritten(tmp_path: Path) -> None:
    private, public = tmp_path / "key.pem", tmp_path / "key.pub"
    first = ensure_key_files(private, public)
    key = private.read_bytes()
    public.write_bytes(b"tampered")
    assert ensure_key_files(private, public) == first
    assert private.read_bytes() == key and Sealer.from_file(public).key_id == first
