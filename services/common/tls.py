"""Certificates: the development CA, what each process is given, and the
gRPC credentials built on them.

Every corral process proves who it is with a certificate whose subject
alternative names carry its identity as a URI, `spiffe://corral/service/NAME`
for the services ("auth", "frontend", "driver", "gateway") and
`spiffe://corral/worker/INSTANCE` for a worker machine. Services talk to each
other with mutual TLS and read the caller's identity from that URI
(`services.common.identity`). People connect with plain TLS and a bearer
token.

Who holds which key (design §5b):
- the CA's key stays in the CA's directory, read only by whoever issues
  certificates (`corral up`'s certificate step, or the operator's own CA);
- each service is *provisioned* a directory of its own holding the CA
  certificate, its certificate and its key, and nothing else;
- the drivers also hold the **worker issuer**, an intermediate CA that the CA
  made for signing worker certificates only. The local provider gives each
  worker a directory with its own key and a certificate bound to its
  instance name; a cloud worker makes its own key and sends a certificate
  signing request with its one-time token (`WorkerIssuer.sign_request`,
  services.driver.enrollment), so no key ever travels. Whatever the issuer
  signs can only ever be a worker: the
  identity check refuses a certificate that was not signed by the CA itself
  unless its identity is a worker's (an intermediate cannot be limited to
  URI paths by X.509 name constraints, so the check is ours).

Keys are ECDSA P-256, written 0600 in directories made 0700. Nothing here is
for production certificates: an operator brings their own (same file
layout, same URIs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import fcntl
import ipaddress
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.files import write_atomically

_VALIDITY = datetime.timedelta(days=365)
_WORKER_VALIDITY = datetime.timedelta(days=30)
_RENEW_BEFORE = datetime.timedelta(days=30)
_LOOPBACK = ("localhost", "127.0.0.1")

SERVICE_URI_PREFIX = "spiffe://corral/service/"
"""Identity URI of a corral service; the name follows."""
WORKER_URI_PREFIX = "spiffe://corral/worker/"
"""Identity URI of a worker machine; its instance name follows."""
SERVICE_IDENTITIES = ("auth", "frontend", "driver", "gateway")
"""The services' certificate identities (the gateway's: Envoy, which calls on workers' behalf)."""
WORKER_ISSUER = "worker-issuer"
"""File stem of the drivers' intermediate CA for worker certificates."""


def identity_uri(identity: str) -> str:
    """The SAN URI of an identity name: 'frontend' → spiffe://corral/service/frontend,
    'worker-NAME' → spiffe://corral/worker/NAME."""
    if identity.startswith("worker-"):
        return WORKER_URI_PREFIX + identity.removeprefix("worker-")
    return SERVICE_URI_PREFIX + identity


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """The PEM files one party needs: the CA to trust, its certificate and key."""

    ca_cert: Path
    """CA certificate that signed every peer's certificate."""
    cert: Path
    """This party's certificate chain (its certificate, then any intermediate)."""
    key: Path
    """This party's private key."""

    @classmethod
    def of(cls, directory: Path, identity: str) -> TlsFiles:
        """The files of `identity` in a provisioned directory: `ca.pem`, `IDENTITY.pem`, `IDENTITY.key`.
        Raises FileNotFoundError naming what is missing: a service never issues its own certificate."""
        files = cls(directory / "ca.pem", directory / f"{identity}.pem", directory / f"{identity}.key")
        missing = [str(p) for p in (files.ca_cert, files.cert, files.key) if not p.exists()]
        if missing:
            raise FileNotFoundError(f"no certificate for {identity!r}: missing {', '.join(missing)} "
                                    "(corral up provisions them; see docs/security.md)")
        return files

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


def _still_valid(files: TlsFiles, identity: str | None = None) -> bool:
    """Whether `files` holds a certificate and key good for more than 30 days (and, given an
    identity, naming it by its URI: certificates from before identities were URIs are issued again)."""
    if not (files.cert.exists() and files.key.exists()):
        return False
    existing = x509.load_pem_x509_certificate(files.cert.read_bytes())
    if identity is not None:
        try:
            uris = existing.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
                .get_values_for_type(x509.UniformResourceIdentifier)
        except x509.ExtensionNotFound:
            uris = []
        if identity_uri(identity) not in uris:
            return False
    return existing.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc) > _RENEW_BEFORE


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)


_CA_USAGE = x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                          key_encipherment=False, data_encipherment=False, key_agreement=False,
                          encipher_only=False, decipher_only=False)


def _leaf(identity: str, hostnames: tuple[str, ...], public_key: ec.EllipticCurvePublicKey | rsa.RSAPublicKey,
          issuer: x509.Certificate, issuer_key: ec.EllipticCurvePrivateKey,
          validity: datetime.timedelta) -> x509.Certificate:
    """A certificate for `identity`, valid as server (for `hostnames`) and as client."""
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(identity))]
    for host in hostnames:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(issuer.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(min(now + validity, issuer.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(issuer_key, hashes.SHA256())
    )


class DevCertificateAuthority:
    """A CA in a private directory: `ca.pem`, `ca.key`, and `<name>.pem`/`<name>.key` per identity
    it issued there (tests use those directly; `provision` copies one identity out for a process)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.ca_cert_path = directory / "ca.pem"
        self.ca_key_path = directory / "ca.key"

    @contextlib.contextmanager
    def _exclusive(self) -> Iterator[None]:
        """Hold the directory's lock: processes started together must not issue the same
        identity at once, or one reads the key the other is writing."""
        _private_dir(self.directory)
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
            # Path length 1: the CA may sign one level of intermediates, the worker issuer.
            .add_extension(x509.BasicConstraints(ca=True, path_length=1), critical=True)
            .add_extension(_CA_USAGE, critical=True)
            .sign(key, hashes.SHA256())
        )
        write_atomically(self.ca_key_path, _key_pem(key), 0o600)
        write_atomically(self.ca_cert_path, _pem(cert), 0o644)

    def _ca(self) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        ca_key = serialization.load_pem_private_key(self.ca_key_path.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        return x509.load_pem_x509_certificate(self.ca_cert_path.read_bytes()), ca_key

    def issue(self, identity: str, hostnames: tuple[str, ...] = _LOOPBACK) -> TlsFiles:
        """A certificate for `identity` in the CA's directory, valid as server and client.

        Reuses an existing certificate unless it expires within 30 days,
        without writing anything (a directory of an operator's certificates
        may be read-only)."""
        files = TlsFiles(self.ca_cert_path, self.directory / f"{identity}.pem", self.directory / f"{identity}.key")
        if identity == WORKER_ISSUER:
            return self.issue_worker_issuer()
        if self._has_ca() and _still_valid(files, identity):
            return files
        with self._exclusive():
            self._ensure()
            if _still_valid(files, identity):  # another process issued it while we waited
                return files
            ca_cert, ca_key = self._ca()
            key = ec.generate_private_key(ec.SECP256R1())
            cert = _leaf(identity, hostnames, key.public_key(), ca_cert, ca_key, _VALIDITY)
            # The key first: a process reading without the lock that sees the new
            # certificate sees its key too.
            write_atomically(files.key, _key_pem(key), 0o600)
            write_atomically(files.cert, _pem(cert), 0o644)
            return files

    def issue_services(self) -> DevCertificateAuthority:
        """Issue every service identity and the worker issuer into the CA's own directory, so that
        it can serve as every service's certificate directory at once (tests and benchmarks in one
        process tree; `corral up` provisions a directory per service instead)."""
        for identity in (*SERVICE_IDENTITIES, WORKER_ISSUER):
            self.issue(identity)
        return self

    def issue_worker_issuer(self) -> TlsFiles:
        """The intermediate CA the drivers sign worker certificates with (`worker-issuer.pem/.key`)."""
        files = TlsFiles(self.ca_cert_path, self.directory / f"{WORKER_ISSUER}.pem",
                         self.directory / f"{WORKER_ISSUER}.key")
        if self._has_ca() and _still_valid(files):
            return files
        with self._exclusive():
            self._ensure()
            if _still_valid(files):
                return files
            ca_cert, ca_key = self._ca()
            key = ec.generate_private_key(ec.SECP256R1())
            now = datetime.datetime.now(datetime.timezone.utc)
            cert = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral worker issuer")]))
                .issuer_name(ca_cert.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(min(now + _VALIDITY, ca_cert.not_valid_after_utc))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(_CA_USAGE, critical=True)
                .sign(ca_key, hashes.SHA256())
            )
            write_atomically(files.key, _key_pem(key), 0o600)
            write_atomically(files.cert, _pem(cert), 0o644)
            return files

    def provision(self, identity: str, destination: Path, hostnames: tuple[str, ...] = _LOOPBACK) -> TlsFiles:
        """Give one process its directory: the CA certificate and `identity`'s certificate and key
        (the worker issuer's too for `identity='worker-issuer'`), and nothing else. Made 0700."""
        issued = self.issue(identity, hostnames)
        _private_dir(destination)
        files = TlsFiles(destination / "ca.pem", destination / issued.cert.name, destination / issued.key.name)
        for source, target, mode in ((issued.ca_cert, files.ca_cert, 0o644), (issued.cert, files.cert, 0o644),
                                     (issued.key, files.key, 0o600)):
            if not target.exists() or target.read_bytes() != source.read_bytes():
                write_atomically(target, source.read_bytes(), mode)
        return files


class WorkerIssuer:
    """The drivers' intermediate CA: signs certificates for worker machines, nothing else."""

    def __init__(self, directory: Path):
        self.files = TlsFiles.of(directory, WORKER_ISSUER)

    def provision_worker(self, instance_name: str, destination: Path,
                         hostnames: tuple[str, ...] = _LOOPBACK) -> TlsFiles:
        """A fresh key and a certificate for `worker-INSTANCE` in `destination` (made 0700), with the
        chain up to the CA and the CA certificate: all a worker needs, and all it gets."""
        if not instance_name or "/" in instance_name:
            raise ValueError(f"bad instance name {instance_name!r}")
        identity = f"worker-{instance_name}"
        issuer_cert = x509.load_pem_x509_certificate(self.files.cert.read_bytes())
        issuer_key = serialization.load_pem_private_key(self.files.key.read_bytes(), password=None)
        assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _leaf(identity, hostnames, key.public_key(), issuer_cert, issuer_key, _WORKER_VALIDITY)
        _private_dir(destination)
        files = TlsFiles(destination / "ca.pem", destination / f"{identity}.pem", destination / f"{identity}.key")
        write_atomically(files.key, _key_pem(key), 0o600)
        write_atomically(files.cert, _pem(cert) + _pem(issuer_cert), 0o644)
        shutil.copyfile(self.files.ca_cert, files.ca_cert)
        os.chmod(files.ca_cert, 0o644)
        return files

    def sign_request(self, instance_name: str, csr_pem: bytes, validity: datetime.timedelta,
                     hostnames: tuple[str, ...] = _LOOPBACK) -> tuple[bytes, datetime.datetime]:
        """A certificate for `worker-INSTANCE` (the same names `provision_worker` gives) on the key of a
        worker's signing request (`checked_request`; BadRequest if it is not acceptable), valid for
        `validity`: the chain (certificate, then the issuer's) as PEM, and when it expires. The key never
        leaves the worker."""
        if not instance_name or "/" in instance_name:
            raise ValueError(f"bad instance name {instance_name!r}")
        request = checked_request(csr_pem)
        issuer_cert = x509.load_pem_x509_certificate(self.files.cert.read_bytes())
        issuer_key = serialization.load_pem_private_key(self.files.key.read_bytes(), password=None)
        assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
        public_key = request.public_key()
        assert isinstance(public_key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey))
        cert = _leaf(f"worker-{instance_name}", hostnames, public_key, issuer_cert, issuer_key, validity)
        return _pem(cert) + _pem(issuer_cert), cert.not_valid_after_utc


MAX_CSR_BYTES = 16 * 1024
"""Largest certificate signing request accepted (a P-256 or RSA-4096 one is 0.5 to 2 KB)."""
RSA_KEY_BITS = (2048, 4096)
"""The RSA key sizes accepted in a worker's request, smallest and largest."""


class BadRequest(ValueError):
    """A certificate signing request that is not one a worker may have signed."""


def checked_request(csr_pem: bytes) -> x509.CertificateSigningRequest:
    """A worker's certificate signing request, once it is shown to be well formed, signed by the key it
    carries, and for an EC P-256 or RSA 2048–4096-bit key; BadRequest saying why otherwise. Its subject and
    extensions are not looked at: the certificate names only what the issuer decides."""
    if len(csr_pem) > MAX_CSR_BYTES:
        raise BadRequest(f"the request is {len(csr_pem)} bytes; at most {MAX_CSR_BYTES}")
    try:
        request = x509.load_pem_x509_csr(csr_pem)
        key = request.public_key()
    except (ValueError, TypeError, x509.UnsupportedGeneralNameType) as e:
        raise BadRequest(f"not a PEM certificate signing request: {e}") from None
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1):
            raise BadRequest(f"an EC key must be on P-256, not {key.curve.name}")
    elif isinstance(key, rsa.RSAPublicKey):
        if not RSA_KEY_BITS[0] <= key.key_size <= RSA_KEY_BITS[1]:
            raise BadRequest(f"an RSA key has {RSA_KEY_BITS[0]} to {RSA_KEY_BITS[1]} bits, not {key.key_size}")
    else:
        raise BadRequest(f"the key must be EC P-256 or RSA, not {type(key).__name__}")
    if not request.is_signature_valid:
        raise BadRequest("the request's signature does not match its key")
    return request


def certificate_request(instance_name: str) -> tuple[bytes, bytes]:
    """A new EC P-256 key (PEM, unencrypted) and a certificate signing request for `worker-INSTANCE` signed
    by it: what a worker makes for itself to enroll or renew."""
    key = ec.generate_private_key(ec.SECP256R1())
    request = (x509.CertificateSigningRequestBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"worker-{instance_name}")]))
               .sign(key, hashes.SHA256()))
    return _key_pem(key), request.public_bytes(serialization.Encoding.PEM)


def not_after(cert_pem: bytes) -> datetime.datetime:
    """When the first certificate of a PEM chain expires (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def not_before(cert_pem: bytes) -> datetime.datetime:
    """When the first certificate of a PEM chain became valid (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_before_utc
