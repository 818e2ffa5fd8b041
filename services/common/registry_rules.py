"""Which registries a job's image may come from. Pure functions over registry names and addresses.

A worker pulls a job's image from inside the deployment's network, with the worker's own network
position: a reference such as `127.0.0.1:22/x` or `169.254.169.254/latest` would make it knock on
the host's own ports or the cloud's metadata server, and tell the user what answered. So a job's
image may come only from

- a **public** registry: its host is a name or an address, and every address it has is public (not
  loopback, link-local, private, shared, unspecified, multicast, reserved: the rule callbacks follow,
  `services.common.urls.address_kind`, IPv4 hidden in IPv6 forms included), or
- a registry the **deployment names** (`RegistryRules.configured`): its own registry (`--own-registry`,
  `corral up`'s; references also name it `localhost/...`), its mirrors (`--registry-mirror`) and the
  operator's `--allowed-registries`, compared as references write them (`host[:port]`, the host in any
  case): `10.0.0.5:5000` allows that port of that host and no other.

`localhost` exactly (no port) is corral's own registry, never this machine: allowed when the deployment
has one (the worker pulls it from the own registry's address), refused when it has none.
Refused outright, whatever DNS says: `localhost:PORT` and names under `.localhost`; the cloud metadata
servers' names (`metadata.google.internal` ...); numeric hosts not written as four decimal numbers
(`2130706433`, `0x7f.1`, `127.1`: resolvers read them as IPv4 addresses). Resolving a name is the
callers' I/O (`services.frontend.image_checks`, `services.worker.egress`): they pass its addresses
to `refusal`, and a name is refused if any of them is.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections.abc import Iterable, Sequence

from services.common.image_refs import OWN_REGISTRY, InvalidImageReference, Mirror, Registry
from services.common.urls import IPAddress, address_kind

METADATA_NAMES = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                            "instance-data.ec2.internal"})
"""Names of cloud metadata servers (Google Cloud's, AWS's), refused even where they do not resolve."""

ALLOWED_HINT = "a job's image comes from a public registry, or from one this deployment allows (ask its operator)"
"""What every refusal adds: what the user may do instead."""

_EMBEDDED = re.compile(r" \([0-9a-f.:]+(, IPv4-mapped)?\)( in disguise)?")
"""How `address_kind` names the IPv4 address an IPv6 one carries."""
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")
_DOTTED_QUAD = re.compile(r"^(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$")


@dataclasses.dataclass(frozen=True)
class RegistryHost:
    """A registry as references name it (`host[:port]`), taken apart."""

    registry: str
    """As written: `registry.example.com`, `10.0.0.5:5000`, `[fd00::1]:5000`."""
    host: str
    """The host, lower case, without brackets or a trailing dot: a name or an address."""
    port: int
    """Its port, or 443 (a registry without one is reached over HTTPS)."""
    address: IPAddress | None
    """The host when it is an address (IPv4 in dotted decimal, or bracketed IPv6); None for a name."""

    @classmethod
    def parse(cls, registry: str) -> RegistryHost:
        """Take `registry` (the host[:port] part of a reference) apart; InvalidImageReference if it is not
        one (`Registry.parse` is the grammar)."""
        registry = Registry.parse(registry).host  # canonical: docker.io however it is written
        if registry.startswith("["):
            inside, _, rest = registry[1:].partition("]")
            port_text = rest.removeprefix(":")
            try:
                address: IPAddress | None = ipaddress.IPv6Address(inside)
            except ValueError:
                raise InvalidImageReference(f"registry {registry!r}: [{inside}] is not an IPv6 address") from None
            host = inside.lower()
        else:
            host, _, port_text = registry.partition(":")
            host = host.lower().removesuffix(".")
            address = ipaddress.IPv4Address(host) if _DOTTED_QUAD.match(host) else None
        port = int(port_text) if port_text else 443
        if not 0 < port < 65536:
            raise InvalidImageReference(f"registry {registry!r}: port {port} is not 1 to 65535")
        return cls(registry, host, port, address)

    @property
    def key(self) -> str:
        """What tells registries apart: `host:port`, the host in lower case."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclasses.dataclass(frozen=True)
class RegistryRules:
    """The registries a deployment names: allowed whatever their addresses."""

    configured: frozenset[str] = frozenset()
    """`RegistryHost.key` of each: the own registry, the mirrors and the allowed registries."""
    has_own: bool = False
    """Whether the deployment has a registry of its own (what `localhost/...` names)."""

    @classmethod
    def of(cls, own_registry: str | None = None, allowed: Iterable[str] = (),
           mirrors: Iterable[Mirror] = ()) -> RegistryRules:
        """From the own registry (a URL, as `Registry.parse` reads it), allowed registries (`host[:port]` or
        URLs; each item may be a comma-separated list) and mirrors. ValueError naming an entry that is not a
        registry."""
        keys = []
        entries = [own_registry] if own_registry else []
        entries += [entry.strip() for item in allowed for entry in item.split(",") if entry.strip()]
        entries += [mirror.endpoint.host for mirror in mirrors]
        for entry in entries:
            try:
                keys.append(RegistryHost.parse(Registry.parse(entry).host).key)
            except InvalidImageReference as e:
                raise ValueError(f"allowed registry {entry!r}: {e}") from None
        return cls(frozenset(keys), own_registry is not None)

    def names(self, registry: RegistryHost) -> bool:
        """Whether the deployment names this registry."""
        return registry.key in self.configured


def _what_name_is(host: str) -> str | None:
    """What a host name is when its name alone refuses it."""
    labels = host.split(".")
    if labels[-1] == "localhost":
        return "this machine (localhost)"
    if host in METADATA_NAMES:
        return "a cloud metadata server"
    if _NUMERIC_LABEL.match(labels[-1]):
        return "a numeric host not written as four decimal numbers (a.b.c.d)"
    return None


def needs_lookup(registry: RegistryHost, rules: RegistryRules) -> bool:
    """Whether `refusal` needs the addresses of the registry's host: a name the deployment does not name and
    that its name alone does not refuse."""
    return registry.address is None and not rules.names(registry) and _what_name_is(registry.host) is None \
        and registry.registry != OWN_REGISTRY


def refusal(registry: RegistryHost, rules: RegistryRules, addresses: Sequence[IPAddress] = ()) -> str | None:
    """Why a job's image may not come from `registry`, in the user's words; None if it may. `addresses`: what
    its host name resolves to (see `needs_lookup`); each must be public. The answer never says which address
    a name resolves to (that is the deployment's, not the user's, business)."""
    if registry.registry == OWN_REGISTRY:
        return None if rules.has_own else (f"{OWN_REGISTRY}/... names corral's own registry, and this deployment "
                                           "has none")
    if rules.names(registry):
        return None
    if registry.address is not None:
        kind = address_kind(registry.address)
        return None if kind is None else f"registry {registry.registry} is {_plain(kind)}: {ALLOWED_HINT}"
    if (what := _what_name_is(registry.host)) is not None:
        return f"registry {registry.registry} is {what}: {ALLOWED_HINT}"
    for address in addresses:
        if (kind := address_kind(address)) is not None:
            return f"registry {registry.registry} resolves to {_plain(kind)}: {ALLOWED_HINT}"
    return None


def _plain(kind: str) -> str:
    """`address_kind`'s words without the address it may embed ("a loopback address (127.0.0.1,
    IPv4-mapped)" is "a loopback address")."""
    return _EMBEDDED.sub("", kind)
