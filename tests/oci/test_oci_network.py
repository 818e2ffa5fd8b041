"""What a job reaches in each network mode, tried from inside real
containers (acceptance 2, and the Networks paragraph of issue 13), against
the stand-in for the world outside the host (tests/oci/outside.py).

Before the jobs try them, the test connects to every address of the
stand-in from the host itself: they answer, so a job that cannot reach one
is refused by the worker's rules, not by the stand-in. The host's own
servers are one more TCP server of the test, on 0.0.0.0 (so on 127.0.0.1,
the host's own addresses, the bridges' gateways): no job may reach it by
any address.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.oci.network import PRIVATE, PUBLIC, owner_hash
from tests.oci.host import OciHost, fields, needs_oci, run, spec
from tests.oci.outside import (HOST_PRIVATE, HOST_SIDE, INTERNET, METADATA, PRIVATE_MACHINE, PRIVATE_RANGE,
                                UNNAMED_PRIVATE, Outside, reach_from_host, sh, tries)

pytestmark = [pytest.mark.timeout(90), needs_oci]

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


async def test_each_mode_reaches_what_it_should_and_nothing_else(oci_host: OciHost, outside: Outside,
                                                                  host_server: tuple[int, list[str]]) -> None:
    # The stand-in answers the host on all three addresses: what a job cannot reach, the worker refuses.
    for address in (INTERNET, PRIVATE_MACHINE, UNNAMED_PRIVATE, METADATA):
        assert (await reach_from_host(address, outside.port)).startswith(f"reached-{address}-from-")
    host_port, host_peers = host_server
    runtime = oci_host.runtime(private_networks=(PRIVATE_RANGE,))
    await runtime.start()
    plan = runtime._network
    assert plan is not None
    targets = {"internet": (INTERNET, outside.port), "private": (PRIVATE_MACHINE, outside.port),
               "unnamed_private": (UNNAMED_PRIVATE, outside.port),
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
    which = shutil.which  # the one module every caller shares
    monkeypatch.setattr("services.worker.oci.network.shutil.which",
                        lambda tool, path=None: None if tool == "iptables" else which(tool, path=path))
    runtime = oci_host.runtime()
    await runtime.start()
    outcome, _ = await run(runtime, oci_host.job(spec("true", network_mode=js.NETWORK_MODE_PUBLIC)))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "network_mode NETWORK_MODE_PUBLIC cannot be offered on this host: iptables is not installed" \
        in outcome.error_message
    none, _ = await run(runtime, oci_host.job(spec("true"), attempt_id="a2"))
    assert none.state == "Success"



async def test_a_runtime_that_offers_no_networks_makes_no_bridge_and_refuses_network_modes(
        oci_host: OciHost) -> None:
    """A pipeline's LocalBackend's runtime (offers_networks=False): loopback only, nothing of the host's changed."""
    runtime = oci_host.runtime(offers_networks=False)
    await runtime.start()
    outcome, _ = await run(runtime, oci_host.job(spec("true", network_mode=js.NETWORK_MODE_PUBLIC)))
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert "cannot be offered on this host: this runtime offers no network but loopback" in outcome.error_message
    none, _ = await run(runtime, oci_host.job(spec("true"), attempt_id="a2"))
    assert none.state == "Success"
    assert list(Path("/sys/class/net").glob(f"crl-{owner_hash(runtime.owner.dir)}-*")) == []


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
