"""Who may run an image of corral's own registry (services.frontend.image_access): a project's images
(`localhost/PROJECT/NAME`, or the registry's real address) are its members', everything else of the registry
(docker.io/..., one-component repositories) and of every other registry is nobody's business here."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from services.common.image_refs import parse_reference
from services.frontend.image_access import OwnRegistryNames, access_refusal, image_project, own_registry_keys

OWN = own_registry_keys("http://127.0.0.1:5000", "http://127.0.0.1:5001")
projects = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True).filter(
    lambda p: not p.endswith(("-", "_")) and "__" not in p and "--" not in p.strip("-") and "_-" not in p
    and "-_" not in p)
names = st.from_regex(r"[a-z0-9]{1,10}", fullmatch=True)


def test_each_name_of_the_own_registry_names_a_projects_image() -> None:
    for text in ("localhost/alpha/tool:v1", "127.0.0.1:5000/alpha/tool", "127.0.0.1:5001/alpha/tool@sha256:" + "a" * 64,
                 "localhost/alpha/lab/tool"):
        assert image_project(parse_reference(text), OWN) == "alpha", text


def test_public_parts_of_the_own_registry_and_other_registries_are_nobodys() -> None:
    for text in ("localhost/docker.io/library/busybox", "127.0.0.1:5000/docker.io/lab/tool", "localhost/busybox",
                 "127.0.0.1:5000/busybox:latest", "127.0.0.1:5002/alpha/tool", "ghcr.io/alpha/tool",
                 "docker.io/alpha/tool", "localhost:5000/alpha/tool"):
        assert image_project(parse_reference(text), OWN) is None, text


def test_a_bare_name_is_docker_hubs_and_nobodys_here() -> None:
    own = OwnRegistryNames.of("http://127.0.0.1:5000")
    assert own.project_of("alpha/tool") is None  # docker.io/alpha/tool
    assert own.project_of("127.0.0.1:5000/alpha/tool")[1] == "alpha"
    assert own.project_of("busybox") is None
    assert own.project_of("Not A Reference") is None  # image_checks refuses it
    assert OwnRegistryNames.of(None).project_of("localhost/alpha/tool")[1] == "alpha"


@given(projects, projects, names, st.sampled_from(["localhost", "127.0.0.1:5000", "127.0.0.1:5001"]))
def test_only_members_run_a_projects_image(project: str, other: str, name: str, registry: str) -> None:
    reference = parse_reference(f"{registry}/{project}/{name}:v1")
    assert access_refusal(reference, OWN, {project}) is None
    assert access_refusal(reference, OWN, {project, other}) is None
    refusal = access_refusal(reference, OWN, {other} - {project})
    assert refusal is not None and f"billing project {project}:" in refusal


@given(projects, names)
def test_the_mirror_of_docker_hub_is_everybodys(project: str, name: str) -> None:
    for registry in ("localhost", "127.0.0.1:5000"):
        assert access_refusal(parse_reference(f"{registry}/docker.io/{project}/{name}"), OWN, set()) is None
