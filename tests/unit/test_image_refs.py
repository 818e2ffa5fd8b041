"""Image references: how a job's `image` resolves (services.common.image_refs), the examples of its
docstring, the mistakes it refuses, and properties over generated references."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from services.common.image_refs import ImageReference, InvalidImageReference, Registry, parse_reference

DEFAULT = "http://127.0.0.1:5000"
DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(("text", "expected"), [
    ("busybox", ImageReference("127.0.0.1:5000", "busybox", "latest")),
    ("busybox:1.36", ImageReference("127.0.0.1:5000", "busybox", "1.36")),
    ("team/tool:v2", ImageReference("127.0.0.1:5000", "team/tool", "v2")),
    (f"busybox@{DIGEST}", ImageReference("127.0.0.1:5000", "busybox", None, DIGEST)),
    (f"busybox:1.36@{DIGEST}", ImageReference("127.0.0.1:5000", "busybox", "1.36", DIGEST)),
    ("127.0.0.1:5000/busybox", ImageReference("127.0.0.1:5000", "busybox", "latest")),
    ("localhost/busybox:x", ImageReference("localhost", "busybox", "x")),
    ("localhost:8080/a/b/c", ImageReference("localhost:8080", "a/b/c", "latest")),
    ("ghcr.io/org/tool:1.0-rc_1", ImageReference("ghcr.io", "org/tool", "1.0-rc_1")),
    ("[::1]:5000/busybox", ImageReference("[::1]:5000", "busybox", "latest")),
    # Docker Hub's official images live under library/, whichever way docker.io is written.
    ("docker.io/ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04")),
    ("index.docker.io/ubuntu", ImageReference("docker.io", "library/ubuntu", "latest")),
    ("docker.io/library/ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04")),
    ("docker.io/someone/tool", ImageReference("docker.io", "someone/tool", "latest")),
    ("team/a.b-c__d--e", ImageReference("127.0.0.1:5000", "team/a.b-c__d--e", "latest")),
    ("registry.example.com", ImageReference("127.0.0.1:5000", "registry.example.com", "latest")),  # no '/': a name
])
def test_references_resolve(text: str, expected: ImageReference) -> None:
    assert parse_reference(text, DEFAULT) == expected


def test_a_bare_name_on_docker_hub_as_the_default_is_an_official_image() -> None:
    assert str(parse_reference("busybox", "docker.io")) == "docker.io/library/busybox:latest"
    assert str(parse_reference("someone/tool", "https://docker.io")) == "docker.io/someone/tool:latest"


@pytest.mark.parametrize(("text", "words"), [
    ("", "an image reference is required"),
    (" busybox", "spaces"),
    ("busy box", "spaces"),
    ("busybox\n", "spaces or control characters"),
    ("BusyBox", "(repositories are lowercase)"),
    ("busybox:", "tag ''"),
    ("busybox:.hidden", "tag '.hidden'"),
    ("busybox:" + "t" * 129, "at most 128"),
    ("busybox@sha256:abc", "is not sha256: and 64 lowercase hex digits"),
    ("busybox@md5:" + "ab" * 16, "is not sha256"),
    (f"busybox@{DIGEST.upper()}", "is not sha256"),
    ("https://registry.example.com/busybox", "name the image, not a URL"),
    ("registry.example.com/", "the repository is missing"),
    ("a//b", "'' is not a valid repository component"),
    ("a/-b", "'-b' is not a valid repository component"),
    ("a/b_", "'b_' is not a valid repository component"),
    ("a/b___c", "'b___c' is not a valid repository component"),
    ("-bad.example.com/x", "is not a registry host[:port]"),
    ("host.example.com:port/x", "is not a registry host[:port]"),
    ("registry.example.com/" + "a" * 250, "exceed 255 characters"),
])
def test_mistakes_are_refused_with_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(InvalidImageReference) as refused:
        parse_reference(text, DEFAULT)
    assert words in str(refused.value)


def test_a_bare_name_needs_a_default_registry() -> None:
    with pytest.raises(InvalidImageReference, match="no default registry is configured"):
        parse_reference("busybox")
    assert parse_reference("127.0.0.1:5000/busybox").registry == "127.0.0.1:5000"


@pytest.mark.parametrize(("url", "expected"), [
    ("http://127.0.0.1:5000", Registry("127.0.0.1:5000", plain_http=True)),
    ("http://127.0.0.1:5000/", Registry("127.0.0.1:5000", plain_http=True)),
    ("https://registry.example.com", Registry("registry.example.com")),
    ("registry.example.com:443", Registry("registry.example.com:443")),
    ("https://index.docker.io", Registry("docker.io")),
])
def test_registries_are_named_by_url(url: str, expected: Registry) -> None:
    assert Registry.parse(url) == expected
    assert Registry.parse(expected.url) == expected


@pytest.mark.parametrize("url", ["ftp://host", "http://user@host", "http://host/path", "http://", "host name"])
def test_a_registry_is_only_a_scheme_and_host(url: str) -> None:
    with pytest.raises(InvalidImageReference):
        Registry.parse(url)


def test_a_tag_resolved_to_a_digest_is_fetched_by_digest_alone() -> None:
    ref = parse_reference("busybox:1.36", DEFAULT)
    assert ref.docker_transport == "docker://127.0.0.1:5000/busybox:1.36"
    assert ref.at(DIGEST).docker_transport == f"docker://127.0.0.1:5000/busybox@{DIGEST}"
    both = parse_reference(f"busybox:1.36@{DIGEST}", DEFAULT)  # skopeo refuses a tag and a digest together
    assert both.docker_transport == f"docker://127.0.0.1:5000/busybox@{DIGEST}"
    with pytest.raises(InvalidImageReference):
        ref.at("sha256:short")


component = st.from_regex(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*", fullmatch=True).filter(lambda c: len(c) < 30)
repository = st.lists(component, min_size=1, max_size=4).map("/".join)
tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)
registry = st.sampled_from(["", "127.0.0.1:5000/", "localhost/", "registry.example.com/", "[::1]:8/", "docker.io/"])


@given(registry, repository, st.none() | tag, st.none() | digest)
def test_every_valid_reference_resolves_to_a_canonical_form_that_resolves_to_itself(
        prefix: str, repo: str, tag_: str | None, digest_: str | None) -> None:
    first = repo.split("/")[0]
    assume(prefix or "/" not in repo or ("." not in first and first != "localhost"))  # else `first` is a registry
    text = prefix + repo + (f":{tag_}" if tag_ else "") + (f"@{digest_}" if digest_ else "")
    ref = parse_reference(text, DEFAULT)
    assert ref.repository.endswith(repo)
    assert ref.registry == (prefix.rstrip("/") or "127.0.0.1:5000")
    assert ref.digest == digest_
    assert ref.tag == (tag_ or (None if digest_ else "latest"))
    assert parse_reference(str(ref), DEFAULT) == ref  # canonical: fully qualified, idempotent
    assert parse_reference(str(ref), None) == ref  # and needs no default registry any more


@given(st.text(max_size=60))
def test_any_text_resolves_or_is_refused_with_an_invalid_image_reference(text: str) -> None:
    try:
        ref = parse_reference(text, DEFAULT)
    except InvalidImageReference as refused:
        assert str(refused)
    else:
        assert parse_reference(str(ref), DEFAULT) == ref
