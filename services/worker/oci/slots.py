"""Attempt networks kept for the next attempt: a small pool per worker and
mode of prepared **slots**, each reused after a clean reset (issue 39).

A slot is a network namespace `crl-H-mNN` (H the owner hash, as the
worker's bridges; m `p` public or `v` private; NN the index of its address
in the mode's /25, in hex), a veth pair (`crvHmNN` on the bridge, 14
characters, an isolated port, IPv6 off before it is up; `eth0` inside,
IPv6 off), its address, loopback up, a default route via the gateway, and
no TIME_WAIT sockets ever (`tcp_max_tw_buckets` 0 in the namespace: a
closed connection's socket is gone at once instead of sitting a minute in
/proc/net/tcp, with its remote address, for the next tenant to read).

Making one costs some 13 ms of `ip` processes and the kernel's namespace
creation and deferred destruction; handing a free one to the next attempt
costs a look inside it. When an attempt ends, its slot is **reset**, or
**discarded** (deleted; the next attempt that finds no free slot makes a
new one):

- the host's connection tracking entries of its address (NATed
  connections: a remote's packets for the old tenant's would reach the
  next) are deleted, when the slot sent anything since its last reset
  (the bridge end's rx_packets: nothing sent, no entry), as the kernel's
  events named them or by a walk of the table (netlink.Connections);
- its neighbour entries (which addresses the tenant tried) are deleted;
- any socket still there (tcp, udp, raw, icmp, unix, packet: a process
  still alive in it, or a connection closing, FIN_WAIT and the like) cannot
  be reset: the slot is discarded, as it is when anything of the attempt's
  teardown before it failed (its processes may not all be gone).

The job runs as a uid with no capabilities in a namespace owned by the
host's user namespace: it cannot change the slot's addresses, routes,
sysctls or netfilter, so these are not checked.

A slot is looked into by a thread made for the look, which joins its
namespace (setns is per thread) and ends with the look: no thread of the
worker's is ever left in a job's namespace. Its TCP and UDP hash tables
are its own (`_new_netns`), so that the look reads its sockets, not the
host's whole table.

How many are kept: as many as attempts of the mode ran at once in the last
`window_s` (`Demand`), at most the /25's addresses; a reset slot beyond
that is deleted.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import ipaddress
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from services.worker.oci import netlink
from services.worker.oci.network import NETNS_DIR, PRIVATE, PUBLIC, NetworkError, Plan, ip_batch, sysctl

logger = logging.getLogger(__name__)

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
MNT_DETACH, MS_BIND = 2, 4096
HASH_ENTRIES = 1024
"""The size of a slot's own TCP established and UDP hash tables (a job's connections at once fit)."""
_libc = ctypes.CDLL(None, use_errno=True)

SOCKET_TABLES = ("tcp", "tcp6", "udp", "udp6", "udplite", "udplite6", "raw", "raw6", "icmp", "icmp6", "unix",
                 "packet")
"""The namespace's socket tables under /proc/net: any entry is a socket still there."""
WINDOW_S = 60.0
"""How far back `Demand` looks for the most attempts at once."""


# -- the pure part ------------------------------------------------------------------------------------


def netns_name(owner_hash: str, mode: str, index: int) -> str:
    return f"crl-{owner_hash}-{_mode_letter(mode)}{index:02x}"


def veth_name(owner_hash: str, mode: str, index: int) -> str:
    return f"crv{owner_hash}{_mode_letter(mode)}{index:02x}"  # 14 characters: the kernel allows 15


def _mode_letter(mode: str) -> str:
    return "p" if mode == PUBLIC else "v"


def slot_of(owner_hash: str, name: str) -> str | None:
    """The mode letter and index (e.g. 'p0a') of an owner's slot that a namespace or veth is named for;
    None if it is not one (e.g. the owner's bridge, `crl-H-p`)."""
    for prefix in (f"crl-{owner_hash}-", f"crv{owner_hash}"):
        suffix = name[len(prefix):]
        if name.startswith(prefix) and len(suffix) == 3 and suffix[0] in "pv" and _is_hex(suffix[1:]):
            return suffix
    return None


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def first_free_index(taken: set[int], count: int) -> int | None:
    """The lowest address index no slot holds (None if all `count` are)."""
    return next((i for i in range(count) if i not in taken), None)


def residue(tables: dict[str, str]) -> list[str]:
    """What the socket tables (their /proc/net text, by name) hold, in words (each one's first line is its
    header)."""
    found = []
    for name, text in tables.items():
        if count := max(0, len(text.splitlines()) - 1):
            found.append(f"{count} {name} socket{'s' if count > 1 else ''}")
    return found


def neighbours(arp: str) -> list[str]:
    """The addresses of /proc/net/arp's entries (its first line is the header)."""
    return [line.split()[0] for line in arp.splitlines()[1:] if line.split()]


@dataclass
class Demand:
    """The most attempts of one mode at once in the last `window_s` (pure: the clock is given)."""

    window_s: float = WINDOW_S
    _changes: deque[tuple[float, int]] = field(default_factory=deque)
    """(time, attempts at once from then on), oldest first; the first may be older than the window: the
    count the window starts with."""

    def note(self, now: float, running: int) -> None:
        self._changes.append((now, running))
        self._forget(now)

    def peak(self, now: float) -> int:
        self._forget(now)
        return max((running for _, running in self._changes), default=0)

    def _forget(self, now: float) -> None:
        """Drop the counts that ended before the window."""
        while len(self._changes) > 1 and self._changes[1][0] <= now - self.window_s:
            self._changes.popleft()


# -- one slot -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A prepared attempt network (see the module's docstring)."""

    owner_hash: str
    mode: str
    index: int
    address: ipaddress.IPv4Address
    prefixlen: int

    @property
    def netns(self) -> str:
        return netns_name(self.owner_hash, self.mode, self.index)

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.netns)

    @property
    def veth(self) -> str:
        return veth_name(self.owner_hash, self.mode, self.index)

    def sent_packets(self) -> int:
        """Packets the namespace sent out of eth0 so far (the bridge end's receive count)."""
        return int(Path("/sys/class/net", self.veth, "statistics", "rx_packets").read_text())


def in_thread(work: Callable[[], T]) -> T:
    """`work()`, run by a thread made for it (and ended with it): for namespace changes, which are per
    thread, so that none of the worker's threads is ever left in a job's namespace (there is no way back
    to fail)."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(work())
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread, raised there
            failure.append(e)

    thread = threading.Thread(target=run, name="network namespace")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def in_netns(path: str, look: Callable[[], T]) -> T:
    """`look()`, run inside the network namespace at `path` (by a thread of its own, `in_thread`)."""
    def inside() -> T:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.setns(fd, CLONE_NEWNET), f"setns into {path}")
        finally:
            os.close(fd)
        return look()

    return in_thread(inside)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _new_netns(path: Path) -> None:
    """A network namespace bound at `path`, as `ip netns add` makes one, but with TCP and UDP hash tables
    of its own (HASH_ENTRIES): else it shares the host's, and reading its /proc/net/tcp walks all of them
    (some 6 ms each for tcp and tcp6 on a host of 1M buckets). The size comes from the namespace that makes
    it, so a scratch namespace of the thread's, gone with it, is set to make it; the host's own setting is
    left alone. (A kernel before 6.1 has no such setting: there the look is slower, no less thorough.)"""
    def make() -> None:
        _check(_libc.unshare(CLONE_NEWNET), "unshare")
        sysctl("net/ipv4/tcp_child_ehash_entries", str(HASH_ENTRIES))
        sysctl("net/ipv4/udp_child_hash_entries", str(HASH_ENTRIES))
        _check(_libc.unshare(CLONE_NEWNET), "unshare")
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444))
        _check(_libc.mount(b"/proc/thread-self/ns/net", str(path).encode(), None, MS_BIND, None),
               f"bind-mounting {path}")

    in_thread(make)


def _settle() -> None:
    """Inside a new slot: no IPv6 on eth0 (lo keeps ::1), and no TIME_WAIT sockets."""
    sysctl("net/ipv6/conf/eth0/disable_ipv6", "1")
    sysctl("net/ipv4/tcp_max_tw_buckets", "0")


def make(plan: Plan, slot: Slot) -> None:
    """Make `slot` (on failure, what was made is left for `remove`)."""
    gateway, bridge = plan.gateway(slot.mode), plan.bridge(slot.mode)
    _new_netns(Path(slot.netns_path))
    # Two `ip` processes in all (each command its own process cost some 2 ms of CPU apiece, seven times).
    ip_batch(f"link add {slot.veth} type veth peer name eth0 netns {slot.netns}")
    sysctl(f"net/ipv6/conf/{slot.veth}/disable_ipv6", "1")  # before it is up: no IPv6 address, ever
    in_netns(slot.netns_path, _settle)
    ip_batch(f"link set {slot.veth} master {bridge}",
             f"link set dev {slot.veth} type bridge_slave isolated on",  # jobs cannot reach each other
             f"link set {slot.veth} up")
    ip_batch(f"addr add {slot.address}/{slot.prefixlen} dev eth0", "link set lo up", "link set eth0 up",
             f"route add default via {gateway}", netns=slot.netns)


def _look() -> tuple[dict[str, str], str]:
    """Inside a slot: its socket tables and neighbour table."""
    tables = {}
    for name in SOCKET_TABLES:
        try:
            tables[name] = _read(f"/proc/thread-self/net/{name}")
        except FileNotFoundError:
            pass  # e.g. no IPv6 or UDP-Lite in this kernel: no such sockets
    return tables, _read("/proc/thread-self/net/arp")


def _read(path: str) -> str:
    """A /proc file's text, read with plain os.read: half the CPU of Path.read_text's layers, which matters
    for the thirteen files read at every attempt's end."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _forget_neighbours(addresses: list[str]) -> None:
    """Inside a slot: delete its neighbour entries."""
    netlink.delete_neighbours([(a, socket.if_nametoindex("eth0")) for a in addresses])


class ConnectionsKept(NetworkError):
    """The host's connection tracking entries of a slot's address could not be deleted: the address is not
    given to anyone again (a remote's packets for the old tenant's connections would reach them)."""


def reset(slot: Slot, sent_at_reset: int, reuse: bool, connections: netlink.Connections) -> tuple[list[str], int]:
    """Reset a slot whose attempt is over (only forget its connections if it is not to be reused): what
    cannot be reset (empty if it is clean again), and its sent packets now (what its next reset compares
    with). Raises ConnectionsKept."""
    sent = slot.sent_packets()
    if sent != sent_at_reset:  # it sent something: the host may track its connections
        try:
            connections.forget(slot.address)
        except OSError as e:
            raise ConnectionsKept(f"could not delete the host's connection tracking entries of {slot.address}: "
                                  f"{e}") from e
    if not reuse:
        return [], sent
    tables, arp = in_netns(slot.netns_path, _look)
    if found := residue(tables):
        return found, sent
    if addresses := neighbours(arp):
        in_netns(slot.netns_path, lambda: _forget_neighbours(addresses))
    return [], sent


def remove(netns: str, veth: str) -> list[str]:
    """Delete a slot's veth pair and namespace (whatever of them exists); what could not be."""
    left = []
    link = Path("/sys/class/net", veth, "ifindex")
    if link.exists():  # deleted first: the namespace's end goes with it now, not when the kernel gets to it
        try:
            netlink.delete_link(int(link.read_text()))
        except (OSError, ValueError) as e:
            if link.exists():
                left.append(f"veth {veth}: {e}")
    path = NETNS_DIR / netns
    if path.exists():
        if _libc.umount2(str(path).encode(), MNT_DETACH) != 0 and ctypes.get_errno() != errno.EINVAL:
            left.append(f"network namespace {netns}: umount: {os.strerror(ctypes.get_errno())}")
        else:  # EINVAL: not mounted (made, not yet bound)
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                left.append(f"network namespace {netns}: {e}")
    return left


def remove_all(owner_hash: str) -> list[str]:
    """Delete every slot of an owner's the host has (after its worker closed or died); what could not be."""
    names = os.listdir(NETNS_DIR) if NETNS_DIR.is_dir() else []
    suffixes = {s for n in names + os.listdir("/sys/class/net") if (s := slot_of(owner_hash, n))}
    left = []
    for suffix in sorted(suffixes):
        left += remove(f"crl-{owner_hash}-{suffix}", f"crv{owner_hash}{suffix}")
    return left


# -- the pool -----------------------------------------------------------------------------------------


class Slots:
    """One worker's slots of both modes: `acquire` one for an attempt, `release` it after. Its state is in
    memory; a worker that dies leaves its slots to `remove_all` (network.tear_down) by their names."""

    def __init__(self, plan: Plan, clock: Callable[[], float] = time.monotonic, window_s: float = WINDOW_S):
        self.plan, self._clock = plan, clock
        self._free: dict[str, deque[Slot]] = {m: deque() for m in (PUBLIC, PRIVATE)}
        self._held: dict[str, set[int]] = {m: set() for m in self._free}
        """Address indexes of every slot of the mode that exists (free, in use, being made or reset), or
        could not be removed (never handed out again)."""
        self._in_use: dict[str, int] = dict.fromkeys(self._free, 0)
        self._demand = {m: Demand(window_s) for m in self._free}
        self._sent: dict[Slot, int] = {}
        """Each slot's sent packets at its last reset."""
        self._connections = netlink.Connections(plan.subnet)

    def close(self) -> None:
        """Stop following the host's new connections (the slots themselves are network.tear_down's)."""
        self._connections.close()

    async def acquire(self, mode: str) -> Slot:
        """A free slot of `mode` (the longest free), else a new one. Raises NetworkError."""
        self._in_use[mode] += 1
        self._demand[mode].note(self._clock(), self._in_use[mode])
        if self._free[mode]:
            return self._free[mode].popleft()
        addresses = self.plan.addresses(mode)
        index = first_free_index(self._held[mode], len(addresses))
        if index is None:
            self._in_use[mode] -= 1
            raise NetworkError(f"no free address for a {mode} container: {len(addresses)} attempts have one")
        self._held[mode].add(index)
        slot = Slot(self.plan.hash, mode, index, addresses[index], self.plan.mode_subnet(mode).prefixlen)
        try:
            await asyncio.to_thread(make, self.plan, slot)
            self._sent[slot] = await asyncio.to_thread(slot.sent_packets)
        except (NetworkError, OSError) as e:
            self._in_use[mode] -= 1
            await self._discard(slot)
            raise NetworkError(f"could not make the network {slot.netns}: {e}") from e
        except BaseException:  # cancelled: its address stays held, what was made is the runtime's close's
            self._in_use[mode] -= 1
            raise
        return slot

    async def release(self, slot: Slot, reusable: bool = True) -> list[str]:
        """Reset the slot of an attempt that is over and keep it for the next, or discard it (if not
        `reusable`: something of the attempt may still be alive; or if it holds what cannot be reset, or is
        beyond what is kept). Returns what could not be removed or reset, in words."""
        mode = slot.mode
        self._in_use[mode] -= 1
        now = self._clock()
        self._demand[mode].note(now, self._in_use[mode])
        keep = reusable and len(self._free[mode]) + self._in_use[mode] < self._demand[mode].peak(now)
        try:
            found, self._sent[slot] = await asyncio.to_thread(reset, slot, self._sent[slot], keep,
                                                              self._connections)
        except ConnectionsKept as e:
            return await self._discard(slot, hold=True) + [str(e)]
        except (OSError, ValueError) as e:
            found = [f"it could not be reset: {e}"]
        if found:
            logger.info("discarding the network %s: %s", slot.netns, "; ".join(found))
        if keep and not found:
            self._free[mode].append(slot)
            return []
        return await self._discard(slot)

    async def _discard(self, slot: Slot, hold: bool = False) -> list[str]:
        """Delete a slot; its address is given to a new one, unless it could not be deleted or `hold`."""
        left = await asyncio.to_thread(remove, slot.netns, slot.veth)
        self._sent.pop(slot, None)
        if not (left or hold):
            self._held[slot.mode].discard(slot.index)
        return left
