"""Where a worker asks for an image, in order (services.worker.pull_sources): the own registry for
`localhost/...`, a mirror before its registry, the registry a reference names otherwise."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.common.image_refs import InvalidImageReference, Mirror, Registry, parse_reference
from services.worker.pull_sources import Source, pull_sources

OWN = Registry.parse("http://127.0.0.1:5000")
HUB_ON_OWN = Mirror.parse("docker.io=http://127.0.0.1:5000/docker.io")
GHCR_ELSEWHERE = Mirror.parse("ghcr.io=https://mirror.example.com/ghcr")


def test_a_bare_name_asks_the_mirror_then_docker_hub() -> None:
    sources = pull_sources(parse_reference("busybox"), OWN, [HUB_ON_OWN, GHCR_ELSEWHERE])
    assert sources == [
        Source(parse_reference("127.0.0.1:5000/docker.io/library/busybox"), True, own=True, mirror=True),
        Source(parse_reference("docker.io/library/busybox"), False, own=False)]


def test_a_mirror_that_is_not_the_own_registry_is_not_asked_with_its_login() -> None:
    first, last = pull_sources(parse_reference("ghcr.io/org/tool:1"), OWN, [HUB_ON_OWN, GHCR_ELSEWHERE])
    assert first == Source(parse_reference("mirror.example.com/ghcr/org/tool:1"), False, own=False, mirror=True)
    assert last == Source(parse_reference("ghcr.io/org/tool:1"), False, own=False)


@pytest.mark.parametrize("text", ["localhost/physics/tool:2", "127.0.0.1:5000/physics/tool:2"])
def test_the_own_registry_is_asked_alone_at_its_address(text: str) -> None:
    assert pull_sources(parse_reference(text), OWN, [HUB_ON_OWN]) == [
        Source(parse_reference("127.0.0.1:5000/physics/tool:2"), True, own=True)]


def test_localhost_without_an_own_registry_is_no_image() -> None:
    with pytest.raises(InvalidImageReference, match="names corral's own registry, and this deployment has none"):
        pull_sources(parse_reference("localhost/physics/tool"), None)
    # ... and never this machine's other ports.
    assert pull_sources(parse_reference("localhost:5000/x"), None) == [
        Source(parse_reference("localhost:5000/x"), False, own=False)]


@given(st.sampled_from(["busybox", "lab/tool:1", "ghcr.io/org/x", "quay.io/a/b@sha256:" + "0" * 64,
                        "localhost/p/x", "127.0.0.1:5000/p/x", "10.0.0.1:5000/p/x"]),
       st.lists(st.sampled_from([HUB_ON_OWN, GHCR_ELSEWHERE, Mirror.parse("quay.io=http://10.0.0.2/q")]),
                unique=True))
def test_the_last_source_is_the_registry_named_and_every_other_is_a_mirror_of_it(
        text: str, mirrors: list[Mirror]) -> None:
    ref = parse_reference(text)
    sources = pull_sources(ref, OWN, mirrors)
    *before, last = sources
    assert (last.reference.repository, last.reference.tag, last.reference.digest) == (
        ref.repository, ref.tag, ref.digest)
    assert not last.mirror
    assert all(s.mirror and s.reference.repository.endswith(ref.repository) for s in before)
    assert len(before) == sum(m.registry == ref.registry for m in mirrors) if not last.own else not before
