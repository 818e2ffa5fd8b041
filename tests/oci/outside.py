"""The world outside the host, for the containers' network tests: a network
namespace of the test's, joined to the host by a veth pair, host side
198.51.100.1/24 (TEST-NET-2, which nothing else on a host uses). The host
reaches it through its ordinary routing, exactly as it reaches the internet
through its default route: a job's packets go container → bridge → the
host's FORWARD chain → out of another interface, NATed. In that namespace
one TCP server listens on every address of it, and greets each connection
with the address it was reached at and the peer it saw:

- 198.51.100.2: "the internet" (no private range);
- 10.197.77.2, routed by the host via 198.51.100.2: "a machine of the
  deployment's private range" (the worker is given 10.197.77.0/24 as its
  private network);
- 192.168.199.2, routed the same way: "a machine of a private range the
  deployment does not name" (another site's network, a home router);
- 169.254.169.254, routed the same way: "the cloud's metadata server".

The host's side of the pair has 10.197.77.1 too: an address of the host
itself inside the private range, which private jobs may reach and public
ones may not. (This machine's kernel has no dummy interfaces; a namespace
stands for the internet and the private ranges.)
"""

from __future__ import annotations

import asyncio
import fcntl
import ipaddress
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

INTERNET, PRIVATE_MACHINE, METADATA = "198.51.100.2", "10.197.77.2", "169.254.169.254"
UNNAMED_PRIVATE = "192.168.199.2"
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
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")


def remove_stale_stand_ins() -> None:
    """Deletes what a stand-in killed before its cleanup left: its namespace and its host side, which keeps
    the routes. Called with the lock held, so every stand-in that exists now is stale."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in namespaces:
        if name.startswith("crlt-out-"):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout.splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith("crlto-"):
            subprocess.run(["ip", "link", "del", name], capture_output=True)


@dataclass
class Outside:
    """The world outside the host, in a namespace of the test's (see the module's docstring)."""

    netns: str
    veth: str
    port: int
    server: subprocess.Popen


LOCK = Path("/run/corral-test-outside.lock")
"""Held while a stand-in exists: its addresses and host routes (the metadata address's among them) are the
host's, so tests running at once in other processes (pytest-xdist) take turns."""


@pytest.fixture
async def outside() -> AsyncIterator[Outside]:
    tag = uuid.uuid4().hex[:6]
    netns, veth = f"crlt-out-{tag}", f"crlto-{tag}"
    server = None
    lock = os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        remove_stale_stand_ins()
        sh("ip", "netns", "add", netns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        sh("ip", "addr", "add", f"{HOST_SIDE}/24", "dev", veth)
        sh("ip", "addr", "add", f"{HOST_PRIVATE}/32", "dev", veth)
        sh("ip", "link", "set", veth, "up")
        for address in (f"{INTERNET}/24", f"{PRIVATE_MACHINE}/32", f"{UNNAMED_PRIVATE}/32", f"{METADATA}/32"):
            sh("ip", "-n", netns, "addr", "add", address, "dev", "eth0")
        sh("ip", "-n", netns, "link", "set", "eth0", "up")
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        for address in (PRIVATE_MACHINE, UNNAMED_PRIVATE, METADATA):
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
        os.close(lock)  # and with it the lock


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
