"""Every internal method × every identity, against real servers on loopback.

The table is generated from the service descriptors: each method's
`allowed_callers` option says which roles may call it, and every other role
must be refused by the interceptor before the servicer runs. A worker's
certificate is signed by the drivers' worker issuer, as the local provider
makes it; a "frontend" certificate signed by that issuer (what a driver could
mint) is refused everywhere. Internal methods are refused on public
listeners to every bearer token, the administrator's included.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from google.protobuf import descriptor, message_factory

from corral.auth.v1 import auth_service_pb2, auth_service_pb2_grpc
from corral.driver.v1 import driver_service_pb2, worker_session_pb2
from corral.driver.v1 import worker_enrollment_service_pb2
from corral.worker.v1 import worker_service_pb2
from services.auth.app import AuthApp
from services.common.authz import allowed_callers
from services.common.tls import (
    DevCertificateAuthority,
    TlsFiles,
    WorkerIssuer,
    _key_pem,
    _leaf,
    _pem,
)
from services.db.database import DatabaseConfig
from services.driver.app import DriverApp, DriverConfig
from services.driver.app import start as start_driver
from services.worker.app import WorkerApp
from services.worker.app import start as start_worker
from services.worker.config import WorkerConfig
from tests.conftest import service_url
from tests.service.conftest import bearer, person_channel
from tests.service.test_driver_app import eventually

pytestmark = pytest.mark.timeout(120)

ROLES = ("auth", "frontend", "driver", "worker")
POLICY_REFUSAL = "may not call"
INSTANCE = "w-authz"


def forged_frontend(issuer_dir: Path, destination: Path) -> TlsFiles:
    """A certificate naming the frontend, signed by the worker issuer a driver holds."""
    issuer = TlsFiles.of(issuer_dir, "worker-issuer")
    issuer_cert = x509.load_pem_x509_certificate(issuer.cert.read_bytes())
    issuer_key = serialization.load_pem_private_key(issuer.key.read_bytes(), password=None)
    assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf("frontend", ("localhost",), key.public_key(), issuer_cert, issuer_key, datetime.timedelta(days=1))
    destination.mkdir(parents=True)
    files = TlsFiles(issuer.ca_cert, destination / "frontend.pem", destination / "frontend.key")
    files.cert.write_bytes(_pem(cert) + _pem(issuer_cert))
    files.key.write_bytes(_key_pem(key))
    return files


def request_for(method: descriptor.MethodDescriptor) -> Any:
    """The simplest request of `method`, speaking for the test's worker instance where it names one."""
    request = message_factory.GetMessageClass(method.input_type)()
    if "instance_name" in method.input_type.fields_by_name:
        request.instance_name = INSTANCE
    return request


# grpcio's asyncio client reports INTERNAL "Internal error from Core" instead of the server's status when the
# server ends a stream (a refusal, say) as the client writes its first message (grpc/grpc#36066): a call that
# ends so says nothing about the server, and is made again.
CLIENT_WRITE_RACE = "Internal error from Core"


async def call(channel: grpc.aio.Channel, service: descriptor.ServiceDescriptor, method: descriptor.MethodDescriptor
               ) -> grpc.aio.AioRpcError | None:
    """Call `method` with its simplest request; the error, or None if it succeeded."""
    for _ in range(5):
        error = await call_once(channel, service, method)
        if not (error is not None and method.client_streaming and error.code() == grpc.StatusCode.INTERNAL
                and error.details() == CLIENT_WRITE_RACE):
            return error
    return error


async def call_once(channel: grpc.aio.Channel, service: descriptor.ServiceDescriptor,
                    method: descriptor.MethodDescriptor) -> grpc.aio.AioRpcError | None:
    path = f"/{service.full_name}/{method.name}"
    request_class = message_factory.GetMessageClass(method.input_type)
    response_class = message_factory.GetMessageClass(method.output_type)
    kwargs = dict(request_serializer=request_class.SerializeToString, response_deserializer=response_class.FromString)
    try:
        if method.client_streaming and method.server_streaming:
            hello = worker_session_pb2.Hello(instance_name=INSTANCE, instance_token="wrong")
            stream = channel.stream_stream(path, **kwargs)(
                iter([driver_service_pb2.WorkerSessionRequest(hello=hello)]), timeout=10)
            async for _ in stream:
                pass
        elif method.server_streaming:
            async for _ in channel.unary_stream(path, **kwargs)(request_for(method), timeout=10):
                pass
        else:
            await channel.unary_unary(path, **kwargs)(request_for(method), timeout=10)
    except grpc.aio.AioRpcError as error:
        return error
    return None


@pytest.fixture
async def servers(auth_app: AuthApp, db_config: DatabaseConfig, certs: DevCertificateAuthority,
                  tmp_path: Path) -> AsyncIterator[tuple[DriverApp, WorkerApp]]:
    driver = await start_driver(DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                                             tmp_path / "driver", autoscaler_period_s=3600))
    worker_certs = WorkerIssuer(certs.directory).provision_worker(INSTANCE, tmp_path / "worker-certs")
    worker = await start_worker(WorkerConfig(
        INSTANCE, "wrong-token", 1000, (f"localhost:{driver.port}",), worker_certs.key.parent, tmp_path / "worker",
        f"file://{tmp_path / 'blobs'}", rpc_timeout_s=1, reconnect_max_backoff_s=0.2, deactivate_timeout_s=1))
    try:
        await eventually(lambda: driver.election.is_leader)
        yield driver, worker
    finally:
        await worker.stop()
        await driver.stop()


def identities(certs: DevCertificateAuthority, tmp_path: Path) -> dict[str, TlsFiles]:
    files = {role: certs.issue(role) for role in ("auth", "frontend", "driver")}
    files["worker"] = WorkerIssuer(certs.directory).provision_worker(INSTANCE, tmp_path / "caller-worker")
    return files


async def test_every_internal_method_by_every_identity(servers: tuple[DriverApp, WorkerApp], auth_app: AuthApp,
                                                       certs: DevCertificateAuthority, tmp_path: Path) -> None:
    driver, worker = servers
    listeners = [
        (auth_service_pb2.DESCRIPTOR.services_by_name["AuthService"], auth_app.internal_port),
        (driver_service_pb2.DESCRIPTOR.services_by_name["DriverService"], driver.port),
        (worker_enrollment_service_pb2.DESCRIPTOR.services_by_name["WorkerEnrollmentService"], driver.port),
        (worker_service_pb2.DESCRIPTOR.services_by_name["WorkerService"], int(worker.address.rsplit(":", 1)[1])),
    ]
    callers = identities(certs, tmp_path)
    forged = forged_frontend(certs.directory, tmp_path / "forged")
    checked = 0
    for service, port in listeners:
        for method in service.methods:
            allowed = allowed_callers(f"/{service.full_name}/{method.name}")
            for role in ROLES:
                async with grpc.aio.secure_channel(f"localhost:{port}", callers[role].channel_credentials()) as ch:
                    error = await call(ch, service, method)
                refused = (error is not None and error.code() == grpc.StatusCode.PERMISSION_DENIED
                           and POLICY_REFUSAL in (error.details() or ""))
                assert refused == (role not in allowed), (
                    f"{service.name}.{method.name} as {role}: {error and (error.code(), error.details())}")
                checked += 1
            async with grpc.aio.secure_channel(f"localhost:{port}", forged.channel_credentials()) as ch:
                error = await call(ch, service, method)
            assert error is not None and error.code() == grpc.StatusCode.UNAUTHENTICATED, (
                f"{service.name}.{method.name} with a forged frontend: {error and error.code()}")
    assert checked == len(ROLES) * sum(len(s.methods) for s, _ in listeners)
    # The policy is not vacuous: each role may call something, and most calls are refused. (The gateway,
    # forwarding no worker's certificate, and a caller on a driver's enrollment listener may call Enroll
    # alone: tests/service/test_enrollment.py.)
    assert {role for s, _ in listeners for m in s.methods
            for role in allowed_callers(f"/{s.full_name}/{m.name}")} == {"frontend", "worker", "gateway", "enrollee"}


async def test_a_worker_speaks_only_for_its_own_instance(servers: tuple[DriverApp, WorkerApp],
                                                         certs: DevCertificateAuthority, tmp_path: Path) -> None:
    driver, _ = servers
    other = WorkerIssuer(certs.directory).provision_worker("someone-else", tmp_path / "other")
    async with grpc.aio.secure_channel(f"localhost:{driver.port}", other.channel_credentials()) as channel:
        service = driver_service_pb2.DESCRIPTOR.services_by_name["DriverService"]
        for name in ("ActivateWorker", "DeactivateWorker", "WorkerSession"):
            error = await call(channel, service, service.methods_by_name[name])
            assert error is not None and error.code() == grpc.StatusCode.PERMISSION_DENIED
            assert f"may not act for instance '{INSTANCE}'" in (error.details() or ""), name


async def test_internal_methods_are_refused_on_public_listeners(auth_app: AuthApp, certs: DevCertificateAuthority,
                                                                admin_token: str) -> None:
    async with person_channel(certs.issue("frontend"), auth_app.public_port) as channel:
        stub = auth_service_pb2_grpc.AuthServiceStub(channel)
        for metadata in ((), bearer("garbage"), bearer(admin_token)):
            with pytest.raises(grpc.aio.AioRpcError) as error:
                await stub.VerifyToken(auth_service_pb2.VerifyTokenRequest(token=admin_token), metadata=metadata)
            assert error.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "internal" in (error.value.details() or "")
