"""Attempt networks are kept for the next attempt and reset between
tenants (issue 39; services/worker/oci/slots.py, docs/security.md).

A slot (a network namespace, veth pair and address) outlives its attempt:
the next attempt of its mode joins the same namespace. What a tenant can
leave in it (it has no capabilities: not its addresses, routes or
netfilter) is reset or makes the slot be discarded: sockets closing
(TIME_WAIT, which the slot never keeps; FIN_WAIT with unsent data, which
discards it), neighbour entries, and the host's connection tracking
entries of its address. Nothing of it is left after the runtime closes
(the fixture's leftovers check) or after its worker dies
(test_oci_recovery.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.oci.network import PUBLIC, owner_hash
from tests.oci.host import OciHost, fields, needs_oci, run, slots_left, spec
from tests.oci.outside import INTERNET, Outside

pytestmark = [pytest.mark.timeout(90), needs_oci]

TABLES = ("tcp", "tcp6", "udp", "udp6", "raw", "raw6", "icmp", "unix", "arp")
SEEN = "; ".join(f"echo {t}=$(($(wc -l < /proc/net/{t}) - 1))" for t in TABLES)
"""A job's look at its namespace's tables: how many entries each has (its first line is a header)."""
NETNS = "echo netns=$(readlink /proc/self/ns/net)"

HOLDER = r"""
import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.bind(("0.0.0.0", 0))
s.listen(16)
print(s.getsockname()[1], flush=True)
held = []
while True:
    held.append(s.accept()[0])  # never read, never closed
"""


@pytest.fixture
async def holder(outside: Outside) -> AsyncIterator[int]:
    """A server of the world outside that accepts connections and never reads them: its port."""
    server = subprocess.Popen(["ip", "netns", "exec", outside.netns, sys.executable, "-I", "-c", HOLDER],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield int(await asyncio.to_thread(server.stdout.readline))
    finally:
        server.kill()
        server.wait()
        assert server.stdout is not None
        server.stdout.close()


def tracked(address: str) -> list[str]:
    """The host's connection tracking entries that `address` started or that answer it."""
    entries = Path("/proc/net/nf_conntrack").read_text().splitlines()
    return [e for e in entries if f"src={address} " in e or f"dst={address} " in e.split("dst=", 1)[-1]]


async def test_the_next_tenant_of_a_slot_sees_nothing_of_the_first(oci_host: OciHost, outside: Outside) -> None:
    runtime = oci_host.runtime()
    await runtime.start()
    assert runtime._network is not None
    address, neighbour = (str(a) for a in runtime._network.addresses(PUBLIC)[:2])
    # Tenant A listens, is reached over loopback and its own address (sockets closing, server side first:
    # TIME_WAIT), reaches the world outside (a NATed connection the host tracks) and tries a neighbour.
    a = spec(f"{NETNS}; nc -ll -p 7000 -e echo here & sleep 1; "
             f"for i in 1 2 3; do nc -w 2 127.0.0.1 7000 </dev/null >/dev/null; done; "
             f"echo self=$(nc -w 2 127.0.0.1 7000 </dev/null); echo own=$(nc -w 2 {address} 7000 </dev/null); "
             f"echo outside=$(nc -w 3 {INTERNET} {outside.port} </dev/null | head -n 1); "
             f"nc -w 1 {neighbour} 7000 </dev/null 2>/dev/null; {SEEN}", network_mode=js.NETWORK_MODE_PUBLIC)
    outcome, log = await run(runtime, oci_host.job(a, attempt_id="a"))
    seen_by_a = fields(log)
    assert outcome.state == "Success", (outcome, log)
    assert seen_by_a["self"] == seen_by_a["own"] == "here" and seen_by_a["outside"].startswith("reached-"), log
    assert int(seen_by_a["tcp"]) + int(seen_by_a["tcp6"]) >= 1 and seen_by_a["arp"] == "2", log  # listener; gateway, neighbour
    assert tracked(address) == []  # forgotten when its slot was reset

    b = spec(f"{NETNS}; {SEEN}; echo left=$(nc -w 2 127.0.0.1 7000 </dev/null 2>&1)$(nc -w 2 {address} 7000 "
             "</dev/null 2>&1)", network_mode=js.NETWORK_MODE_PUBLIC)
    outcome, log = await run(runtime, oci_host.job(b, attempt_id="b", job_id=4))
    assert outcome.state == "Success", (outcome, log)
    seen_by_b = fields(log)
    assert seen_by_b.pop("netns") == seen_by_a["netns"]  # the same namespace: reused
    assert "here" not in seen_by_b.pop("left")
    assert seen_by_b == dict.fromkeys(TABLES, "0")

    # The first tenant's entries were found by a walk of the host's table (the worker cannot know what was
    # there before it); a later tenant's, from the kernel's new-connection events.
    c = spec(f"echo outside=$(nc -w 3 {INTERNET} {outside.port} </dev/null | head -n 1)",
             network_mode=js.NETWORK_MODE_PUBLIC)
    outcome, log = await run(runtime, oci_host.job(c, attempt_id="c", job_id=5))
    assert outcome.state == "Success" and fields(log)["outside"].startswith("reached-"), (outcome, log)
    assert tracked(address) == []


async def test_a_slot_holding_sockets_that_cannot_be_reset_is_discarded(oci_host: OciHost, outside: Outside,
                                                                         holder: int) -> None:
    runtime = oci_host.runtime()
    await runtime.start()
    # A connection to a server that never reads, with more queued than it takes: when the job ends, its
    # socket stays in the namespace (FIN_WAIT1) until the kernel gives up on it, minutes later.
    a = spec(f"{NETNS}; (head -c 4000000 /dev/zero | nc {INTERNET} {holder}) & sleep 2; "
             "echo queued=$(grep -c ' 01 ' /proc/net/tcp)", network_mode=js.NETWORK_MODE_PUBLIC)
    outcome, log = await run(runtime, oci_host.job(a, attempt_id="a"))
    seen_by_a = fields(log)
    assert outcome.state == "Success" and seen_by_a["queued"] == "1", (outcome, log)
    b = spec(f"{NETNS}; {SEEN}", network_mode=js.NETWORK_MODE_PUBLIC)
    outcome, log = await run(runtime, oci_host.job(b, attempt_id="b", job_id=4))
    assert outcome.state == "Success", (outcome, log)
    seen_by_b = fields(log)
    assert seen_by_b.pop("netns") != seen_by_a["netns"]  # a new namespace: A's was discarded
    assert seen_by_b == dict.fromkeys(TABLES, "0")


async def test_slots_beyond_what_ran_at_once_recently_are_removed(oci_host: OciHost) -> None:
    runtime = oci_host.runtime()
    await runtime.start()
    assert runtime._slots is not None
    runtime._slots._demand[PUBLIC].window_s = 1.0  # "recently", shortened for the test
    h = owner_hash(runtime.owner.dir)
    job = spec("sleep 1", network_mode=js.NETWORK_MODE_PUBLIC)
    both = await asyncio.gather(*(run(runtime, oci_host.job(job, attempt_id=f"a{i}", job_id=i)) for i in (1, 2)))
    assert [outcome.state for outcome, _ in both] == ["Success", "Success"]
    assert len(namespaces(h)) == 2  # both kept: two ran at once
    await asyncio.sleep(1.5)
    outcome, _ = await run(runtime, oci_host.job(spec("true", network_mode=js.NETWORK_MODE_PUBLIC), attempt_id="b"))
    assert outcome.state == "Success"
    assert len(namespaces(h)) == 1  # one at a time lately: the other is gone


def namespaces(owner_hash_: str) -> list[str]:
    return [line for line in slots_left(owner_hash_) if line.startswith("network namespace")]
