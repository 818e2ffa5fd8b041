"""The few netlink requests the attempt networks make in the worker's own
process, where an `ip` or `conntrack` process would cost milliseconds each:
deleting a link or a neighbour entry (rtnetlink), and forgetting the host's
connection tracking entries of one address (ctnetlink).

A netlink socket talks to the network namespace its maker was in when it
was made: one made by a thread inside an attempt's namespace (slots.py)
changes that namespace, one made anywhere else the host's.
"""

from __future__ import annotations

import ctypes
import errno
import ipaddress
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

NETLINK_ROUTE, NETLINK_NETFILTER = 0, 12
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLA_F_NESTED = 0x8000
_NLA_TYPE = 0x3FFF
_HEADER = struct.Struct("=IHHII")
_ATTR = struct.Struct("=HH")

RTM_DELLINK, RTM_DELNEIGH = 17, 29
NDA_DST = 1

# ctnetlink (linux/netfilter/nfnetlink_conntrack.h)
_CT_GET, _CT_DELETE = (1 << 8) | 1, (1 << 8) | 2  # NFNL_SUBSYS_CTNETLINK << 8 | IPCTNL_MSG_CT_*
CTA_TUPLE_ORIG, CTA_TUPLE_REPLY, CTA_ZONE, CTA_FILTER = 1, 2, 18, 25
CTA_TUPLE_IP, CTA_IP_V4_SRC, CTA_IP_V4_DST = 1, 1, 2
CTA_FILTER_ORIG_FLAGS, CTA_FILTER_REPLY_FLAGS = 1, 2
_FILTER_IP_SRC, _FILTER_IP_DST = 1 << 0, 1 << 1
_NFNLGRP_CONNTRACK_NEW = 1
_SO_ATTACH_FILTER, _SO_RCVBUFFORCE = 26, 33


class NetlinkError(OSError):
    """The kernel refused a request (its errno is the exception's)."""


def attribute(kind: int, value: bytes) -> bytes:
    """One netlink attribute, padded to 4 bytes."""
    length = _ATTR.size + len(value)
    return _ATTR.pack(length, kind) + value + b"\0" * (-length % 4)


def attributes(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(type, value) of each attribute in `data` (nesting and byte-order flags dropped from the type)."""
    offset = 0
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size:
            break
        yield kind & _NLA_TYPE, data[offset + _ATTR.size:offset + length]
        offset += (length + 3) & ~3


class Netlink:
    """A netlink socket of one protocol, in the namespace of the thread that makes it."""

    def __init__(self, protocol: int):
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
        self._socket.bind((0, 0))
        self._seq = 0

    def __enter__(self) -> Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self._socket.close()

    def request(self, kind: int, payload: bytes, flags: int = NLM_F_ACK) -> list[bytes]:
        """Send one request and read its answer: a dump's messages' payloads, or [] once acknowledged.
        Raises NetlinkError if the kernel refuses it."""
        self._seq += 1
        self._socket.send(_HEADER.pack(_HEADER.size + len(payload), kind, NLM_F_REQUEST | flags, self._seq, 0)
                          + payload)
        found = []
        while True:
            data = self._socket.recv(1 << 17)
            offset = 0
            while offset + _HEADER.size <= len(data):
                length, message, _, seq, _ = _HEADER.unpack_from(data, offset)
                body = data[offset + _HEADER.size:offset + length]
                offset += (length + 3) & ~3
                if seq != self._seq:
                    continue
                if message == NLMSG_DONE:
                    return found
                if message == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", body)
                    if code:
                        raise NetlinkError(-code, os.strerror(-code))
                    return found
                found.append(body)


def delete_link(ifindex: int) -> None:
    """Delete a link (a veth end takes its peer with it) of this thread's namespace."""
    with Netlink(NETLINK_ROUTE) as nl:
        nl.request(RTM_DELLINK, struct.pack("=BxHiII", socket.AF_UNSPEC, 0, ifindex, 0, 0))


def delete_neighbours(entries: list[tuple[str, int]]) -> None:
    """Delete IPv4 neighbour entries, (address, ifindex), of this thread's namespace (one gone already is
    no matter)."""
    with Netlink(NETLINK_ROUTE) as nl:
        for address, ifindex in entries:
            try:
                nl.request(RTM_DELNEIGH, struct.pack("=BxxxiHBB", socket.AF_INET, ifindex, 0, 0, 0)
                           + attribute(NDA_DST, socket.inet_aton(address)))
            except NetlinkError as e:
                if e.errno != errno.ENOENT:
                    raise


def forget_connections(address: ipaddress.IPv4Address) -> int:
    """Delete the host's connection tracking entries that `address` started (original source) or that
    answer it (reply destination: where NAT sends a remote's packets); how many. The kernel picks them out
    (CTA_FILTER), but walks its whole table to (some 14 ms per dump at 262,144 buckets): `Connections`
    spares it."""
    packed = address.packed
    with Netlink(NETLINK_NETFILTER) as nl:
        doomed = []
        for tuple_kind, ip_kind, flags_kind, flag in (
                (CTA_TUPLE_ORIG, CTA_IP_V4_SRC, CTA_FILTER_ORIG_FLAGS, _FILTER_IP_SRC),
                (CTA_TUPLE_REPLY, CTA_IP_V4_DST, CTA_FILTER_REPLY_FLAGS, _FILTER_IP_DST)):
            wanted = attribute(tuple_kind | NLA_F_NESTED,
                               attribute(CTA_TUPLE_IP | NLA_F_NESTED, attribute(ip_kind, packed)))
            filter_ = attribute(CTA_FILTER | NLA_F_NESTED, attribute(flags_kind, struct.pack("=I", flag)))
            doomed += [key for entry in nl.request(_CT_GET, _nfgen() + wanted + filter_, NLM_F_DUMP)
                       if (key := _entry_key(entry)) is not None]
        return _delete(nl, doomed)


def _entry_key(message: bytes) -> bytes | None:
    """What names a connection tracking entry in a delete request: its original tuple (and zone), from a
    dump's or an event's message."""
    found = dict(attributes(message[4:]))
    if CTA_TUPLE_ORIG not in found:
        return None
    return (attribute(CTA_TUPLE_ORIG | NLA_F_NESTED, found[CTA_TUPLE_ORIG])
            + (attribute(CTA_ZONE, found[CTA_ZONE]) if CTA_ZONE in found else b""))


def _source(key: bytes) -> bytes:
    """The original source address (4 bytes) of an entry's key."""
    for kind, value in attributes(key):
        if kind == CTA_TUPLE_ORIG:
            for kind_, ip in attributes(value):
                if kind_ == CTA_TUPLE_IP:
                    return dict(attributes(ip)).get(CTA_IP_V4_SRC, b"")
    return b""


def _delete(nl: Netlink, keys: list[bytes]) -> int:
    deleted = 0
    for key in dict.fromkeys(keys):  # an entry matched twice is deleted once
        try:
            nl.request(_CT_DELETE, _nfgen() + key)
            deleted += 1
        except NetlinkError as e:
            if e.errno != errno.ENOENT:  # gone meanwhile (timed out, closed)
                raise
    return deleted


class Connections:
    """The host's connection tracking entries that a subnet's addresses start, learnt from the kernel's
    new-connection events (a socket filter keeps only the subnet's), so that an address's are deleted one
    lookup each instead of by two walks of the whole table (`forget_connections`), which is what happens
    when the events cannot be trusted: the host has them off (`nf_conntrack_events` 0), some were lost
    (the socket's buffer overflowed), the address started more than KEYS_PER_ADDRESS, or the address has
    not been cleared by a walk since this watch began (entries from before it, e.g. a dead worker's).

    An entry whose reply goes to an address it did not start would need a DNAT rule towards a job: the
    worker has none, and nothing else reaches a job's address to start one (its chains drop it before the
    kernel confirms an entry). Events are read when an address is forgotten: every entry its attempt made
    is announced by then (the kernel queues the event when it confirms the entry, in the packet's path)."""

    KEYS_PER_ADDRESS = 256

    def __init__(self, subnet: ipaddress.IPv4Network):
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                                     NETLINK_NETFILTER)
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, _SO_RCVBUFFORCE, 4 << 20)
            _attach_filter(self._socket, subnet)  # before it joins the group: no other event ever queued
            self._socket.bind((0, 1 << (_NFNLGRP_CONNTRACK_NEW - 1)))
        except BaseException:
            self._socket.close()
            raise
        self._subnet = subnet
        self._keys: dict[bytes, set[bytes]] = {}
        """Address (4 bytes) -> the keys of the entries it started since it was last forgotten."""
        self._generation = 0
        """Bumped when events were lost: every address needs a walk again."""
        self._walked: dict[bytes, int] = {}
        """Address -> the generation of its last walk."""
        self._lock = threading.Lock()  # slots are reset in threads, several at once

    def close(self) -> None:
        self._socket.close()

    def forget(self, address: ipaddress.IPv4Address) -> int:
        """Delete the host's connection tracking entries of `address` (see the class's docstring); how many."""
        packed = address.packed
        with self._lock:
            self._read()
            keys = self._keys.pop(packed, set())
            walk = (self._walked.get(packed, -1) < self._generation or len(keys) > self.KEYS_PER_ADDRESS
                    or Path("/proc/sys/net/netfilter/nf_conntrack_events").read_text().strip() == "0")
            if walk:
                self._walked[packed] = self._generation
        if walk:
            return forget_connections(address)
        with Netlink(NETLINK_NETFILTER) as nl:
            return _delete(nl, sorted(keys))

    def _read(self) -> None:
        while True:
            try:
                data = self._socket.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno != errno.ENOBUFS:
                    raise
                self._generation += 1  # some were lost: which addresses' is unknown
                continue
            offset = 0
            while offset + _HEADER.size <= len(data):
                length = _HEADER.unpack_from(data, offset)[0]
                key = _entry_key(data[offset + _HEADER.size:offset + length])
                offset += (length + 3) & ~3
                source = _source(key) if key is not None else b""
                if len(source) == 4 and ipaddress.IPv4Address(source) in self._subnet and \
                        len(keys := self._keys.setdefault(source, set())) <= self.KEYS_PER_ADDRESS:
                    keys.add(key)


def _attach_filter(sock: socket.socket, subnet: ipaddress.IPv4Network) -> None:
    """A classic BPF filter dropping the events of other sources than `subnet`'s and of other families.
    An IPv4 event's source address is at byte 32: after the 16-byte header, nfgenmsg (4 bytes, the family
    first), and three attributes' 4-byte headers (CTA_TUPLE_ORIG, CTA_TUPLE_IP, CTA_IP_V4_SRC), which the
    filter checks: an event laid out otherwise is kept, for `_read` to sort out, never dropped unseen."""
    def type_at(offset: int, kind: int) -> list[tuple[int, int, int, int]]:
        """Keep (jump to `keep`, patched below) unless the attribute type at `offset` is `kind`."""
        native = int.from_bytes(struct.pack("=H", kind), "big")  # BPF loads big-endian
        flags = int.from_bytes(struct.pack("=H", _NLA_TYPE), "big")
        return [(0x28, 0, 0, offset), (0x54, 0, 0, flags), (0x15, 0, -1, native)]  # ldh; and; jeq

    program = [(0x30, 0, 0, 16), (0x15, 0, -2, socket.AF_INET)]  # ldb [16]: the family; else drop
    program += type_at(22, CTA_TUPLE_ORIG) + type_at(26, CTA_TUPLE_IP) + type_at(30, CTA_IP_V4_SRC)
    program += [(0x20, 0, 0, 32), (0x54, 0, 0, int(subnet.netmask)),  # ld [32]: the source; and the mask
                (0x15, 0, -2, int(subnet.network_address))]  # jeq the subnet, else drop
    keep, drop = len(program), len(program) + 1
    program = [(code, jt, {-1: keep, -2: drop}[jf] - i - 1 if jf < 0 else jf, k)
               for i, (code, jt, jf, k) in enumerate(program)]
    program += [(0x06, 0, 0, 0xFFFFFFFF), (0x06, 0, 0, 0)]  # keep it all; drop
    code = (_SockFilter * len(program))(*(_SockFilter(*op) for op in program))
    fprog = _SockFprog(len(program), ctypes.cast(code, ctypes.POINTER(_SockFilter)))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, bytes(fprog))


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _nfgen() -> bytes:
    """nfgenmsg: IPv4, NFNETLINK_V0, resource id 0."""
    return struct.pack("=BBH", socket.AF_INET, 0, 0)
