"""The development CA issues certificates that services can load, also when
processes started together ask for the same identity at once (corral up
starts two drivers, both "driver", at the same moment)."""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import NameOID

from services.common.tls import DevCertificateAuthority, WorkerIssuer

# Each process issues "driver", then checks that the key it reads belongs to
# the certificate it reads: what grpc needs to serve.
ISSUE_AND_CHECK = """
import sys
from pathlib import Path
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from services.common.tls import DevCertificateAuthority
files = DevCertificateAuthority(Path(sys.argv[1])).issue("driver")
key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
assert cert.public_key() == key.public_key(), "the certificate is not the key's"
print(cert.serial_number)
"""


def _matches(cert_path: Path, key_path: Path) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    return cert.public_key() == key.public_key()


def test_processes_issuing_one_identity_at_once_all_get_one_matching_pair(tmp_path: Path) -> None:
    directory = tmp_path / "certs"
    processes = [subprocess.Popen([sys.executable, "-c", ISSUE_AND_CHECK, str(directory)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(8)]
    results = [p.communicate(timeout=60) + (p.returncode,) for p in processes]
    assert [(rc, err) for _, err, rc in results] == [(0, "")] * 8
    # The first issued it; the others found it and reused it.
    assert len({out for out, _, _ in results}) == 1
    assert _matches(directory / "driver.pem", directory / "driver.key")
    assert not list(directory.glob("*.partial"))


def test_a_certificate_is_reused_and_signed_by_the_ca(tmp_path: Path) -> None:
    ca = DevCertificateAuthority(tmp_path)
    first = ca.issue("frontend")
    again = ca.issue("frontend")
    assert first.cert.read_bytes() == again.cert.read_bytes()
    assert _matches(first.cert, first.key)
    cert = x509.load_pem_x509_certificate(first.cert.read_bytes())
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert_path.read_bytes())
    cert.verify_directly_issued_by(ca_cert)
    assert oct(first.key.stat().st_mode & 0o777) == oct(0o600)
    assert oct(ca.ca_key_path.stat().st_mode & 0o777) == oct(0o600)


def test_reusing_a_certificate_writes_nothing(tmp_path: Path) -> None:
    """An operator's certificate directory may be read-only (a Kubernetes
    secret): finding what it needs there must not even take the lock file."""
    ca = DevCertificateAuthority(tmp_path)
    ca.issue("auth")
    (tmp_path / ".lock").unlink()
    before = {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()}
    ca.ensure()
    ca.issue("auth")
    assert {path.name: path.stat().st_mtime_ns for path in tmp_path.iterdir()} == before


def test_a_certificate_without_its_identity_uri_is_issued_again(tmp_path: Path) -> None:
    """A data directory from before identities were URIs: its certificates name the service in the
    common name only, which the identity check no longer accepts."""
    ca = DevCertificateAuthority(tmp_path)
    files = ca.issue("frontend")
    old_key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(ca.ca_cert_path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca.ca_key_path.read_bytes(), password=None)
    now = datetime.datetime.now(datetime.timezone.utc)
    legacy = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "frontend")]))
              .issuer_name(ca_cert.subject).public_key(old_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(now)
              .not_valid_after(now + datetime.timedelta(days=300)).sign(ca_key, hashes.SHA256()))
    files.cert.write_bytes(legacy.public_bytes(serialization.Encoding.PEM))
    again = ca.issue("frontend")
    cert = x509.load_pem_x509_certificate(again.cert.read_bytes())
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier)
    assert uris == ["spiffe://corral/service/frontend"]


def test_the_worker_issuer_signs_workers_that_verify_up_to_the_ca(tmp_path: Path) -> None:
    ca = DevCertificateAuthority(tmp_path / "ca").issue_services()
    files = WorkerIssuer(ca.directory).provision_worker("w1", tmp_path / "w1")
    assert sorted(p.name for p in (tmp_path / "w1").iterdir()) == ["ca.pem", "worker-w1.key", "worker-w1.pem"]
    assert oct((tmp_path / "w1").stat().st_mode & 0o777) == oct(0o700)
    leaf, issuer = x509.load_pem_x509_certificates(files.cert.read_bytes())
    leaf.verify_directly_issued_by(issuer)
    issuer.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.ca_cert_path.read_bytes()))
    assert issuer.extensions.get_extension_for_class(x509.BasicConstraints).value.path_length == 0
    assert _matches(files.cert, files.key)
