"""A cloud worker's own key and certificate: enrolled once with its one-time token, renewed before expiry.

The worker makes its key on its machine (EC P-256, written 0600 in a 0700 directory) and sends only a
certificate signing request: with its activation token to Enroll, at the boot data's `enroll_address`
(TLS, the server checked against the deployment CA from the boot data, no client certificate); later, to
Renew over mutual TLS with the certificate it holds, through the internal gateway, at two thirds of the
certificate's life. Each renewal makes a new key. The files are those `TlsFiles.of(certs_dir,
'worker-NAME')` reads, so the worker runs on them exactly as on a certificate a local provider gave it;
a renewed certificate is used from the next channel on (`CertificateRenewer` calls `on_renewed`, and the
agent then opens a new session).

A worker restarted on the same machine finds its certificate still valid and does not enroll again (its
token is used up).
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import random
from collections.abc import Callable
from pathlib import Path

import grpc

from corral.driver.v1 import worker_enrollment_service_pb2 as pb
from corral.driver.v1 import worker_enrollment_service_pb2_grpc
from services.common.files import write_atomically
from services.common.tls import TlsFiles, certificate_request, not_after, not_before
from services.driver.providers.worker_metadata import WorkerBootstrap

log = logging.getLogger(__name__)

RENEW_AT = 2 / 3
"""Renew when this fraction of the certificate's life has passed."""


def worker_files(certs_dir: Path, instance_name: str) -> TlsFiles:
    """Where the worker keeps the CA certificate, its certificate chain and its key."""
    return TlsFiles(certs_dir / "ca.pem", certs_dir / f"worker-{instance_name}.pem",
                    certs_dir / f"worker-{instance_name}.key")


def _store(files: TlsFiles, key_pem: bytes, chain_pem: bytes) -> None:
    # The key first: whoever reads the certificate next finds its key.
    write_atomically(files.key, key_pem, 0o600)
    write_atomically(files.cert, chain_pem, 0o644)


def _usable(files: TlsFiles, now: datetime.datetime) -> bool:
    """A certificate and key already there, with more than a third of its life left."""
    if not (files.cert.exists() and files.key.exists()):
        return False
    try:
        return now < renew_time(files)
    except ValueError:
        return False


def renew_time(files: TlsFiles) -> datetime.datetime:
    """When the worker's certificate is due for renewal: two thirds into its life, counted from when the
    worker stored it (its not-before is backdated a few minutes for clock skew, which would make a short-lived
    certificate due at once)."""
    chain = files.cert.read_bytes()
    stored = datetime.datetime.fromtimestamp(files.cert.stat().st_mtime, datetime.timezone.utc)
    start, end = max(not_before(chain), min(stored, not_after(chain))), not_after(chain)
    return start + (end - start) * RENEW_AT


def _private_dir(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)


async def enroll(bootstrap: WorkerBootstrap, certs_dir: Path, timeout_s: float = 30.0,
                 attempts: int = 5) -> TlsFiles:
    """The worker's certificate files in `certs_dir` (made 0700): enrolled at `bootstrap.enroll_address`
    with a new key, unless a certificate there is still good. Retries what may pass (the enrollment
    address not answering yet); a refusal (the token used, expired or revoked) raises at once."""
    _private_dir(certs_dir)
    write_atomically(certs_dir / "ca.pem", bootstrap.ca_cert_pem.encode(), 0o644)
    return await enroll_at(bootstrap.enroll_address, bootstrap.instance_name, bootstrap.activation_token,
                           certs_dir, timeout_s, attempts)


async def enroll_at(address: str, instance_name: str, activation_token: str, certs_dir: Path,
                    timeout_s: float = 30.0, attempts: int = 5) -> TlsFiles:
    """`enroll`, given the CA certificate in `certs_dir/ca.pem` (a local provider's worker: its driver
    wrote that file alone, and no key)."""
    _private_dir(certs_dir)
    files = worker_files(certs_dir, instance_name)
    if _usable(files, datetime.datetime.now(datetime.timezone.utc)):
        log.info("%s: the certificate in %s is still good; not enrolling again", instance_name, certs_dir)
        return files
    key_pem, csr_pem = certificate_request(instance_name)
    request = pb.EnrollRequest(instance_name=instance_name, activation_token=activation_token,
                               csr_pem=csr_pem.decode())
    credentials = grpc.ssl_channel_credentials(root_certificates=files.ca_cert.read_bytes())
    delay_s = 0.5
    for attempt in range(1, attempts + 1):
        async with grpc.aio.secure_channel(address, credentials) as channel:
            stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
            try:
                response = await stub.Enroll(request, timeout=timeout_s)
                break
            except grpc.aio.AioRpcError as e:
                if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) \
                        or attempt == attempts:
                    raise
                log.warning("%s: enrolling at %s: %s; again in %.1f s", instance_name, address, e.details(),
                            delay_s)
        await asyncio.sleep(delay_s)
        delay_s = min(10.0, delay_s * 2)
    _store(files, key_pem, response.certificate_chain_pem.encode())
    log.info("%s: enrolled; certificate valid until %s", instance_name,
             response.not_after.ToDatetime(datetime.timezone.utc).isoformat())
    return files


class CertificateRenewer:
    """Renews the worker's certificate at two thirds of its life, over mutual TLS with the one it holds, at
    any of `addresses` (the internal gateway); on success writes the new key and certificate and calls
    `on_renewed`. A failed renewal is tried again, sooner as expiry nears, until the certificate expires:
    the worker then cannot reach the drivers, and the dead-worker detector takes its instance back."""

    def __init__(self, files: TlsFiles, addresses: tuple[str, ...], on_renewed: Callable[[], None],
                 timeout_s: float = 30.0, instance_name: str = ""):
        self._files = files
        self._addresses = addresses
        self._on_renewed = on_renewed
        self._timeout_s = timeout_s
        self._name = instance_name
        self.renewals = 0
        """Certificates renewed so far."""

    async def run(self) -> None:
        while True:
            chain = self._files.cert.read_bytes()
            now = datetime.datetime.now(datetime.timezone.utc)
            wait_s = (renew_time(self._files) - now).total_seconds()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            if await self.renew_once():
                continue
            left_s = (not_after(chain) - datetime.datetime.now(datetime.timezone.utc)).total_seconds()
            # Spread the retries out, more often as expiry comes closer (never more than once a second).
            await asyncio.sleep(max(1.0, min(300.0, left_s / 10)) * random.uniform(0.8, 1.2))

    async def renew_once(self) -> bool:
        """Ask each address for a new certificate until one gives it; whether one did."""
        key_pem, csr_pem = certificate_request(self._name or self._files.cert.stem.removeprefix("worker-"))
        for address in self._addresses:
            try:
                async with grpc.aio.secure_channel(address, self._files.channel_credentials()) as channel:
                    stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
                    response = await stub.Renew(pb.RenewRequest(csr_pem=csr_pem.decode()), timeout=self._timeout_s)
            except grpc.aio.AioRpcError as e:
                log.warning("renewing the certificate at %s: %s %s", address, e.code().name, e.details())
                continue
            _store(self._files, key_pem, response.certificate_chain_pem.encode())
            self.renewals += 1
            log.info("renewed the certificate; valid until %s",
                     response.not_after.ToDatetime(datetime.timezone.utc).isoformat())
            self._on_renewed()
            return True
        return False
