"""Sealing job secrets so that only the driver can open them.

A deployment has one X25519 key pair for job secrets (docs/security.md,
*Secrets*). The frontend holds the public key only: it seals the files
CreateSecret receives and cannot open anything, so no public API can
return a secret's contents even if it tried. The driver holds the private
key: it opens a secret when it sends a job that mounts it to a worker.
Neither key is in the database, which holds sealed boxes only.

A sealed box is ECIES over X25519 with AES-256-GCM: each box has a fresh
ephemeral key pair; HKDF-SHA256 of the shared secret, bound to both public
keys, gives a key used for this box alone; the associated data binds the
box to its row (billing project and name), so a box copied into another
row, of another project, does not open. Layout:

    version (1 byte, 1) | ephemeral public key (32) | nonce (12) | ciphertext and tag

Pure, but for reading and writing the key files: no database, no gRPC.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from services.common.files import write_atomically

VERSION = 1
_KEY_BYTES = 32
_NONCE_BYTES = 12
_HEADER_BYTES = 1 + _KEY_BYTES + _NONCE_BYTES
_INFO = b"corral job secret v1"


class SealError(Exception):
    """A box that does not open: sealed for another key or row, or damaged."""


class KeyFileError(Exception):
    """A key file that cannot be used; the message says why."""


def key_id(public_key: X25519PublicKey) -> str:
    """A short name of a key pair, stored beside each box: which key sealed it (for a key change)."""
    return hashlib.sha256(_raw(public_key)).hexdigest()[:16]


def secret_row(billing_project: str, name: str) -> bytes:
    """The associated data of a secret's box: its row. Names never hold NUL (validated)."""
    return b"secret\0" + billing_project.encode() + b"\0" + name.encode()


def pack_files(files: Mapping[str, bytes]) -> bytes:
    """A secret's files as the plaintext of its box."""
    return json.dumps({k: base64.b64encode(v).decode() for k, v in sorted(files.items())},
                      separators=(",", ":")).encode()


def unpack_files(plaintext: bytes) -> dict[str, bytes]:
    """The files `pack_files` packed."""
    return {k: base64.b64decode(v) for k, v in json.loads(plaintext).items()}


def _raw(public_key: X25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def _box_key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=_INFO + ephemeral + recipient).derive(shared)


class Sealer:
    """Seals for one public key (the frontend's side)."""

    def __init__(self, public_key: X25519PublicKey):
        self._public_key = public_key
        self.key_id = key_id(public_key)

    @classmethod
    def from_file(cls, path: Path) -> Sealer:
        """The public key in `path` (PEM). A private key is refused: whoever seals must not open."""
        data = _read(path)
        if b"PRIVATE KEY" in data:
            raise KeyFileError(f"{path} holds a private key; give this service the public key only "
                               "(the driver alone opens secrets)")
        try:
            key = serialization.load_pem_public_key(data)
        except ValueError as e:
            raise KeyFileError(f"{path} is not a PEM public key: {e}") from None
        if not isinstance(key, X25519PublicKey):
            raise KeyFileError(f"{path} is not an X25519 public key")
        return cls(key)

    def seal(self, plaintext: bytes, associated: bytes) -> bytes:
        """A box only the private key opens, and only with the same `associated` data."""
        ephemeral = X25519PrivateKey.generate()
        ephemeral_raw = _raw(ephemeral.public_key())
        key = _box_key(ephemeral.exchange(self._public_key), ephemeral_raw, _raw(self._public_key))
        nonce = os.urandom(_NONCE_BYTES)  # the key serves this box only; a random nonce costs nothing
        return bytes([VERSION]) + ephemeral_raw + nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


class Opener:
    """Opens boxes sealed for one key pair (the driver's side)."""

    def __init__(self, private_key: X25519PrivateKey):
        self._private_key = private_key
        self.key_id = key_id(private_key.public_key())

    @classmethod
    def from_file(cls, path: Path) -> Opener:
        """The private key in `path` (PEM, PKCS#8), which must be private to its owner (0600 or less)."""
        mode = path.stat().st_mode if path.exists() else 0
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise KeyFileError(f"{path} may be read by others (mode {stat.S_IMODE(mode):04o}): make it 0600")
        try:
            key = serialization.load_pem_private_key(_read(path), password=None)
        except ValueError as e:
            raise KeyFileError(f"{path} is not an unencrypted PEM private key: {e}") from None
        if not isinstance(key, X25519PrivateKey):
            raise KeyFileError(f"{path} is not an X25519 private key")
        return cls(key)

    def sealer(self) -> Sealer:
        """A sealer for this key pair's public key."""
        return Sealer(self._private_key.public_key())

    def public_pem(self) -> bytes:
        """This key pair's public key, as the frontend is given it (PEM)."""
        return self._private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                           serialization.PublicFormat.SubjectPublicKeyInfo)

    def open(self, box: bytes, associated: bytes) -> bytes:
        """The plaintext of `box`; raises SealError if it was not sealed for this key and `associated`."""
        if len(box) < _HEADER_BYTES + 16 or box[0] != VERSION:
            raise SealError("not a sealed box of this version")
        ephemeral_raw, nonce = box[1:1 + _KEY_BYTES], box[1 + _KEY_BYTES:_HEADER_BYTES]
        try:
            shared = self._private_key.exchange(X25519PublicKey.from_public_bytes(ephemeral_raw))
        except ValueError as e:  # a low-order point: no box of ours
            raise SealError(f"not a sealed box: {e}") from None
        key = _box_key(shared, ephemeral_raw, _raw(self._private_key.public_key()))
        try:
            return AESGCM(key).decrypt(nonce, box[_HEADER_BYTES:], associated)
        except InvalidTag:
            raise SealError("the box does not open with this key for this secret") from None


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read {path}: {e.strerror}") from None


def ensure_key_files(private_path: Path, public_path: Path) -> str:
    """Make the deployment's key pair on first use (the private key 0600, never replaced: every secret
    sealed so far needs it) and write its public key beside it (again each time, so it cannot drift).
    Returns the key id."""
    if not private_path.exists():
        key = X25519PrivateKey.generate()
        write_atomically(private_path, key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()), 0o600)
    opener = Opener.from_file(private_path)
    write_atomically(public_path, opener.public_pem(), 0o600)
    return opener.key_id
