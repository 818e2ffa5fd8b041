"""The few netlink requests the attempt networks make in the worker's own
process, where an `ip` or `conntrack` process would cost milliseconds each:
deleting a link or a neighbour entry (rtnetlink), and forgetting the host's
connection tracking entries of one address (ctnetlink).

A netlink socket talks to the network namespace its maker was in when it
was made: one made by a thread inside an attempt's namespace (slots.py)
changes that namespace, one made anywhere else the host's.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
from collections.abc import Iterator

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
    (CTA_FILTER): a busy host's table is not read into Python."""
    packed = address.packed
    with Netlink(NETLINK_NETFILTER) as nl:
        doomed = []
        for tuple_kind, ip_kind, flags_kind, flag in (
                (CTA_TUPLE_ORIG, CTA_IP_V4_SRC, CTA_FILTER_ORIG_FLAGS, _FILTER_IP_SRC),
                (CTA_TUPLE_REPLY, CTA_IP_V4_DST, CTA_FILTER_REPLY_FLAGS, _FILTER_IP_DST)):
            wanted = attribute(tuple_kind | NLA_F_NESTED,
                               attribute(CTA_TUPLE_IP | NLA_F_NESTED, attribute(ip_kind, packed)))
            filter_ = attribute(CTA_FILTER | NLA_F_NESTED, attribute(flags_kind, struct.pack("=I", flag)))
            for entry in nl.request(_CT_GET, _nfgen() + wanted + filter_, NLM_F_DUMP):
                found = dict(attributes(entry[4:]))
                if CTA_TUPLE_ORIG in found:
                    doomed.append(attribute(CTA_TUPLE_ORIG | NLA_F_NESTED, found[CTA_TUPLE_ORIG])
                                  + (attribute(CTA_ZONE, found[CTA_ZONE]) if CTA_ZONE in found else b""))
        deleted = 0
        for key in dict.fromkeys(doomed):  # an entry matched by both dumps once
            try:
                nl.request(_CT_DELETE, _nfgen() + key)
                deleted += 1
            except NetlinkError as e:
                if e.errno != errno.ENOENT:  # gone meanwhile (timed out)
                    raise
        return deleted


def _nfgen() -> bytes:
    """nfgenmsg: IPv4, NFNETLINK_V0, resource id 0."""
    return struct.pack("=BBH", socket.AF_INET, 0, 0)
