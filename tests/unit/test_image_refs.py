"""Image references: how a job's `image` resolves (services.common.image_refs), the examples of its
docstring and of the distribution project's grammar, the mistakes it refuses, mirrors, and properties over
generated references."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from services.common.image_refs import (
    ImageReference,
    InvalidImageReference,
    Mirror,
    Registry,
    names_own_registry,
    parse_reference,
)

DIGEST = "sha256:" + "ab" * 32
HEX64 = "1a3f5e7d9c1b3a5f7e9d1c3b5a7f9e1d3c5b7a9f1e3d5d7c9b1a3f5e7d9c1b3a"


@pytest.mark.parametrize(("text", "expected"), [
    # A bare name is Docker Hub's, an official image's under library/, as every container tool reads it.
    ("ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04")),
    ("busybox", ImageReference("docker.io", "library/busybox", "latest")),
    ("lab/tool", ImageReference("docker.io", "lab/tool", "latest")),
    ("team/tool:v2", ImageReference("docker.io", "team/tool", "v2")),
    (f"busybox@{DIGEST}", ImageReference("docker.io", "library/busybox", None, DIGEST)),
    (f"busybox:1.36@{DIGEST}", ImageReference("docker.io", "library/busybox", "1.36", DIGEST)),
    ("team/a.b-c__d--e", ImageReference("docker.io", "team/a.b-c__d--e", "latest")),
    ("registry.example.com", ImageReference("docker.io", "library/registry.example.com", "latest")),  # no '/'
    # `localhost` exactly is corral's own registry; with a port it is just a host.
    ("localhost/physics/tool:x", ImageReference("localhost", "physics/tool", "x")),
    ("localhost/busybox", ImageReference("localhost", "busybox", "latest")),
    ("localhost:8080/a/b/c", ImageReference("localhost:8080", "a/b/c", "latest")),
    ("127.0.0.1:5000/busybox", ImageReference("127.0.0.1:5000", "busybox", "latest")),
    ("ghcr.io/org/tool:1.0-rc_1", ImageReference("ghcr.io", "org/tool", "1.0-rc_1")),
    ("[::1]:5000/busybox", ImageReference("[::1]:5000", "busybox", "latest")),
    ("docker.io/ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04")),
    ("index.docker.io/ubuntu", ImageReference("docker.io", "library/ubuntu", "latest")),
    ("docker.io/library/ubuntu:24.04", ImageReference("docker.io", "library/ubuntu", "24.04")),
    ("docker.io/someone/tool", ImageReference("docker.io", "someone/tool", "latest")),
])
def test_references_resolve(text: str, expected: ImageReference) -> None:
    assert parse_reference(text) == expected


# The distribution project's ParseNormalizedNamed examples (reference/normalize_test.go), with the
# canonical form its FamiliarString/String agree on (`:latest` added, as docker pull does).
@pytest.mark.parametrize(("text", "canonical"), [
    ("docker/docker", "docker.io/docker/docker:latest"),
    ("library/debian", "docker.io/library/debian:latest"),
    ("debian", "docker.io/library/debian:latest"),
    ("docker.io/docker/docker", "docker.io/docker/docker:latest"),
    ("docker.io/library/debian", "docker.io/library/debian:latest"),
    ("docker.io/debian", "docker.io/library/debian:latest"),
    ("index.docker.io/docker/docker", "docker.io/docker/docker:latest"),
    ("index.docker.io/debian", "docker.io/library/debian:latest"),
    ("index.docker.io/library/debian", "docker.io/library/debian:latest"),
    ("127.0.0.1:5000/docker/docker", "127.0.0.1:5000/docker/docker:latest"),
    ("127.0.0.1:5000/library/debian", "127.0.0.1:5000/library/debian:latest"),
    ("127.0.0.1:5000/debian", "127.0.0.1:5000/debian:latest"),
    ("192.168.0.1/debian", "192.168.0.1/debian:latest"),
    ("thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnevere/docker/docker",
     "docker.io/thisisthesongthatneverendsitgoesonandonandonthisisthesongthatnevere/docker/docker:latest"),
    (f"docker.io/{HEX64}", f"docker.io/library/{HEX64}:latest"),
    ("foo_bar.com:8080", "docker.io/library/foo_bar.com:8080"),
    ("foo/foo_bar.com:8080", "docker.io/foo/foo_bar.com:8080"),
    ("localhost/foo", "localhost/foo:latest"),
    ("localhost:5000/foo", "localhost:5000/foo:latest"),
    ("example.com/foo/bar:baz", "example.com/foo/bar:baz"),
])
def test_the_distribution_grammars_examples_normalise_as_docker_normalises_them(text: str, canonical: str) -> None:
    assert str(parse_reference(text)) == canonical


@pytest.mark.parametrize("text", [
    "https://github.com/docker/docker", "docker/Docker", "-docker", "-docker/docker", "-docker.io/docker/docker",
    "docker///docker", "docker.io/docker/Docker", "docker.io/docker///docker", HEX64, "Uppercase:tag",
    "debian:", "debian@", "debian@sha256:", "a:b:c", "foo@bar",
])
def test_the_distribution_grammars_refusals_are_refused(text: str) -> None:
    with pytest.raises(InvalidImageReference):
        parse_reference(text)


@pytest.mark.parametrize(("text", "words"), [
    ("", "an image reference is required"),
    (" busybox", "spaces"),
    ("busy box", "spaces"),
    ("busybox\n", "spaces or control characters"),
    ("BusyBox", "(repositories are lowercase)"),
    ("Busybox", "'Busybox' is not a valid repository component (repositories are lowercase)"),
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
    (HEX64, "is an image ID, not a repository"),
])
def test_mistakes_are_refused_with_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(InvalidImageReference) as refused:
        parse_reference(text)
    assert words in str(refused.value)


def test_corrals_own_registry_is_localhost_or_its_real_address() -> None:
    own = Registry.parse("http://127.0.0.1:5000")
    assert names_own_registry(parse_reference("localhost/physics/tool"), own)
    assert names_own_registry(parse_reference("127.0.0.1:5000/physics/tool"), own)
    assert names_own_registry(parse_reference("localhost/physics/tool"), None)  # named so, whatever it is
    assert not names_own_registry(parse_reference("localhost:5000/physics/tool"), own)
    assert not names_own_registry(parse_reference("127.0.0.1:5001/physics/tool"), own)
    assert not names_own_registry(parse_reference("busybox"), own)


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


@pytest.mark.parametrize(("text", "expected"), [
    ("docker.io=http://127.0.0.1:5000/docker.io", Mirror("docker.io", Registry("127.0.0.1:5000", True), "docker.io")),
    ("docker.io=https://mirror.example.com", Mirror("docker.io", Registry("mirror.example.com"))),
    ("index.docker.io=mirror.example.com:5000/", Mirror("docker.io", Registry("mirror.example.com:5000"))),
    ("ghcr.io=https://mirror.example.com/a/ghcr", Mirror("ghcr.io", Registry("mirror.example.com"), "a/ghcr")),
])
def test_mirrors_are_named_registry_equals_url(text: str, expected: Mirror) -> None:
    assert Mirror.parse(text) == expected
    assert Mirror.parse(str(expected)) == expected


@pytest.mark.parametrize(("text", "words"), [
    ("docker.io", "not REGISTRY=URL"),
    ("=http://mirror", "not REGISTRY=URL"),
    ("docker.io=", "not REGISTRY=URL"),
    ("docker io=http://mirror", "is not a registry host[:port]"),
    ("localhost=http://mirror", "corral's own registry"),
    ("docker.io=ftp://mirror", "only http:// and https://"),
    ("docker.io=http://mirror/Upper", "is not a repository path"),
    ("docker.io=http://user@mirror/x", "not HOST[:PORT]"),
])
def test_a_mirror_that_is_not_one_is_refused(text: str, words: str) -> None:
    with pytest.raises(InvalidImageReference, match=words.replace("[", r"\[").replace("]", r"\]")):
        Mirror.parse(text)


def test_a_mirror_keeps_the_repository_under_its_prefix() -> None:
    mirror = Mirror.parse("docker.io=http://127.0.0.1:5000/docker.io")
    assert str(mirror.locate(parse_reference("busybox"))) == "127.0.0.1:5000/docker.io/library/busybox:latest"
    pinned = mirror.locate(parse_reference(f"lab/tool:1@{DIGEST}"))
    assert pinned.docker_transport == f"docker://127.0.0.1:5000/docker.io/lab/tool@{DIGEST}"
    bare = Mirror.parse("docker.io=https://mirror.example.com")
    assert str(bare.locate(parse_reference("ubuntu:24.04"))) == "mirror.example.com/library/ubuntu:24.04"


def test_a_tag_resolved_to_a_digest_is_fetched_by_digest_alone() -> None:
    ref = parse_reference("127.0.0.1:5000/busybox:1.36")
    assert ref.docker_transport == "docker://127.0.0.1:5000/busybox:1.36"
    assert ref.at(DIGEST).docker_transport == f"docker://127.0.0.1:5000/busybox@{DIGEST}"
    both = parse_reference(f"busybox:1.36@{DIGEST}")  # skopeo refuses a tag and a digest together
    assert both.docker_transport == f"docker://docker.io/library/busybox@{DIGEST}"
    with pytest.raises(InvalidImageReference):
        ref.at("sha256:short")


component = st.from_regex(r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*", fullmatch=True).filter(lambda c: len(c) < 30)
repository = st.lists(component, min_size=1, max_size=4).map("/".join)
tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)
registry = st.sampled_from(["", "127.0.0.1:5000/", "localhost/", "registry.example.com/", "[::1]:8/", "docker.io/",
                            "index.docker.io/", "localhost:5000/"])


def _text(prefix: str, repo: str, tag_: str | None, digest_: str | None) -> str:
    return prefix + repo + (f":{tag_}" if tag_ else "") + (f"@{digest_}" if digest_ else "")


def _unambiguous(prefix: str, repo: str) -> bool:
    """Whether `repo`'s first component stays a repository's (not read as a registry, nor an image ID)."""
    first = repo.split("/")[0]
    return bool(prefix) or (("/" not in repo or ("." not in first and first != "localhost"))
                            and not (len(repo) == 64 and all(c in "0123456789abcdef" for c in repo)))


@given(registry, repository, st.none() | tag, st.none() | digest)
def test_every_valid_reference_normalises_to_a_canonical_form_that_normalises_to_itself(
        prefix: str, repo: str, tag_: str | None, digest_: str | None) -> None:
    assume(_unambiguous(prefix, repo))
    ref = parse_reference(_text(prefix, repo, tag_, digest_))
    on_hub = prefix in ("", "docker.io/", "index.docker.io/")
    assert ref.registry == ("docker.io" if on_hub else prefix.rstrip("/"))
    assert ref.repository == (f"library/{repo}" if on_hub and "/" not in repo else repo)
    assert ref.digest == digest_
    assert ref.tag == (tag_ or (None if digest_ else "latest"))
    assert parse_reference(str(ref)) == ref  # canonical: fully qualified, idempotent
    assert str(parse_reference(str(ref))) == str(ref)


@given(registry, repository, st.none() | tag, st.none() | digest, st.data())
def test_every_refused_form_of_a_valid_reference_is_refused(
        prefix: str, repo: str, tag_: str | None, digest_: str | None, data: st.DataObject) -> None:
    assume(_unambiguous(prefix, repo))
    letters = [i for i, c in enumerate(repo) if c.isalpha()]
    broken = [_text(prefix, repo, None, None) + ":" + (f"@{digest_}" if digest_ else ""),  # an empty tag
              _text(prefix, repo, tag_, None) + "@" + data.draw(st.sampled_from(
                  ["", "sha256:", "sha256:" + "a" * 63, "sha256:" + "A" * 64, "sha512:" + "a" * 128])),  # bad digest
              _text(prefix, repo, tag_, None) + "@" + (digest_ or "sha256:" + "0" * 64) + "x"]
    if letters:  # upper case anywhere in the repository
        i = data.draw(st.sampled_from(letters))
        broken.append(_text(prefix, repo[:i] + repo[i].upper() + repo[i + 1:], tag_, digest_))
    for text in broken:
        with pytest.raises(InvalidImageReference):
            parse_reference(text)


@given(st.text(max_size=60))
def test_any_text_resolves_or_is_refused_with_an_invalid_image_reference(text: str) -> None:
    try:
        ref = parse_reference(text)
    except InvalidImageReference as refused:
        assert str(refused)
    else:
        assert parse_reference(str(ref)) == ref


@given(st.sampled_from(["docker.io", "ghcr.io", "registry.example.com:5000"]),
       st.sampled_from(["http://127.0.0.1:5000", "https://mirror.example.com", "mirror.example.com:8443"]),
       st.none() | st.lists(component, min_size=1, max_size=2).map("/".join), repository, st.none() | tag)
def test_a_mirror_serves_the_same_repository_under_its_prefix(
        upstream: str, url: str, prefix: str | None, repo: str, tag_: str | None) -> None:
    mirror = Mirror.parse(f"{upstream}={url}" + (f"/{prefix}" if prefix else ""))
    assert Mirror.parse(str(mirror)) == mirror
    ref = parse_reference(_text(f"{upstream}/", repo, tag_, None))
    there = mirror.locate(ref)
    assert there.registry == Registry.parse(url).host
    assert there.repository == (f"{prefix}/{ref.repository}" if prefix else ref.repository)
    assert (there.tag, there.digest) == (ref.tag, ref.digest)
