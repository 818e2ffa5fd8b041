"""Which URLs users may make corral touch (services/common/urls.py): storage
URLs under the project's roots, callback targets on the public Internet."""

from __future__ import annotations

import ipaddress
import posixpath
from urllib.parse import urlsplit

import fsspec
import httpx
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from services.common.urls import (
    CallbackRules,
    RefusedUrl,
    StorageRoots,
    address_kind,
    address_problem,
    parse_callback_url,
    storage_url_problem,
)

ROOTS = StorageRoots(("file:///srv/storage/{project}/", "gs://bucket/corral/{project}/"))
ALICE = ROOTS.for_project("alice")

# ------------------------------------------------------------------ storage: examples


@pytest.mark.parametrize("url", [
    "file:///srv/storage/alice/ref.fa",
    "file:///srv/storage/alice/deep/dir/",
    "file:///srv/storage/alice",
    "gs://bucket/corral/alice/sample 7.bam",
])
def test_urls_under_the_projects_roots_are_accepted(url: str) -> None:
    assert storage_url_problem(url, ALICE, "alice") is None


@pytest.mark.parametrize("url, why", [
    ("file:///srv/certs/ca.key", "not under a storage root"),
    ("file:///srv/storage/alice/../bob/x", "'..' path segments"),
    ("file:///srv/storage/alice/./x", "'.' path segments"),
    ("file:///srv/storage/alice/%2e%2e/bob", "percent-encoding"),
    ("file:///srv/storage/alice%2F..%2Fbob", "percent-encoding"),
    ("file:///srv/storage/alice/..\\bob", "backslashes"),
    ("file:///srv/storage/alice/x\x00.txt", "control characters"),
    ("file://host/srv/storage/alice/x", "names no host"),
    ("file://localhost/srv/storage/alice/x", "names no host"),
    ("file:/srv/storage/alice/x", "not a URL of the form"),
    ("/srv/storage/alice/x", "not a URL of the form"),
    ("file:////srv/storage/alice/x", "empty path segments"),
    ("file:///srv/storage/alice//x", "empty path segments"),
    ("file:///srv/storage/alice2/x", "not under a storage root"),
    ("file:///srv/storage/alic", "not under a storage root"),
    ("file:///srv/storage/alice/x?version=2", "a query"),
    ("file:///srv/storage/alice/x#frag", "a fragment"),
    ("simplecache::file:///srv/storage/alice/x", "chained URLs"),
    ("file:///srv/storage/alice/x::gs://bucket/y", "chained URLs"),
    ("local:///srv/storage/alice/x", "names its bucket"),
    ("local://srv/storage/alice/x", "not under a storage root"),
    ("gs://user@bucket/corral/alice/x", "userinfo"),
    ("gs://bucket:443/corral/alice/x", "a port"),
    ("gs://other/corral/alice/x", "not under a storage root"),
    ("gcs://bucket/corral/alice/x", "not under a storage root"),
    ("FILE:///srv/storage/alice/x", "names its bucket"),
    (" file:///srv/storage/alice/x", "leading or trailing spaces"),
])
def test_urls_outside_the_roots_or_in_a_tricky_form_are_refused(url: str, why: str) -> None:
    problem = storage_url_problem(url, ALICE, "alice")
    assert problem is not None and why in problem


def test_a_malformed_root_holds_nothing() -> None:
    assert storage_url_problem("file:///srv/x", ["file:///srv/../", "file://host/srv/"]) == (
        "not under a storage root of the billing project (file:///srv/../, file://host/srv/)")


def test_without_roots_nothing_is_accepted_and_the_error_says_so() -> None:
    problem = storage_url_problem("file:///srv/storage/alice/x", StorageRoots().for_project("alice"), "alice")
    assert problem == ("no storage roots are configured for billing project 'alice': this deployment accepts no "
                       "input or output files (operator setting --storage-root)")


@pytest.mark.parametrize("project", ["", "../x", "a/b", ".hidden", "a\x00", "{project}", "-x", "a%2fb"])
def test_a_project_name_that_is_not_one_plain_segment_gets_no_roots(project: str) -> None:
    assert ROOTS.for_project(project) == ()


@pytest.mark.parametrize("template, why", [
    ("http://example.com/{project}/", "not a storage scheme"),
    ("file://host/srv/{project}/", "names no host"),
    ("file:///srv/{proj}/", "the only placeholder"),
    ("{project}:///srv/", "not a URL"),
    ("file:///srv/../{project}/", "'..' path segments"),
    ("srv/{project}", "not a URL"),
])
def test_malformed_root_templates_are_refused_at_start(template: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        StorageRoots((template,))


@pytest.mark.parametrize("template, spec_root, clash", [
    ("file:///data/storage/{project}/", "file:///data/blobs", False),
    ("file:///data/{project}/", "file:///data/blobs", True),  # a project named 'blobs'
    ("file:///data/", "file:///data/blobs", True),
    ("file:///data/blobs/{project}/", "file:///data", True),
    ("file:///data/p-{project}/", "file:///data/blobs", False),
    ("file:///data/p-{project}/", "file:///data/p-blobs/x", True),
    ("file:///srv/{project}/in", "file:///srv/blobs/specs", False),
    ("gs://{project}/", "gs://specs/x", True),
    ("gs://c-{project}/", "gs://specs/x", False),
    ("gs://b/{project}/", "file:///data", False),
])
def test_roots_may_not_overlap_the_spec_root(template: str, spec_root: str, clash: bool) -> None:
    roots = StorageRoots((template,))
    if clash:
        with pytest.raises(ValueError, match="overlaps the spec root|any bucket"):
            roots.check_apart_from(spec_root)
    else:
        roots.check_apart_from(spec_root)


# ---------------------------------------------------------------- storage: properties

_TRICKY = st.text(alphabet=list("ab/.%2fF5c\\?#@:~ \x00\t"), max_size=24)
_SEGMENT = st.text(alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), whitelist_characters="-_ "),
                   min_size=1, max_size=8).filter(lambda s: s.strip() == s and s not in (".", ".."))
_PROJECT = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,10}", fullmatch=True)


@given(prefix=st.sampled_from(["file:///srv/storage/alice", "file:///srv/storage/", "file://", "file:",
                               "FILE:///srv/storage/alice/", "file://localhost/srv/storage/alice/", "local://",
                               "file:///srv/storage/alice/..", ""]),
       suffix=_TRICKY)
@example(prefix="file:///srv/storage/alice", suffix="/../bob")
@example(prefix="file:///srv/storage/alice", suffix="2/x")
def test_an_accepted_local_url_reaches_a_path_under_the_root_whichever_way_it_is_read(prefix: str,
                                                                                        suffix: str) -> None:
    url = prefix + suffix
    if storage_url_problem(url, ALICE) is not None:
        return
    # What the worker's copy will touch: fsspec's path, as the OS resolves it, is the same
    # path without resolving anything, and it lies under the root segment by segment.
    fs, path = fsspec.core.url_to_fs(url)
    assert fs.protocol[0] in ("file", "local")
    assert posixpath.normpath(path) == path.rstrip("/")
    assert (path + "/").startswith("/srv/storage/alice/")


@given(segments=st.lists(_SEGMENT, max_size=5), trailing=st.booleans())
def test_every_plain_path_under_a_root_is_accepted(segments: list[str], trailing: bool) -> None:
    url = "gs://bucket/corral/alice/" + "/".join(segments) + ("/" if trailing and segments else "")
    assert storage_url_problem(url, ALICE) is None


@given(a=_PROJECT, b=_PROJECT, segments=st.lists(_SEGMENT, max_size=4))
def test_no_url_under_one_projects_root_is_under_anothers(a: str, b: str, segments: list[str]) -> None:
    assume(a != b)
    for root in ROOTS.for_project(b):
        url = root + "/".join(segments)
        assert storage_url_problem(url, ROOTS.for_project(b)) is None
        assert storage_url_problem(url, ROOTS.for_project(a)) is not None


# ---------------------------------------------------------------- callbacks: examples


@pytest.mark.parametrize("url, why", [
    ("http://127.0.0.1:8080/done", "127.0.0.1 is a loopback address"),
    ("http://169.254.169.254/latest/meta-data/", "the cloud metadata service's link-local address"),
    ("http://[fd00:ec2::254]/", "the cloud metadata service's link-local address"),
    ("http://10.1.2.3/", "10.1.2.3 is a private address"),
    ("http://172.16.0.1/", "a private address"),
    ("http://192.168.1.1/", "a private address"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0/", "an unspecified address"),
    ("http://[::]/", "an unspecified address"),
    ("http://[::1]/", "a loopback address"),
    ("http://[fe80::1]/", "a link-local address"),
    ("http://[fc00::1]/", "a private address"),
    ("http://224.0.0.1/", "a multicast address"),
    ("http://255.255.255.255/", "a reserved address"),
    ("http://[::ffff:127.0.0.1]/", "a loopback address (127.0.0.1, IPv4-mapped)"),
    ("http://[::ffff:a9fe:a9fe]/", "metadata"),
    ("http://[64:ff9b::a00:1]/", "a private address (10.0.0.1) in disguise"),
    ("http://[2002:7f00:1::]/", "a loopback address (127.0.0.1) in disguise"),
    ("http://2130706433/", "not written as four decimal numbers"),
    ("http://0x7f.1/", "not written as four decimal numbers"),
    ("http://127.1/", "not written as four decimal numbers"),
    ("http://0177.0.0.1/", "not written as four decimal numbers"),
    ("http://127.0.0.1./", "not written as four decimal numbers"),
    ("http://localhost:8080/", "this machine"),
    ("http://LOCALHOST./", "this machine"),
    ("http://app.localhost/", "this machine"),
    ("http://user:pw@example.com/", "userinfo"),
    ("http://example.com@127.0.0.1/", "userinfo"),
    ("http://example.com\\@127.0.0.1/", "backslashes"),
    ("http://example.com:0/", "the port"),
    ("http://example.com:65536/", "the port"),
    ("http://example.com:+80/", "the port"),
    ("http://example.com:/", "the port"),
    ("http://[fe80::1%25eth0]/", "zone identifiers"),
    ("ftp://example.com/", "http:// or https://"),
    ("file:///etc/passwd", "http:// or https://"),
    ("//example.com/x", "http:// or https://"),
    ("http:///x", "names a host"),
    ("http://exa mple.com/", "spaces"),
    ("http://bücher.example/", "xn-- form"),
])
def test_callbacks_to_hosts_inside_the_deployment_are_refused(url: str, why: str) -> None:
    with pytest.raises(RefusedUrl, match=why.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_callback_url(url)


@pytest.mark.parametrize("url, host, port", [
    ("https://hooks.example.com/corral?token=abc", "hooks.example.com", 443),
    ("http://Hooks.Example.COM:8080/x", "hooks.example.com", 8080),
    ("http://93.184.215.14/", "93.184.215.14", 80),
    ("https://[2606:4700:4700::1111]:8443/", "2606:4700:4700::1111", 8443),
    ("http://[::ffff:93.184.215.14]/", "::ffff:93.184.215.14", 80),
    ("http://xn--bcher-kva.example/", "xn--bcher-kva.example", 80),
])
def test_public_callback_targets_are_accepted(url: str, host: str, port: int) -> None:
    target = parse_callback_url(url)
    assert (target.host, target.port) == (host, port)


def test_an_operator_may_allow_networks() -> None:
    rules = CallbackRules.parse(["10.0.0.0/8,127.0.0.0/8", "fd00::/8"])
    assert parse_callback_url("http://127.0.0.1:9/", rules).port == 9
    assert parse_callback_url("http://[::ffff:10.2.3.4]/", rules).address is not None
    assert parse_callback_url("http://[fd00::5]/", rules).address is not None
    with pytest.raises(RefusedUrl, match="link-local"):
        parse_callback_url("http://169.254.169.254/", rules)
    with pytest.raises(ValueError, match="'10.0.0.0/33'"):
        CallbackRules.parse(["10.0.0.0/33"])


# ---------------------------------------------------------------- callbacks: properties

_V4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)
_V6 = st.integers(0, 2**128 - 1).map(ipaddress.IPv6Address)
_FORBIDDEN_V4 = st.sampled_from(["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16",
                                 "100.64.0.0/10", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4"]).flatmap(
    lambda cidr: st.integers(0, ipaddress.ip_network(cidr).num_addresses - 1).map(
        lambda i: ipaddress.ip_network(cidr)[i]))


def _disguises(v4: ipaddress.IPv4Address) -> list[str]:
    n = int(v4)
    return [f"[::ffff:{v4}]", f"[{ipaddress.IPv6Address((0x64FF9B << 96) | n)}]",
            f"[{ipaddress.IPv6Address((0x2002 << 112) | (n << 80))}]"]


@given(v4=_FORBIDDEN_V4)
def test_a_forbidden_ipv4_address_is_refused_in_every_form(v4: ipaddress.IPv4Address) -> None:
    for host in [str(v4), *_disguises(v4)]:
        with pytest.raises(RefusedUrl):
            parse_callback_url(f"http://{host}/done")
    network = ipaddress.ip_network(f"{v4}/32")
    for host in [str(v4), f"[::ffff:{v4}]"]:
        parse_callback_url(f"http://{host}/done", CallbackRules((network,)))


@given(v4=st.tuples(st.integers(1, 223), *[st.integers(0, 255)] * 3).map(
    lambda octets: ipaddress.IPv4Address(".".join(map(str, octets)))))
def test_public_ipv4_addresses_are_accepted_plain_or_mapped(v4: ipaddress.IPv4Address) -> None:
    assume(address_kind(v4) is None)
    for host in [str(v4), *_disguises(v4)]:
        assert parse_callback_url(f"https://{host}:8443/x").port == 8443


@given(v4=_V4, spelling=st.sampled_from(["int", "hex", "octal", "short", "hex-octets"]))
def test_numeric_hosts_are_accepted_only_as_four_decimal_numbers(v4: ipaddress.IPv4Address, spelling: str) -> None:
    n, octets = int(v4), str(v4).split(".")
    host = {"int": str(n), "hex": hex(n), "octal": ".".join("0" + o for o in octets),
            "short": f"{octets[0]}.{n & 0xFFFFFF}", "hex-octets": ".".join(hex(int(o)) for o in octets)}[spelling]
    with pytest.raises(RefusedUrl):
        parse_callback_url(f"http://{host}/", CallbackRules((ipaddress.ip_network("0.0.0.0/0"),)))


@given(address=st.one_of(_V4, _V6))
def test_at_least_as_strict_as_the_standard_library(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> None:
    # Python's is_global is wrong about IPv4-mapped and NAT64 addresses on
    # some versions; those are judged by the IPv4 address they carry.
    assume(not (isinstance(address, ipaddress.IPv6Address)
                and (address.ipv4_mapped or address in ipaddress.ip_network("64:ff9b::/96"))))
    if not address.is_global or address.is_multicast:
        assert address_problem(address) is not None


_URL_CHARS = st.text(alphabet=list("htps:/[]@.%\\?#1270x:fe8a-_ZAexmplco") + ["\x00", "\t", "ü"], max_size=30)


@given(tail=_URL_CHARS, head=st.sampled_from(["http://", "https://", "HTTP://", "http:/", ""]))
@example(head="http://", tail="a.example@127.0.0.1/")
@example(head="http://", tail="[::1]:80@x/")
def test_an_accepted_callback_url_means_the_same_host_and_port_to_every_parser(head: str, tail: str) -> None:
    url = head + tail
    try:
        target = parse_callback_url(url, CallbackRules((ipaddress.ip_network("0.0.0.0/0"),
                                                        ipaddress.ip_network("::/0"))))
    except RefusedUrl:
        return
    parsed = httpx.URL(url)
    assert (parsed.host, parsed.port or target.port) == (target.host, target.port)
    split = urlsplit(url)
    assert (split.hostname, split.port or target.port) == (target.host, target.port)
