"""The clients retry a transient UNAVAILABLE by gRPC's retry policy, and only for the methods the protos mark
safe to repeat: against a real TLS server on loopback that refuses the first calls of each method."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

import corral.aio
from corral import Client, Unavailable
from corral.auth.v1 import auth_service_pb2_grpc, user_pb2
from corral.batch.v1 import batch_pb2, batch_service_pb2, batch_service_pb2_grpc
from corral.retries import MAX_ATTEMPTS, repeatable_methods
from services.common.tls import DevCertificateAuthority, TlsFiles


class Flaky:
    """Each method answers UNAVAILABLE to its first `failures` calls, then serves."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    def call(self, method: str, context: grpc.ServicerContext) -> bool:
        with self._lock:
            self.calls[method] += 1
            failing = self.calls[method] <= self.failures
        if failing:
            context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")
        return True


class Batches(batch_service_pb2_grpc.BatchServiceServicer):
    def __init__(self, flaky: Flaky):
        self.flaky = flaky

    def GetBatch(self, request, context):  # noqa: N802 (gRPC's name)
        self.flaky.call("GetBatch", context)
        return batch_service_pb2.GetBatchResponse(batch=batch_pb2.Batch(batch_id=request.batch_id))


class Auth(auth_service_pb2_grpc.AuthServiceServicer):
    def __init__(self, flaky: Flaky):
        self.flaky = flaky

    def CreateUser(self, request, context):  # noqa: N802
        self.flaky.call("CreateUser", context)
        return user_pb2.User(username=request.username)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, TlsFiles, Flaky]]:
    certs = DevCertificateAuthority(tmp_path / "certs").issue_services()
    tls = TlsFiles.of(certs.directory, "frontend")
    flaky = Flaky(failures=MAX_ATTEMPTS - 1)
    grpc_server = grpc.server(futures.ThreadPoolExecutor(4))
    batch_service_pb2_grpc.add_BatchServiceServicer_to_server(Batches(flaky), grpc_server)
    auth_service_pb2_grpc.add_AuthServiceServicer_to_server(Auth(flaky), grpc_server)
    port = grpc_server.add_secure_port("localhost:0", tls.server_credentials(require_client_cert=False))
    grpc_server.start()
    try:
        yield f"localhost:{port}", tls, flaky
    finally:
        grpc_server.stop(None)


def test_the_protos_mark_reads_and_token_writes_repeatable_and_logins_not() -> None:
    methods = set(repeatable_methods())
    assert {("corral.batch.v1.BatchService", "GetBatch"), ("corral.batch.v1.BatchService", "CreateBatch"),
            ("corral.batch.v1.JobService", "ListJobs"), ("corral.billing.v1.BillingService", "SetLimit")} <= methods
    assert not {("corral.auth.v1.AuthService", "Login"), ("corral.auth.v1.AuthService", "CreateUser"),
                ("corral.auth.v1.AuthService", "CreateToken")} & methods


def test_the_sync_client_retries_a_read_and_not_a_create(server: tuple[str, TlsFiles, Flaky]) -> None:
    address, tls, flaky = server
    with Client(address, "token", ca_cert=tls.ca_cert, auth_address=address) as client:
        assert client.get_batch(7).batch_id == 7
        assert flaky.calls["GetBatch"] == MAX_ATTEMPTS
        with pytest.raises(Unavailable):
            client.create_user("ann")
        assert flaky.calls["CreateUser"] == 1


async def test_the_async_client_retries_a_read_and_not_a_create(server: tuple[str, TlsFiles, Flaky]) -> None:
    address, tls, flaky = server
    async with corral.aio.Client(address, "token", ca_cert=tls.ca_cert, auth_address=address) as client:
        assert (await client.get_batch(7)).batch_id == 7
        assert flaky.calls["GetBatch"] == MAX_ATTEMPTS
        with pytest.raises(Unavailable):
            await client.create_user("ann")
        assert flaky.calls["CreateUser"] == 1


def test_a_read_that_stays_unavailable_fails_after_the_last_attempt(server: tuple[str, TlsFiles, Flaky]) -> None:
    address, tls, flaky = server
    flaky.failures = MAX_ATTEMPTS
    with Client(address, "token", ca_cert=tls.ca_cert) as client:
        with pytest.raises(Unavailable):
            client.get_batch(7)
    assert flaky.calls["GetBatch"] == MAX_ATTEMPTS
