"""Worker bootstrap over real gRPC (issue 16): a new machine's one-time activation token and a signing
request for its own key are exchanged, once, for a short-lived certificate bound to its instance name.

The driver serves WorkerEnrollmentService as `services.driver.app` does: on its mutual-TLS listener (where
the internal gateway, forwarding no worker certificate, may call Enroll alone) and on an enrollment listener
of its own (TLS, no client certificate, that service alone), with the real worker issuer and the real
procedures; the store's clock is the test's, so a token's expiry is reached without waiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, worker_enrollment_service_pb2_grpc
from corral.driver.v1 import worker_enrollment_service_pb2 as epb
from corral.driver.v1 import worker_session_pb2 as ws
from services.common.server import Listener, Service, serve
from services.common.tls import DevCertificateAuthority, TlsFiles, WorkerIssuer, certificate_request
from services.driver.enrollment import (
    ENROLL_METHOD,
    REFUSED,
    SERVICE_NAME,
    EnrollmentServicer,
    EnrollmentSettings,
    enrollee,
)
from services.driver.servicer import DriverServicer
from services.driver.sessions import SessionRegistry
from services.common.specs import SpecStore
from tests.world import World

pytestmark = pytest.mark.timeout(120)

SETTINGS = EnrollmentSettings(token_ttl_s=900.0, certificate_validity_s=3600.0)


@dataclasses.dataclass
class Driver:
    internal_port: int
    """Mutual TLS: workers (Renew, ActivateWorker, WorkerSession) and the gateway (Enroll)."""
    enroll_port: int
    """TLS without client certificates: WorkerEnrollmentService alone."""


@pytest.fixture
async def driver(world: World, certs: DevCertificateAuthority, tmp_path: Path) -> AsyncIterator[Driver]:
    registry = SessionRegistry(world.store, SpecStore(f"file://{tmp_path / 'blobs'}"), world.clock)
    servicer = DriverServicer(world.store, registry, lambda: world.epoch, lambda: "driver-0:1",
                              lambda kind: None)
    enrollment = Service(SERVICE_NAME, EnrollmentServicer(world.store, WorkerIssuer(certs.directory), SETTINGS),
                         worker_enrollment_service_pb2_grpc.add_WorkerEnrollmentServiceServicer_to_server)
    tls = certs.issue("driver")
    internal = await serve([Service("corral.driver.v1.DriverService", servicer,
                                    driver_service_pb2_grpc.add_DriverServiceServicer_to_server), enrollment],
                           [Listener.mutual_tls("127.0.0.1:0", tls, frozenset({ENROLL_METHOD}))])
    own = await serve([enrollment], [Listener("127.0.0.1:0", tls, enrollee, internal=True, require_client_cert=False)])
    try:
        yield Driver(internal.ports[0], own.ports[0])
    finally:
        await own.stop(0)
        await internal.stop(0)


def anonymous(certs: DevCertificateAuthority, port: int) -> grpc.aio.Channel:
    """What a new machine opens: TLS trusting the deployment CA, no certificate of its own."""
    return grpc.aio.secure_channel(f"localhost:{port}", grpc.ssl_channel_credentials(certs.ca_cert_path.read_bytes()))


def mutual(files: TlsFiles, port: int) -> grpc.aio.Channel:
    return grpc.aio.secure_channel(f"localhost:{port}", files.channel_credentials())


async def enroll(channel: grpc.aio.Channel, name: str, token: str, csr: bytes) -> epb.EnrollResponse:
    stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
    return await stub.Enroll(epb.EnrollRequest(instance_name=name, activation_token=token, csr_pem=csr.decode()),
                             timeout=10)


async def refused(call: asyncio.Future | object) -> grpc.aio.AioRpcError:  # type: ignore[type-arg]
    with pytest.raises(grpc.aio.AioRpcError) as error:
        await call  # type: ignore[misc]
    return error.value


def keep(directory: Path, certs: DevCertificateAuthority, name: str, key: bytes, chain: str) -> TlsFiles:
    """The worker's certificate directory, as the worker writes it."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(directory / "ca.pem", directory / f"worker-{name}.pem", directory / f"worker-{name}.key")
    files.ca_cert.write_bytes(certs.ca_cert_path.read_bytes())
    files.key.write_bytes(key)
    files.cert.write_text(chain)
    return files


def uris(chain: str) -> list[str]:
    cert = x509.load_pem_x509_certificate(chain.encode())
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.UniformResourceIdentifier)


async def test_a_token_enrolls_once_and_the_certificate_opens_a_session(
        world: World, driver: Driver, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
    key, csr = certificate_request("i1")
    async with anonymous(certs, driver.enroll_port) as channel:
        enrolled = await enroll(channel, "i1", "token-of-i1", csr)
        # The same token again, a moment later: refused, as any bad token is.
        world.clock.advance(1)
        again = await refused(enroll(channel, "i1", "token-of-i1", certificate_request("i1")[1]))
    assert again.code() == grpc.StatusCode.PERMISSION_DENIED and again.details() == REFUSED
    assert uris(enrolled.certificate_chain_pem) == ["spiffe://corral/worker/i1"]
    cert = x509.load_pem_x509_certificate(enrolled.certificate_chain_pem.encode())
    life = cert.not_valid_after_utc - datetime.datetime.now(datetime.timezone.utc)
    assert datetime.timedelta(minutes=55) < life <= datetime.timedelta(hours=1)  # short-lived, as configured
    assert enrolled.not_after.ToDatetime(datetime.timezone.utc) == cert.not_valid_after_utc
    assert cert.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo) \
        == serialization.load_pem_private_key(key, None).public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    files = keep(tmp_path / "w", certs, "i1", key, enrolled.certificate_chain_pem)
    async with mutual(files, driver.internal_port) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        activated = await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1",
                                                                       activation_token="token-of-i1"), timeout=10)
        call = stub.WorkerSession()
        await call.write(pb.WorkerSessionRequest(hello=ws.Hello(instance_name="i1",
                                                                instance_token=activated.instance_token)))
        first = await asyncio.wait_for(call.read(), 10)
        assert first.WhichOneof("payload") == "welcome" and first.welcome.epoch == world.epoch
        await call.done_writing()
        # The certificate speaks for i1 alone.
        other = await refused(stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i2"), timeout=10))
        assert other.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_concurrent_calls_with_one_token_enroll_exactly_once(
        world: World, driver: Driver, certs: DevCertificateAuthority) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
    async with anonymous(certs, driver.enroll_port) as channel:
        results = await asyncio.gather(*(enroll(channel, "i1", "token-of-i1", certificate_request("i1")[1])
                                         for _ in range(10)), return_exceptions=True)
    assert sum(isinstance(r, epb.EnrollResponse) for r in results) == 1
    assert all(r.code() == grpc.StatusCode.PERMISSION_DENIED for r in results if isinstance(r, grpc.aio.AioRpcError))


async def test_expired_foreign_and_revoked_tokens_are_refused_alike(
        world: World, driver: Driver, certs: DevCertificateAuthority) -> None:
    for name in ("a", "b", "late", "gone"):
        await world.store.create_instance(world.epoch, name, "standard", 2000, f"token-of-{name}")
    async with anonymous(certs, driver.enroll_port) as channel:
        csr = certificate_request("x")[1]
        answers = {
            "a's token for b": await refused(enroll(channel, "b", "token-of-a", csr)),
            "a wrong token": await refused(enroll(channel, "a", "token-of-x", csr)),
            "a token in other case": await refused(enroll(channel, "a", "TOKEN-OF-A", csr)),
            "no such instance": await refused(enroll(channel, "nobody", "token-of-a", csr)),
        }
        await world.store.deactivate_instance(world.epoch, "gone", "deleted by the autoscaler")
        answers["a deactivated instance's"] = await refused(enroll(channel, "gone", "token-of-gone", csr))
        world.clock.advance(int(SETTINGS.token_ttl_s * 1000) + 1)
        answers["an expired one"] = await refused(enroll(channel, "late", "token-of-late", csr))
        # None of them used up a's or b's token, but they too have expired now.
        answers["a's own, now expired"] = await refused(enroll(channel, "a", "token-of-a", csr))
        world.clock.advance(-int(SETTINGS.token_ttl_s * 1000))
        assert (await enroll(channel, "a", "token-of-a", csr)).certificate_chain_pem
        assert (await enroll(channel, "b", "token-of-b", csr)).certificate_chain_pem
    for why, error in answers.items():
        assert (error.code(), error.details()) == (grpc.StatusCode.PERMISSION_DENIED, REFUSED), why


def _request(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, name: str = "whatever") -> bytes:
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


async def test_bad_requests_are_invalid_and_do_not_use_the_token_up(
        world: World, driver: Driver, certs: DevCertificateAuthority) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
    good = certificate_request("i1")[1]
    p384 = _request(ec.generate_private_key(ec.SECP384R1()))
    small_rsa = _request(rsa.generate_private_key(public_exponent=65537, key_size=1024))
    # A request whose signature is not its key's: the key of one request, the signature of another.
    other = x509.load_pem_x509_csr(certificate_request("i1")[1])
    forged = good.replace(good.split(b"\n")[3], other.public_bytes(serialization.Encoding.PEM).split(b"\n")[3])
    cases = {
        "garbage": ("i1", "token-of-i1", b"not a request"),
        "oversized": ("i1", "token-of-i1", b"-----BEGIN CERTIFICATE REQUEST-----\n" + b"A" * 20_000),
        "a P-384 key": ("i1", "token-of-i1", p384),
        "a 1024-bit RSA key": ("i1", "token-of-i1", small_rsa),
        "a forged signature": ("i1", "token-of-i1", forged),
        "a name that is no instance's": ("i1/../x", "token-of-i1", good),
        "a name too long": ("i" * 101, "token-of-i1", good),
        "a token too long": ("i1", "t" * 101, good),
        "an empty token": ("i1", "", good),
    }
    async with anonymous(certs, driver.enroll_port) as channel:
        for why, (name, token, csr) in cases.items():
            error = await refused(enroll(channel, name, token, csr))
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (why, error.details())
        # RSA of 2048 bits is fine, whatever the subject says: the certificate names the token's instance.
        rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        enrolled = await enroll(channel, "i1", "token-of-i1", _request(rsa_key, "worker-someone-else"))
    cert = x509.load_pem_x509_certificate(enrolled.certificate_chain_pem.encode())
    assert uris(enrolled.certificate_chain_pem) == ["spiffe://corral/worker/i1"]
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "worker-i1"


async def test_renewal_needs_the_workers_certificate_and_a_live_instance(
        world: World, driver: Driver, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
    key, csr = certificate_request("i1")
    async with anonymous(certs, driver.enroll_port) as channel:
        enrolled = await enroll(channel, "i1", "token-of-i1", csr)
        # Without a certificate: the enrollment listener serves Renew to nobody.
        stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
        error = await refused(stub.Renew(epb.RenewRequest(csr_pem=csr.decode()), timeout=10))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    # Nor does the mutual-TLS listener take a caller without one (the handshake fails).
    async with anonymous(certs, driver.internal_port) as channel:
        stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
        error = await refused(stub.Renew(epb.RenewRequest(csr_pem=csr.decode()), timeout=10))
        assert error.code() == grpc.StatusCode.UNAVAILABLE

    files = keep(tmp_path / "w", certs, "i1", key, enrolled.certificate_chain_pem)
    new_key, new_csr = certificate_request("i1")
    async with mutual(files, driver.internal_port) as channel:
        stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
        renewed = await stub.Renew(epb.RenewRequest(csr_pem=new_csr.decode()), timeout=10)
        # A worker may not Enroll with its certificate (only the gateway forwards enrollments).
        error = await refused(enroll(channel, "i1", "token-of-i1", new_csr))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    old, new = (x509.load_pem_x509_certificate(c.encode())
                for c in (enrolled.certificate_chain_pem, renewed.certificate_chain_pem))
    assert uris(renewed.certificate_chain_pem) == ["spiffe://corral/worker/i1"]
    assert new.serial_number != old.serial_number and new.not_valid_after_utc >= old.not_valid_after_utc
    # The renewed certificate (on the new key) works in turn.
    files = keep(tmp_path / "w", certs, "i1", new_key, renewed.certificate_chain_pem)
    async with mutual(files, driver.internal_port) as channel:
        stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)
        assert (await stub.Renew(epb.RenewRequest(csr_pem=certificate_request("i1")[1].decode()), timeout=10)
                ).certificate_chain_pem
        await world.store.deactivate_instance(world.epoch, "i1", "gone")
        error = await refused(stub.Renew(epb.RenewRequest(csr_pem=new_csr.decode()), timeout=10))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED and "no longer live" in (error.details() or "")


async def test_the_gateway_may_enroll_on_its_own_and_nothing_else(
        world: World, driver: Driver, certs: DevCertificateAuthority) -> None:
    """The internal gateway's enrollment listener forwards Enroll under the gateway's own certificate, with no
    worker's: the driver serves it that one method."""
    await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
    async with mutual(certs.issue("gateway"), driver.internal_port) as channel:
        assert (await enroll(channel, "i1", "token-of-i1", certificate_request("i1")[1])).certificate_chain_pem
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        error = await refused(stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="i1"), timeout=10))
        assert error.code() == grpc.StatusCode.UNAUTHENTICATED
        renew = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel).Renew(
            epb.RenewRequest(csr_pem=certificate_request("i1")[1].decode()), timeout=10)
        assert (await refused(renew)).code() == grpc.StatusCode.UNAUTHENTICATED
    # Any other service's certificate is refused Enroll.
    async with mutual(certs.issue("frontend"), driver.internal_port) as channel:
        error = await refused(enroll(channel, "i1", "token-of-i1", certificate_request("i1")[1]))
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_a_worker_renews_its_certificate_before_it_expires(
        world: World, certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """The worker's renewer, against a driver whose certificates last 6 s: each renewed at two thirds of its
    life (4 s after it came), on a new key each time, over mutual TLS with the certificate it replaces."""
    from services.worker.certificates import CertificateRenewer, worker_files

    short = EnrollmentSettings(certificate_validity_s=6.0)
    servicer = EnrollmentServicer(world.store, WorkerIssuer(certs.directory), short)
    servers = await serve([Service(SERVICE_NAME, servicer,
                                   worker_enrollment_service_pb2_grpc.add_WorkerEnrollmentServiceServicer_to_server)],
                          [Listener.mutual_tls("127.0.0.1:0", certs.issue("driver"))])
    try:
        await world.store.create_instance(world.epoch, "i1", "standard", 2000, "token-of-i1")
        key, csr = certificate_request("i1")
        chain = (await servicer.Enroll(epb.EnrollRequest(instance_name="i1", activation_token="token-of-i1",
                                                         csr_pem=csr.decode()), None)).certificate_chain_pem  # type: ignore[arg-type]
        files = keep(tmp_path / "w", certs, "i1", key, chain)
        assert files == worker_files(tmp_path / "w", "i1")
        seen: list[tuple[bytes, bytes]] = []
        times = [time.monotonic()]
        renewer = CertificateRenewer(files, (f"localhost:{servers.ports[0]}",),
                                     lambda: (seen.append((files.key.read_bytes(), files.cert.read_bytes())),
                                              times.append(time.monotonic())),
                                     instance_name="i1")
        task = asyncio.create_task(renewer.run())
        try:
            deadline = asyncio.get_running_loop().time() + 30
            while len(seen) < 2:
                assert asyncio.get_running_loop().time() < deadline, "not renewed twice in time"
                assert not task.done(), task
                await asyncio.sleep(0.05)
        finally:
            task.cancel()
        (key1, cert1), (key2, cert2) = seen[:2]
        assert len({key, key1, key2}) == 3 and len({chain.encode(), cert1, cert2}) == 3
        assert all(uris(c.decode()) == ["spiffe://corral/worker/i1"] for c in (cert1, cert2))
        # Each waited for about two thirds of its predecessor's 6 s (4 s), counted from when that one was
        # stored: the first a little before times[0], so its gap may be shorter. Not half the life, and not
        # long after the predecessor expired.
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert all(3.0 < gap < 10.0 for gap in gaps[:2]), gaps
        assert oct(files.key.stat().st_mode & 0o777) == "0o600"
    finally:
        await servers.stop(0)
