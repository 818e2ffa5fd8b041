"""Which URLs a user may make corral touch: storage URLs of job files, and
completion callback targets. Pure functions over strings and addresses.

**Storage.** A job's `input_files[].from_url` and `output_files[].to_url` are
read and written by a worker with the worker's own rights, so each must lie
under one of the storage roots the deployment allows for the batch's billing
project (`StorageRoots`, templates such as
`file:///var/lib/corral/storage/{project}/`). A URL is accepted only in one
plain form that every fsspec backend reads the same way: `scheme://bucket/path`
(`file:///path`), with no host for `file`, no userinfo, port, query, fragment,
percent-encoding, backslash, control character, `::` (fsspec's URL chaining),
empty, `.` or `..` segment. Then scheme and bucket must equal the root's, and
the root's path segments must be a prefix of the URL's (so `/p/alice` is not
under `/p/al`). No roots: nothing is accepted. The job's spec and log URLs are
corral's own (`--spec-root-url`) and never come from a user.

**Callbacks.** A completion callback is POSTed by the driver from inside the
deployment's network, so its URL must be `http(s)://host[:port]/...` with no
userinfo, and every address of the host must be public: not loopback,
link-local (169.254.0.0/16 holds the cloud metadata service), private, shared
(CGNAT), unspecified, multicast, documentation, benchmarking or otherwise
reserved, nor an IPv4-mapped, NAT64 or 6to4 form of one; numeric hosts in any
form but dotted decimal (`2130706433`, `0x7f.1`, `127.1`) are refused outright.
`CallbackRules.allow_networks` lets an operator allow given networks.
Resolving names is I/O and lives in `services/common/callback_hosts.py`.
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import re
from collections.abc import Iterable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

PROJECT = "{project}"
"""Replaced by the billing project's name in a storage root template."""

STORAGE_SCHEMES = frozenset({"file", "gs", "gcs", "s3", "az", "abfs", "abfss"})
"""Schemes a storage root may use: local files and object stores (never http, which would make
workers fetch arbitrary URLs)."""

_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_SCHEME_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SENTINEL = "corral-project-placeholder"
# Each is refused anywhere in a storage URL: what fsspec backends or the OS
# may read in more than one way.
_STORAGE_REFUSALS = (
    ("\\", "backslashes are not accepted in storage URLs"),
    ("%", "percent-encoding is not accepted in storage URLs"),
    ("?", "a query ('?') is not accepted in storage URLs"),
    ("#", "a fragment ('#') is not accepted in storage URLs"),
    ("::", "chained URLs ('::') are not accepted"),
)


class RefusedUrl(ValueError):
    """A URL corral will not use; the message says why."""


# ------------------------------------------------------------------ storage


@dataclasses.dataclass(frozen=True)
class _Location:
    """A storage URL taken apart: scheme and bucket compared exactly, the path by segments."""

    scheme: str
    bucket: str
    segments: tuple[str, ...]

    def under(self, root: _Location) -> bool:
        return ((self.scheme, self.bucket) == (root.scheme, root.bucket)
                and self.segments[:len(root.segments)] == root.segments)


def _location(url: str) -> _Location:
    """Parse a storage URL in its one accepted form, or raise RefusedUrl saying what is wrong."""
    if _CONTROL.search(url):
        raise RefusedUrl("control characters (NUL, newline, tab, ...) are not accepted")
    if url != url.strip():
        raise RefusedUrl("leading or trailing spaces are not accepted")
    for bad, why in _STORAGE_REFUSALS:
        if bad in url:
            raise RefusedUrl(why)
    prefix = _SCHEME_PREFIX.match(url)
    if prefix is None:
        raise RefusedUrl("not a URL of the form scheme://bucket/path (file:///path for local files)")
    scheme = prefix.group(1)  # exactly: fsspec does not know FILE://
    bucket, slash, path = url[prefix.end():].partition("/")
    if "@" in bucket:
        raise RefusedUrl("userinfo ('user@') is not accepted in storage URLs")
    if ":" in bucket:
        raise RefusedUrl("a port is not accepted in storage URLs")
    if scheme == "file" and (bucket or not slash):
        raise RefusedUrl(f"a file:// URL names no host ({bucket!r}) and an absolute path: file:///absolute/path")
    if scheme != "file" and not bucket:
        raise RefusedUrl(f"a {scheme}:// URL names its bucket: {scheme}://bucket/path")
    segments = tuple(path.removesuffix("/").split("/")) if path else ()
    for segment in segments:
        if segment == "":
            raise RefusedUrl("empty path segments ('//') are not accepted")
        if segment in (".", ".."):
            raise RefusedUrl(f"'{segment}' path segments are not accepted (storage backends disagree on them)")
    return _Location(scheme, bucket, segments)


def _template_location(template: str) -> _Location:
    """A root template parsed with a placeholder for the project. ValueError if it is not a storage root."""
    rest = template.replace(PROJECT, "")
    if "{" in rest or "}" in rest:
        raise ValueError(f"storage root {template!r}: the only placeholder is {PROJECT}")
    prefix = _SCHEME_PREFIX.match(template)
    if prefix is None or PROJECT in template[:prefix.end()]:
        raise ValueError(f"storage root {template!r}: not a URL of the form scheme://bucket/path")
    try:
        location = _location(template.replace(PROJECT, _SENTINEL))
    except RefusedUrl as e:
        raise ValueError(f"storage root {template!r}: {e}") from None
    if location.scheme not in STORAGE_SCHEMES:
        raise ValueError(f"storage root {template!r}: {location.scheme!r} is not a storage scheme "
                         f"({', '.join(sorted(STORAGE_SCHEMES))})")
    return location


def _could_be(templated: str, name: str) -> bool:
    """Whether a bucket or segment of a template could, for some project, be `name`."""
    if _SENTINEL not in templated:
        return templated == name
    pattern = re.escape(templated).replace(re.escape(_SENTINEL), _PROJECT_NAME.pattern.strip("^$"))
    return re.fullmatch(pattern, name) is not None


@dataclasses.dataclass(frozen=True)
class StorageRoots:
    """The operator's storage roots: URL templates in which `{project}` stands for the billing project."""

    templates: tuple[str, ...] = ()
    """E.g. `file:///var/lib/corral/storage/{project}/`, `gs://bucket/corral/{project}/`; none: no files at all."""

    def __post_init__(self) -> None:
        for template in self.templates:
            _template_location(template)

    def for_project(self, project: str) -> tuple[str, ...]:
        """The roots of one billing project; none for a name that is not one plain path segment."""
        if not _PROJECT_NAME.match(project):
            return ()
        return tuple(t.replace(PROJECT, project) for t in self.templates)

    def check_apart_from(self, url: str, what: str = "the spec root") -> None:
        """Raise ValueError if some project's root could lie under `url` or hold it (the spec root
        holds every tenant's specs and logs), whatever the project is called."""
        if not self.templates:
            return
        other = _location(url)
        for template in self.templates:
            root = _template_location(template)
            # They overlap when one's segments could be a prefix of the other's for some project.
            clash = root.scheme == other.scheme and _could_be(root.bucket, other.bucket) and all(
                _could_be(mine, theirs) for mine, theirs in zip(root.segments, other.segments))
            if clash:
                raise ValueError(f"storage root {template!r} overlaps {what} {url!r}: users could read or "
                                 "overwrite what corral keeps there")


def storage_url_problem(url: str, roots: Sequence[str], project: str = "") -> str | None:
    """Why `url` may not be read or written by a job of `project`, whose roots are `roots`
    (`StorageRoots.for_project`); None if it may."""
    if not roots:
        whose = f" for billing project {project!r}" if project else ""
        return (f"no storage roots are configured{whose}: this deployment accepts no input or output files "
                "(operator setting --storage-root)")
    try:
        location = _location(url)
    except RefusedUrl as e:
        return str(e)
    if any(root is not None and location.under(root) for root in map(_root_location, roots)):
        return None
    return f"not under a storage root of the billing project ({', '.join(roots)})"


@functools.lru_cache(maxsize=1024)
def _root_location(root: str) -> _Location | None:
    """A root parsed once (a bunch checks thousands of URLs against the same few); None if malformed
    (sent by a driver of another version?): it holds nothing."""
    try:
        return _location(root)
    except RefusedUrl:
        return None


# ---------------------------------------------------------------- callbacks


def _networks(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# (networks, what an address there is), first match wins. Addresses of
# other hosts embedded in IPv6 (mapped, NAT64, 6to4) are judged by what they
# embed, before this table.
_FORBIDDEN: tuple[tuple[tuple[IPNetwork, ...], str], ...] = (
    (_networks("127.0.0.0/8", "::1/128"), "a loopback address"),
    (_networks("169.254.169.254/32", "fd00:ec2::254/128"), "the cloud metadata service's link-local address"),
    (_networks("169.254.0.0/16", "fe80::/10"), "a link-local address"),
    (_networks("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7", "64:ff9b:1::/48"), "a private address"),
    (_networks("100.64.0.0/10"), "a shared (carrier-grade NAT) address"),
    (_networks("0.0.0.0/8", "::/128"), "an unspecified address"),
    (_networks("224.0.0.0/4", "ff00::/8"), "a multicast address"),
    (_networks("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32", "3fff::/20"),
     "a documentation address"),
    (_networks("198.18.0.0/15"), "a benchmarking address"),
    (_networks("192.0.0.0/24", "192.88.99.0/24", "240.0.0.0/4", "::/96", "100::/64", "2001::/23", "fec0::/10"),
     "a reserved address"),
)
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_SIX_TO_FOUR = ipaddress.ip_network("2002::/16")


@dataclasses.dataclass(frozen=True)
class CallbackRules:
    """What callback targets an operator allows beyond the public Internet."""

    allow_networks: tuple[IPNetwork, ...] = ()
    """Networks callbacks may reach although they are not public (e.g. 10.0.0.0/8 for receivers
    inside the deployment, 127.0.0.0/8 for tests that receive callbacks on loopback)."""

    @classmethod
    def parse(cls, networks: Iterable[str]) -> CallbackRules:
        """From CIDR strings such as '10.0.0.0/8' (each may be a comma-separated list); ValueError if one is not."""
        found = []
        for item in networks:
            for cidr in filter(None, (c.strip() for c in item.split(","))):
                try:
                    found.append(ipaddress.ip_network(cidr))
                except ValueError as e:
                    raise ValueError(f"callback allow network {cidr!r}: {e}") from None
        return cls(tuple(found))

    def allows(self, address: IPAddress) -> bool:
        return any(address.version == n.version and address in n for n in self.allow_networks)


def _forbidden(address: IPAddress, rules: CallbackRules) -> str | None:
    """What kind of address `address` is when callbacks may not reach it; None when they may."""
    if rules.allows(address):
        return None
    if isinstance(address, ipaddress.IPv6Address):
        embedded = (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF) if address in _NAT64
                    else address.sixtofour if address in _SIX_TO_FOUR else None)
        if embedded is not None:
            what = _forbidden(embedded, rules)
            return None if what is None else f"{what} ({embedded}) in disguise"
    for networks, what in _FORBIDDEN:
        if any(address.version == n.version and address in n for n in networks):
            return what
    if isinstance(address, ipaddress.IPv6Address) and address not in _GLOBAL_UNICAST_V6:
        return "a reserved address (not IPv6 global unicast)"
    return None


def address_kind(address: IPAddress, rules: CallbackRules = CallbackRules()) -> str | None:
    """What kind of address callbacks may not reach `address` is (e.g. 'a loopback address');
    None if they may reach it."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        what = _forbidden(address.ipv4_mapped, rules)  # the same IPv4 host
        return None if what is None else f"{what} ({address.ipv4_mapped}, IPv4-mapped)"
    return _forbidden(address, rules)


def address_problem(address: IPAddress, rules: CallbackRules = CallbackRules()) -> str | None:
    """Why a callback may not connect to `address`, e.g. '127.0.0.1 is a loopback address'; None if it may."""
    what = address_kind(address, rules)
    return None if what is None else f"{address} is {what}"


@dataclasses.dataclass(frozen=True)
class CallbackTarget:
    """Where a callback URL points."""

    scheme: str
    """'http' or 'https'."""
    host: str
    """The host as written, lower case, without brackets: a name or an address."""
    port: int
    """The port, explicit or the scheme's default."""
    address: IPAddress | None
    """The host when it is an address literal; None for a name (to resolve)."""


_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_OCTET = r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(rf"^{_OCTET}(\.{_OCTET}){{3}}$")
_PORT = re.compile(r"^:[0-9]{1,5}$")


def parse_callback_url(url: str, rules: CallbackRules = CallbackRules()) -> CallbackTarget:
    """The target of a callback URL, or RefusedUrl saying why it may not be one. An address literal
    is checked here; a name's addresses are checked once resolved (`address_problem`)."""
    if _CONTROL.search(url) or " " in url or "\\" in url:
        raise RefusedUrl("spaces, control characters and backslashes are not accepted in callback URLs")
    prefix = _SCHEME_PREFIX.match(url)
    scheme = prefix.group(1).lower() if prefix else ""
    if prefix is None or scheme not in ("http", "https"):
        raise RefusedUrl("must be an http:// or https:// URL")
    authority = re.split(r"[/?#]", url[prefix.end():], maxsplit=1)[0]
    if "@" in authority:
        raise RefusedUrl("userinfo ('user@') is not accepted in callback URLs")
    if authority.startswith("["):
        host, bracket, port_text = authority[1:].partition("]")
        if not bracket:
            raise RefusedUrl("an IPv6 host is written [address]")
    else:
        host, colon, port_text = authority.partition(":")
        port_text = colon + port_text
    if port_text and not (_PORT.match(port_text) and 1 <= int(port_text[1:]) <= 65535):
        raise RefusedUrl("the port must be a number from 1 to 65535")
    port = int(port_text[1:]) if port_text else (443 if scheme == "https" else 80)
    host = host.lower()
    if not host:
        raise RefusedUrl("a callback URL names a host")
    address: IPAddress
    if authority.startswith("["):
        if "%" in host:
            raise RefusedUrl("IPv6 zone identifiers are not accepted in callback URLs")
        try:
            address = ipaddress.IPv6Address(host)
        except ValueError:
            raise RefusedUrl(f"[{host}] is not an IPv6 address") from None
    else:
        name = host.removesuffix(".")
        labels = name.split(".")
        if _NUMERIC_LABEL.match(labels[-1]):
            # What WHATWG URL parsers (and inet_aton) read as IPv4: only one spelling is accepted.
            if not _DOTTED_QUAD.match(host):
                raise RefusedUrl(f"numeric host {host!r} is not written as four decimal numbers (a.b.c.d)")
            address = ipaddress.IPv4Address(host)
        else:
            if len(name) > 253 or not all(_LABEL.match(label) for label in labels):
                raise RefusedUrl(f"host {host!r} is not a valid host name (letters, digits, '-', '_'; "
                                 "internationalized names in their xn-- form)")
            if labels[-1] == "localhost":
                raise RefusedUrl(f"host {host!r} is this machine (localhost)")
            return CallbackTarget(scheme, host, port, None)
    if problem := address_problem(address, rules):
        raise RefusedUrl(problem)
    return CallbackTarget(scheme, host, port, address)
