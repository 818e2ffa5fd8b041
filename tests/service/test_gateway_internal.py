"""The internal gateway, live: the real Envoy on its generated config in front of two real drivers (one
leads, one stands by), reached with workers' certificates.

- a client without a certificate, one with a certificate from another CA, and
  one with a service's (not a worker's) certificate are refused at the gateway;
- a worker's certificate from the deployment's worker issuer is served, and the
  driver sees the worker (not the gateway) as its caller;
- every call reaches the leader only; when the leader gives up its lease, the
  gateway moves to the new one by health alone (the time it took is printed).
"""

from __future__ import annotations

import asyncio
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import driver_service_pb2_grpc, worker_enrollment_service_pb2_grpc
from corral.driver.v1 import worker_enrollment_service_pb2 as epb
from services.common.tls import DevCertificateAuthority, TlsFiles, WorkerIssuer, certificate_request
from services.db.database import DatabaseConfig
from services.driver.app import DriverApp, DriverConfig, start
from services.driver.leader import LeaseSettings
from services.gateway.deployment import Limits
from tests.conftest import service_url
from tests.envoy_gateway import gateway_deployment, running

pytestmark = pytest.mark.timeout(180)


async def eventually(predicate, timeout_s: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


@pytest.fixture
async def drivers(db_config: DatabaseConfig, certs: DevCertificateAuthority,
                  tmp_path: Path) -> AsyncIterator[list[DriverApp]]:
    """Two drivers; the first leads. A lease far longer than the test: the standby takes over only when
    the leader gives the lease up."""
    def config(name: str) -> DriverConfig:
        return DriverConfig(service_url(db_config, "driver"), certs.directory, f"file://{tmp_path / 'blobs'}",
                            tmp_path / name, name=name, lease=LeaseSettings(lease_s=600.0, renew_s=0.2))

    started = [await start(config("a"))]
    try:
        await eventually(lambda: started[0].election.is_leader)
        started.append(await start(config("b")))
        await eventually(lambda: started[1].election.state.leader == f"localhost:{started[0].port}")
        yield started
    finally:
        for driver in reversed(started):
            await driver.stop()


def credentials(ca: Path, client: TlsFiles | None) -> grpc.ChannelCredentials:
    if client is None:
        return grpc.ssl_channel_credentials(ca.read_bytes())
    return grpc.ssl_channel_credentials(ca.read_bytes(), client.key.read_bytes(), client.cert.read_bytes())


async def get_leader(port: int, creds: grpc.ChannelCredentials) -> pb.GetLeaderResponse:
    async with grpc.aio.secure_channel(f"localhost:{port}", creds) as channel:
        stub = driver_service_pb2_grpc.DriverServiceStub(channel)
        return await stub.GetLeader(pb.GetLeaderRequest(), timeout=10)


async def test_only_workers_of_the_deployment_get_in_and_reach_the_leader(
        drivers: list[DriverApp], certs: DevCertificateAuthority, tmp_path: Path) -> None:
    leader, standby = drivers
    deployment = gateway_deployment(tmp_path / "gateway", certs, 1, [1], [d.port for d in drivers])
    worker = WorkerIssuer(certs.directory).provision_worker("w1", tmp_path / "w1")
    stranger = DevCertificateAuthority(tmp_path / "other-ca").issue("worker-w1")
    async with running(deployment, tmp_path / "gateway", "internal", healthy=("driver",)) as (envoy, port):
        # The standby says NOT_SERVING: only the leader is a healthy host.
        assert (await asyncio.to_thread(envoy.healthy_hosts, "driver")) == [f"127.0.0.1:{leader.port}"]

        for who, client in (("no certificate", None), ("another CA's worker", stranger),
                            ("the deployment's frontend (not a worker)", certs.issue("frontend"))):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await get_leader(port, credentials(certs.ca_cert_path, client))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, who  # the TLS handshake fails

        worker_creds = credentials(worker.ca_cert, worker)
        first_epoch = (await get_leader(port, worker_creds)).epoch
        for _ in range(10):  # every call goes to the leader, never to the standby
            answer = await get_leader(port, worker_creds)
            # Through the gateway, no driver's own address is given: a worker would call it around the gateway.
            assert answer.is_leader and answer.epoch == first_epoch and answer.leader_address == ""
        direct = await get_leader(leader.port, worker_creds)
        assert direct.leader_address == f"localhost:{leader.port}" and direct.epoch == first_epoch

        # The leader gives up its lease: the standby takes over, says SERVING, and the gateway follows
        # health alone; the worker's address (the gateway's) never changes.
        stepped_down = time.monotonic()
        await leader.stop()
        answer = pb.GetLeaderResponse()
        while not (answer.is_leader and answer.epoch > first_epoch):
            assert time.monotonic() - stepped_down < 60, "the gateway never reached the new leader"
            try:
                answer = await get_leader(port, worker_creds)
            except grpc.aio.AioRpcError as e:  # no healthy driver for a moment: what a worker retries
                assert e.code() == grpc.StatusCode.UNAVAILABLE, e
                await asyncio.sleep(0.05)
        moved_s = time.monotonic() - stepped_down
        assert answer.leader_address == ""
        # And the old leader, gone, is out within two failed checks.
        for _ in range(200):
            if await asyncio.to_thread(envoy.healthy_hosts, "driver") == [f"127.0.0.1:{standby.port}"]:
                break
            await asyncio.sleep(0.05)
        assert await asyncio.to_thread(envoy.healthy_hosts, "driver") == [f"127.0.0.1:{standby.port}"]
        print(f"the internal gateway reached the new leader {moved_s:.2f} s after the old one stepped down "
              f"(health checked every {deployment.limits.health_check_interval_s:g} s)")


async def test_only_the_gateway_may_forward_a_certificate(drivers: list[DriverApp], certs: DevCertificateAuthority,
                                                          tmp_path: Path) -> None:
    """Straight to the leader: the gateway's own certificate without a forwarded worker's is nobody, and a
    forwarded certificate is ignored on any other caller's connection."""
    leader = drivers[0]
    worker = WorkerIssuer(certs.directory).provision_worker("w2", tmp_path / "w2")
    forwarded = f'By=x;Cert="{urllib.parse.quote(worker.cert.read_text(), safe="")}";URI=spiffe://corral/worker/w2'

    async def activate(client: TlsFiles, metadata: tuple[tuple[str, str], ...] = ()) -> tuple[grpc.StatusCode, str]:
        """ActivateWorker for instance 'w3' (nobody's): the refusal names who the driver took the caller for."""
        async with grpc.aio.secure_channel(f"localhost:{leader.port}",
                                           credentials(certs.ca_cert_path, client)) as channel:
            stub = driver_service_pb2_grpc.DriverServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.ActivateWorker(pb.ActivateWorkerRequest(instance_name="w3"), metadata=metadata, timeout=10)
        return refused.value.code(), refused.value.details() or ""

    code, _ = await activate(certs.issue("gateway"))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # A frontend that sends a worker's certificate in the header is still the frontend.
    code, why = await activate(certs.issue("frontend"), (("x-forwarded-client-cert", forwarded),))
    assert code == grpc.StatusCode.PERMISSION_DENIED and why.startswith("frontend may not call"), why
    # The gateway forwards workers only: a (public) service certificate in the header is nobody.
    frontend_cert = urllib.parse.quote(certs.issue("frontend").cert.read_text(), safe="")
    code, why = await activate(certs.issue("gateway"), (("x-forwarded-client-cert", f'Cert="{frontend_cert}"'),))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "workers only" in why, why
    # The gateway forwarding the worker's certificate: the call is the worker's.
    code, why = await activate(certs.issue("gateway"), (("x-forwarded-client-cert", forwarded),))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "worker-w2 may not act for instance 'w3'" in why, why


async def test_the_enrollment_listener_forwards_at_most_its_rate_and_refuses_the_rest_at_once(
        drivers: list[DriverApp], certs: DevCertificateAuthority, tmp_path: Path) -> None:
    """Anyone who reaches the enrollment listener may call Enroll: past its burst, calls are refused by the
    gateway (UNAVAILABLE, which a worker retries after a back-off) without reaching the driver."""
    limits = Limits(health_check_interval_s=0.2, enroll_burst=3, enroll_per_second=1)
    deployment = gateway_deployment(tmp_path / "gateway", certs, 1, [1], [d.port for d in drivers], limits,
                                    enroll=True)
    _, csr = certificate_request("i1")
    request = epb.EnrollRequest(instance_name="i1", activation_token="not-a-token", csr_pem=csr.decode())
    async with running(deployment, tmp_path / "gateway", "internal", healthy=("driver",)) as (envoy, _):
        port = (await asyncio.to_thread(envoy.listener_ports))["enroll"]
        async with grpc.aio.secure_channel(f"localhost:{port}", credentials(certs.ca_cert_path, None)) as channel:
            stub = worker_enrollment_service_pb2_grpc.WorkerEnrollmentServiceStub(channel)

            async def enroll() -> grpc.StatusCode:
                try:
                    await stub.Enroll(request, timeout=10)
                except grpc.aio.AioRpcError as e:
                    return e.code()
                raise AssertionError("a made-up token enrolled")

            codes = [await enroll() for _ in range(10)]
            # The burst reaches the driver, which refuses the token; the rest never leave the gateway.
            assert codes.count(grpc.StatusCode.PERMISSION_DENIED) in (3, 4), codes  # 4: a token refilled
            assert codes.count(grpc.StatusCode.UNAVAILABLE) == 10 - codes.count(grpc.StatusCode.PERMISSION_DENIED)
            await asyncio.sleep(1.5)
            assert await enroll() == grpc.StatusCode.PERMISSION_DENIED  # refilled
