"""Which registries a job's image may come from (services.common.registry_rules, issue 33 part 6):
examples of each refusal, and properties over generated addresses: every address of a refused range
is refused however it is written, every public one is allowed, and a registry the deployment names is
allowed whatever its address. docs/security.md: "What must not happen" (an image reference makes a worker
probe the host) and *Images: where a job's image may come from*."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from services.common.image_refs import InvalidImageReference, Mirror, parse_reference
from services.common.registry_rules import RegistryHost, RegistryRules, needs_lookup, refusal
from services.common.urls import address_kind

NONE = RegistryRules()


def refused(registry: str, rules: RegistryRules = NONE, addresses: tuple[str, ...] = ()) -> str | None:
    return refusal(RegistryHost.parse(registry), rules, [ipaddress.ip_address(a) for a in addresses])


@pytest.mark.parametrize(("registry", "words"), [
    # The probes: the host's ssh port, a service of its own, the metadata server.
    ("127.0.0.1:22", "registry 127.0.0.1:22 is a loopback address"),
    ("127.0.0.1:18443", "is a loopback address"),
    ("169.254.169.254", "is the cloud metadata service's link-local address"),
    ("169.254.1.1:80", "is a link-local address"),
    ("10.1.2.3:5000", "is a private address"),
    ("172.16.0.1", "is a private address"),
    ("192.168.1.1", "is a private address"),
    ("100.64.0.1", "is a shared (carrier-grade NAT) address"),
    ("0.0.0.0:5000", "is an unspecified address"),
    ("[::1]:5000", "is a loopback address"),
    ("[fe80::1]", "is a link-local address"),
    ("[fd00::1]:5000", "is a private address"),
    ("[::ffff:127.0.0.1]:5000", "is a loopback address"),
    ("[::ffff:169.254.169.254]", "is the cloud metadata service's link-local address"),
    ("localhost:5000", "is this machine (localhost)"),
    ("registry.localhost", "is this machine (localhost)"),
    ("metadata.google.internal", "is a cloud metadata server"),
    ("metadata:80", "is a cloud metadata server"),
    ("metadata.goog", "is a cloud metadata server"),
    ("instance-data.ec2.internal", "is a cloud metadata server"),
    ("2130706433:5000", "a numeric host not written as four decimal numbers"),
    ("0x7f000001", "a numeric host"),
    ("127.1:5000", "a numeric host"),
])
def test_internal_registries_are_refused_saying_why(registry: str, words: str) -> None:
    why = refused(registry)
    assert why is not None and words in why, why
    assert "a job's image comes from a public registry, or from one this deployment allows" in why
    # Named by the deployment, each is allowed.
    assert refused(registry, RegistryRules.of(None, [registry])) is None


def test_a_name_is_refused_if_any_of_its_addresses_is_without_saying_which() -> None:
    assert refused("registry.example.com", addresses=("93.184.215.14",)) is None
    why = refused("registry.example.com", addresses=("93.184.215.14", "10.0.0.7"))
    assert why is not None and why.startswith("registry registry.example.com resolves to a private address")
    assert "10.0.0.7" not in why
    assert "169.254" not in (refused("evil.example", addresses=("169.254.169.254",)) or "")


def test_what_needs_a_lookup() -> None:
    rules = RegistryRules.of("http://127.0.0.1:5000", ["registry.corp:5000"])
    assert needs_lookup(RegistryHost.parse("ghcr.io"), rules)
    assert not needs_lookup(RegistryHost.parse("registry.corp:5000"), rules)  # named: no address matters
    assert needs_lookup(RegistryHost.parse("registry.corp:5001"), rules)  # another port is another registry
    assert not needs_lookup(RegistryHost.parse("8.8.8.8"), rules)
    assert not needs_lookup(RegistryHost.parse("localhost"), rules)


def test_the_own_mirror_and_allowed_registries_are_compared_as_references_name_them() -> None:
    rules = RegistryRules.of("http://127.0.0.1:5000/", ["Registry.Corp:5000, [fd00::5]:443", "https://10.0.0.9"])
    for allowed in ("127.0.0.1:5000", "registry.corp:5000", "REGISTRY.CORP:5000", "[fd00::5]", "[fd00::5]:443",
                    "10.0.0.9", "10.0.0.9:443"):
        assert refused(allowed, rules) is None, allowed
    for other in ("127.0.0.1:5001", "127.0.0.1", "10.0.0.9:5000", "[fd00::6]"):
        assert refused(other, rules) is not None, other
    assert refused("registry.corp", rules, ("10.0.0.1",)) is not None  # port 443, not the allowed 5000
    with pytest.raises(ValueError, match="allowed registry 'http://host/path'"):
        RegistryRules.of(None, ["http://host/path"])


def test_docker_hub_is_one_registry_however_it_is_written() -> None:
    assert RegistryHost.parse("index.docker.io").key == RegistryHost.parse("docker.io").key == "docker.io:443"
    assert parse_reference("index.docker.io/ubuntu").registry == "docker.io"
    assert parse_reference("busybox").registry == parse_reference("team/tool:1").registry == "docker.io"
    assert parse_reference("127.0.0.1:22/x").registry == "127.0.0.1:22"
    with pytest.raises(InvalidImageReference):
        parse_reference("BusyBox")


def test_localhost_is_corrals_own_registry_never_this_machine() -> None:
    own = RegistryRules.of("http://127.0.0.1:5000")
    assert refused("localhost", own) is None  # the worker asks 127.0.0.1:5000, never localhost
    assert not needs_lookup(RegistryHost.parse("localhost"), own)
    why = refused("localhost")
    assert why is not None and "names corral's own registry, and this deployment has none" in why
    for host in ("localhost:5000", "localhost:443", "registry.localhost"):  # this machine, own registry or not
        assert "this machine (localhost)" in (refused(host, own) or "")


def test_mirrors_are_named_by_the_deployment() -> None:
    rules = RegistryRules.of(None, (), [Mirror.parse("docker.io=http://10.0.0.7:5000/docker.io"),
                                        Mirror.parse("ghcr.io=https://mirror.corp")])
    assert refused("10.0.0.7:5000", rules) is None
    assert refused("mirror.corp", rules, ("10.0.0.8",)) is None
    assert refused("10.0.0.7:5001", rules) is not None


@pytest.mark.parametrize("registry", ["host:0", "host:65536", "[zz::1]"])
def test_a_registry_that_is_not_one_is_an_invalid_reference(registry: str) -> None:
    with pytest.raises(InvalidImageReference):
        RegistryHost.parse(registry)


# ---------------------------------------------------------------- properties

_REFUSED_V4 = st.sampled_from(["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                               "100.64.0.0/10", "0.0.0.0/8"]).flatmap(
    lambda cidr: st.integers(0, ipaddress.ip_network(cidr).num_addresses - 1).map(
        lambda i: ipaddress.ip_network(cidr)[i]))
_REFUSED_V6 = st.sampled_from(["::1/128", "fe80::/10", "fc00::/7", "::/128"]).flatmap(
    lambda cidr: st.integers(0, ipaddress.ip_network(cidr).num_addresses - 1).map(
        lambda i: ipaddress.ip_network(cidr)[i]))
_PORT = st.none() | st.integers(1, 65535)


def _registry(host: str, port: int | None) -> str:
    return host + (f":{port}" if port else "")


@given(v4=_REFUSED_V4, port=_PORT)
def test_every_loopback_link_local_private_or_unspecified_ipv4_address_is_refused_in_every_form(
        v4: ipaddress.IPv4Address, port: int | None) -> None:
    for host in (str(v4), f"[::ffff:{v4}]", f"[{ipaddress.IPv6Address((0x64FF9B << 96) | int(v4))}]"):
        assert refused(_registry(host, port)) is not None, host
        assert refused("name.example", addresses=(str(v4),)) is not None
        assert refused(_registry(host, port), RegistryRules.of(None, [_registry(host, port)])) is None


@given(v6=_REFUSED_V6, port=_PORT)
def test_every_refused_ipv6_address_is_refused(v6: ipaddress.IPv6Address, port: int | None) -> None:
    assert refused(_registry(f"[{v6}]", port)) is not None
    assert refused("name.example", addresses=(str(v6),)) is not None


@given(v4=st.tuples(st.integers(1, 223), *[st.integers(0, 255)] * 3).map(
    lambda octets: ipaddress.IPv4Address(".".join(map(str, octets)))), port=_PORT)
def test_every_global_address_is_allowed(v4: ipaddress.IPv4Address, port: int | None) -> None:
    assume(v4.is_global and address_kind(v4) is None)
    assert refused(_registry(str(v4), port)) is None
    assert refused("name.example", addresses=(str(v4),)) is None


@given(v6=st.integers(0x2000 << 112, (0x4000 << 112) - 1).map(ipaddress.IPv6Address))
def test_every_global_ipv6_address_is_allowed(v6: ipaddress.IPv6Address) -> None:
    assume(address_kind(v6) is None)
    assert refused(f"[{v6}]:5000") is None


@given(address=st.one_of(st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address),
                         st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)), port=_PORT)
def test_a_registry_the_deployment_names_is_allowed_whatever_its_address(
        address: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int | None) -> None:
    host = str(address) if address.version == 4 else f"[{address}]"
    rules = RegistryRules.of(None, [_registry(host, port)])
    assert refused(_registry(host, port), rules) is None
    assert refused(_registry("registry.example", port), RegistryRules.of(None, [_registry("registry.example", port)]),
                   (str(address),)) is None


@given(n=st.integers(0, 2**32 - 1), spelling=st.sampled_from(["int", "hex", "short"]))
def test_numeric_hosts_are_refused_unless_written_as_four_decimal_numbers(n: int, spelling: str) -> None:
    v4 = ipaddress.IPv4Address(n)
    octets = str(v4).split(".")
    host = {"int": str(n), "hex": hex(n), "short": f"{octets[0]}.{n & 0xFFFFFF}"}[spelling]
    assert "a numeric host" in (refused(f"{host}:5000") or "")
