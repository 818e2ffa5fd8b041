"""What a job reaches in each network mode, tried from inside real
containers (acceptance 2, and the Networks paragraph of issue 13).

The stand-in for the world outside the host (`Outside`): a network
namespace of the test's, joined to the host by a veth pair, host side
198.51.100.1/24 (TEST-NET-2, which nothing else on a host uses). The host
reaches it through its ordinary routing, exactly as it reaches the internet
through its default route: the job's packets go container → bridge → the
host's FORWARD chain → out of another interface, NATed. In that namespace
one TCP server listens on every address of it, and greets each connection
with the address it was reached at and the peer it saw:

- 198.51.100.2: "the internet" (no private range);
- 10.197.77.2, routed by the host via 198.51.100.2: "a machine of the
  deployment's private range" (the worker is given 10.197.77.0/24 as its
  private network);
- 169.254.169.254, routed the same way: "the cloud's metadata server".

The host's side of the pair has 10.197.77.1 too: an address of the host
itself inside the private range, which private jobs may reach and public
ones may not.

Before the jobs try them, the test connects to all three from the host
itself: they answer, so a job that cannot reach one is refused by the
worker's rules, not by the stand-in. The host's own servers are one more
TCP server of the test, on 0.0.0.0 (so on 127.0.0.1, the host's own
addresses, the bridges' gateways): no job may reach it by any address.
(This machine's kernel has no dummy interfaces; a namespace stands for
both the internet and the private range.)
"""

from __future__ import annotations

import asyncio
import ipaddress
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.oci.network import PRIVATE, PUBLIC, owner_hash
from tests.oci.host import OciHost, fields, needs_oci, run, spec

pytestmark = [pytest.mark.timeout(90), needs_oci]

INTERNET, PRIVATE_MACHINE, METADATA = "198.51.100.2", "10.197.77.2", "169.254.169.254"
HOST_SIDE, HOST_PRIVATE = "198.51.100.1", "10.197.77.1"
PRIVATE_RANGE = ipaddress.IPv4Network("10.197.77.0/24")

SERVER = r"""
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
while True:
    c, peer = s.accept()
    c.sendall(f"reached-{c.getsockname()[0]}-from-{peer[0]}\n".encode())
    c.close()
"""


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@dataclass
class Outside:
    """The world outside the host, in a namespace of the test's (see the module's docstring)."""

    netns: str
    veth: str
    port: int
    server: subprocess.Popen


@pytest.fixture
async def outside() -> AsyncIterator[Outside]:
    tag = uuid.uuid4().hex[:6]
    netns, veth = f"crlt-out-{tag}", f"crlto-{tag}"
    server = None
    try:
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "addr", "add", f"{HOST_SIDE}/24", "dev", veth)
        sh("ip", "addr", "add", f"{HOST_PRIVATE}/32", "dev", veth)
        sh("ip", "link", "set", veth, "up")
        for address in (f"{INTERNET}/24", f"{PRIVATE_MACHINE}/32", f"{METADATA}/32"):
            sh("ip", "-n", netns, "addr", "add", address, "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        for address in (PRIVATE_MACHINE, METADATA):
            sh("ip", "route", "add", f"{address}/32", "via", INTERNET, "dev", veth)
        server = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-I", "-c", SERVER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        port = int(await asyncio.to_thread(server.stdout.readline))
        yield Outside(netns, veth, port, server)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            assert server.stdout is not None
            server.stdout.close()
        subprocess.run(["ip", "netns", "del", netns], capture_output=True)  # the veth pair and routes go too
        subprocess.run(["ip", "link", "del", veth], capture_output=True)



@pytest.fixture
async def host_server() -> AsyncIterator[tuple[int, list[str]]]:
    """A TCP server of the host on all its addresses: its port, and who connected."""
    peers: list[str] = []

    async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.append(writer.get_extra_info("peername")[0])
        writer.write(b"host\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "0.0.0.0", 0)
    yield server.sockets[0].getsockname()[1], peers
    server.close()
    await server.wait_closed()


def host_addresses() -> list[str]:
    """The host's own IPv4 addresses but loopback's and the stand-in's."""
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    found = [line.split()[3].split("/")[0] for line in out.splitlines()]
    return [a for a in found if not a.startswith("127.") and a not in (HOST_SIDE, HOST_PRIVATE)]


def tries(targets: dict[str, tuple[str, int]]) -> str:
    """A script that tries each target at once (a refused one waits for nc's 3 s), printing NAME=greeting."""
    lines = [f"(echo {name}=$(nc -w 3 {address} {port} </dev/null 2>/dev/null | head -n 1)) &"
             for name, (address, port) in targets.items()]
    return "\n".join(lines + ["wait", "echo resolv=$(cat /etc/resolv.conf 2>/dev/null | grep -c ^nameserver)"])


async def reach_from_host(address: str, port: int) -> str:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), 3)
    line = (await asyncio.wait_for(reader.readline(), 3)).decode().strip()
    writer.close()
    return line


async def test_each_mode_reaches_what_it_should_and_nothing_else(oci_host: OciHost, outside: Outside,
                                                                  host_server: tuple[int, list[str]]) -> None:
    # The stand-in answers the host on all three addresses: what a job cannot reach, the worker refuses.
    for address in (INTERNET, PRIVATE_MACHINE, METADATA):
        assert (await reach_from_host(address, outside.port)).startswith(f"reached-{address}-from-")
    host_port, host_peers = host_server
    runtime = oci_host.runtime(private_networks=(PRIVATE_RANGE,))
    await runtime.start()
    plan = runtime._network
    assert plan is not None
    targets = {"internet": (INTERNET, outside.port), "private": (PRIVATE_MACHINE, outside.port),
               "metadata": (METADATA, outside.port), "host_loopback": ("127.0.0.1", host_port),
               "host_public_gateway": (str(plan.gateway(PUBLIC)), host_port),
               "host_private_gateway": (str(plan.gateway(PRIVATE)), host_port),
               "host_outside_side": (HOST_SIDE, host_port), "host_private": (HOST_PRIVATE, host_port)}
    targets |= {f"host_{i}": (address, host_port) for i, address in enumerate(host_addresses())}
    seen, words = {}, {}
    for number, mode in enumerate((js.NETWORK_MODE_PUBLIC, js.NETWORK_MODE_UNSPECIFIED, js.NETWORK_MODE_PRIVATE,
                                   js.NETWORK_MODE_NONE)):
        job = oci_host.job(spec(tries(targets), network_mode=mode), attempt_id=f"a{number}")
        outcome, log = await run(runtime, job)
        assert outcome.state == "Success", (outcome, log)
        seen[js.NetworkMode.Name(mode)], words[js.NetworkMode.Name(mode)] = fields(log), outcome.isolation

    nothing = dict.fromkeys(targets, "")
    # Public (and unspecified, its default): the internet, NATed to the host's address on that side; not
    # the private range, the metadata address, or the host by any of its addresses.
    for mode in ("NETWORK_MODE_PUBLIC", "NETWORK_MODE_UNSPECIFIED"):
        assert seen[mode].pop("resolv") != "0"
        assert seen[mode] == nothing | {"internet": f"reached-{INTERNET}-from-{HOST_SIDE}"}, mode
    # Private: the private range only: a machine in it, and the host's own address in it.
    seen["NETWORK_MODE_PRIVATE"].pop("resolv")
    private = seen["NETWORK_MODE_PRIVATE"]
    assert private["private"].startswith(f"reached-{PRIVATE_MACHINE}-from-")  # NATed to a host address
    assert private == nothing | {"private": private["private"], "host_private": "host"}
    # None: nothing at all.
    assert seen["NETWORK_MODE_NONE"] == nothing | {"resolv": "0"}
    assert len(host_peers) == 1  # the private job's, to the host's address in the private range
    assert "public bridge" in words["NETWORK_MODE_PUBLIC"] and "private bridge" in words["NETWORK_MODE_PRIVATE"]
    assert "only loopback" in words["NETWORK_MODE_NONE"]


async def test_jobs_on_one_bridge_cannot_reach_each_other(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    await runtime.start()
    assert runtime._network is not None
    first = list(runtime._network.addresses(PUBLIC))[0]
    listener = oci_host.job(spec("nc -l -p 9000 -e echo pong & sleep 8; echo listened=$(ip -4 -o addr show eth0 "
                                 "| awk '{print $4}')", network_mode=js.NETWORK_MODE_PUBLIC), attempt_id="a1")
    task = asyncio.create_task(run(runtime, listener))
    await asyncio.sleep(2)
    caller = oci_host.job(spec(f"echo other=$(nc -w 3 {first} 9000 </dev/null 2>/dev/null)",
                               network_mode=js.NETWORK_MODE_PUBLIC), attempt_id="a2", job_id=4)
    outcome, log = await run(runtime, caller)
    listened, listened_log = await task
    assert listened.state == "Success" and fields(listened_log)["listened"] == f"{first}/25", listened_log
    assert outcome.state == "Success" and fields(log) == {"other": ""}, log


async def test_a_host_that_cannot_make_bridges_refuses_network_modes_saying_why(oci_host: OciHost,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    monkeypatch.setattr("services.worker.oci.network.shutil.which",
                        lambda tool, path=None: None if tool == "iptables" else "/usr/sbin/" + tool)
    runtime = oci_host.runtime()
    await runtime.start()
    outcome, _ = await run(runtime, oci_host.job(spec("true", network_mode=js.NETWORK_MODE_PUBLIC)))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "network_mode NETWORK_MODE_PUBLIC cannot be offered on this host: iptables is not installed" \
        in outcome.error_message
    none, _ = await run(runtime, oci_host.job(spec("true"), attempt_id="a2"))
    assert none.state == "Success"



async def test_a_bridge_of_the_workers_name_that_is_not_its_own_is_left_alone(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    bridge = f"crl-{owner_hash(runtime.owner.dir)}-p"
    sh("ip", "link", "add", bridge, "type", "bridge")
    try:
        await runtime.start()
        outcome, _ = await run(runtime, oci_host.job(spec("true", network_mode=js.NETWORK_MODE_PRIVATE)))
        assert (outcome.state, outcome.end_reason) == ("Error", "refused")
        assert f"bridge {bridge} already exist(s), not made by this worker" in outcome.error_message
        none, _ = await run(runtime, oci_host.job(spec("true"), attempt_id="a2"))
        assert none.state == "Success"
        await runtime.close()
        assert Path("/sys/class/net", bridge).exists()  # not the worker's to remove
    finally:
        sh("ip", "link", "del", bridge)
