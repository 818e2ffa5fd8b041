"""A development certificate authority and the gRPC credentials built on it.

`corral up` keeps one CA under its data directory and issues each service a
certificate whose common name is the service's identity ("auth",
"frontend", "driver", "worker-<name>"). Services talk to each other with
mutual TLS: both sides present a certificate signed by the CA, and the
receiving side reads the caller's identity from the verified common name.
People connect with plain TLS and a bearer token.

Keys are ECDSA P-256, written 0600. Nothing here is for production: an
operator brings certificates from their own CA (the files have the same
layout).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import ipaddress
from collections.abc import Iterator
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.files import write_atomically

_VALIDITY = datetime.timedelta(days=365)
_RENEW_BEFORE = datetime.timedelta(days=30)


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The PEM files one party needs: the CA to trust, its certificate and key."""

    ca_cert: Path
    """CA certificate that signed every peer's certificate."""
    cert: Path
    """This party's certificate chain."""
    key: Path
    """This party's private key."""

    def server_credentials(self, require_client_cert: bool) -> grpc.ServerCredentials:
        """Credentials for a listener; with `require_client_cert`, mutual TLS."""
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=self.ca_cert.read_bytes(),
            require_client_auth=require_client_cert,
        )

    def channel_credentials(self, with_client_cert: bool = True) -> grpc.ChannelCredentials:
        """Credentials for dialling a corral service (presenting our certificate)."""
        if not with_client_cert:
            return grpc.ssl_channel_credentials(root_certificates=self.ca_cert.read_bytes())
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_cert.read_bytes(),
            private_key=self.key.read_bytes(),
            certificate_chain=self.cert.read_bytes(),
        )


def _still_valid(files: TlsFiles) -> bool:
    """Whether `files` holds a certificate and key good for more than 30 days."""
    if not (files.cert.exists() and files.key.exists()):
        return False
    existing = x509.load_pem_x509_certificate(files.cert.read_bytes())
    return existing.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc) > _RENEW_BEFORE


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class DevCertificateAuthority:
    """A CA in a directory: `ca.pem`, `ca.key`, and `<name>.pem`/`<name>.key` per identity."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.ca_cert_path = directory / "ca.pem"
        self.ca_key_path = directory / "ca.key"

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the directory's lock: processes started together (two drivers,
        both "driver") must not issue the same identity at once, or one reads
        the key the other is writing, or keeps a certificate of the other's key."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.directory / ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield

    def ensure(self) -> None:
        """Create the CA if the directory has none yet (kept across restarts)."""
        if self._has_ca():
            return
        with self._exclusive():
            self._ensure()

    def _has_ca(self) -> bool:
        return self.ca_cert_path.exists() and self.ca_key_path.exists()

    def _ensure(self) -> None:
        if self._has_ca():
            return
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral development CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + 10 * _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        write_atomically(self.ca_key_path, _key_pem(key), 0o600)
        write_atomically(self.ca_cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)

    def issue(self, identity: str, hostnames: tuple[str, ...] = ("localhost", "127.0.0.1")) -> TlsFiles:
        """A certificate for `identity` (its common name), valid as server and client.

        Reuses an existing certificate unless it expires within 30 days,
        without writing anything (a directory of an operator's certificates
        may be read-only)."""
        files = TlsFiles(self.ca_cert_path, self.directory / f"{identity}.pem", self.directory / f"{identity}.key")
        if self._has_ca() and _still_valid(files):
            return files
        with self._exclusive():
            self._ensure()
            if _still_valid(files):  # another process issued it while we waited
                return files
            return self._issue(files, identity, hostnames)

    def _issue(self, files: TlsFiles, identity: str, hostnames: tuple[str, ...]) -> TlsFiles:
        ca_key = serialization.load_pem_private_key(self.ca_key_path.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes())
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hostnames:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        # The key first: a process reading without the lock that sees the new
        # certificate sees its key too.
        write_atomically(files.key, _key_pem(key), 0o600)
        write_atomically(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        return files
