"""The Debian base images' recipes (services.registry.base_images) and where seeding puts them
(services.registry.seed): the pure parts. Building them is tests/service/test_base_images.py's."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.registry import base_images
from services.registry.base_images import DEFAULT_SOURCES, RECIPES, debian_sources, mmdebstrap_argv
from services.registry.seed import BASE_IMAGES, references
from services.up.cli import _base_images

THIS_MACHINE = """Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
# http://snapshot.debian.org/archive/debian-security/20250520T000000Z
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""
SOURCE_LINE = re.compile(r"deb (https?|file)://\S+ bookworm(-updates|-security)? main")


def test_the_sources_are_this_machines_bookworm_mirror() -> None:
    assert debian_sources(THIS_MACHINE) == ("deb http://deb.debian.org/debian bookworm main",
                                            "deb http://deb.debian.org/debian bookworm-updates main",
                                            "deb http://deb.debian.org/debian-security bookworm-security main")


def test_a_mirror_of_another_release_or_a_disabled_one_is_not_used() -> None:
    ubuntu = "Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: noble noble-updates\nComponents: main\n"
    assert debian_sources(ubuntu) == DEFAULT_SOURCES
    disabled = THIS_MACHINE.replace("Types: deb\n", "Types: deb\nEnabled: no\n", 1)
    assert debian_sources(disabled) == ("deb http://deb.debian.org/debian-security bookworm-security main",)
    assert debian_sources(THIS_MACHINE.replace("Types: deb", "Types: deb-src")) == DEFAULT_SOURCES
    assert debian_sources("") == DEFAULT_SOURCES


fields = st.sampled_from(["Types", "URIs", "Suites", "Components", "Enabled", "Signed-By", "#", " "])
values = st.lists(st.sampled_from(["deb", "deb-src", "bookworm", "bookworm-security", "trixie", "main", "no", "yes",
                                   "http://m.example/debian", "ftp://old.example", "x\ny"]), max_size=3)
stanzas = st.lists(st.lists(st.tuples(fields, values), max_size=5), max_size=3)


@given(stanzas)
def test_any_sources_file_gives_bookworm_lines_mmdebstrap_takes(stanzas: list) -> None:
    text = "\n\n".join("\n".join(f"{key}: {' '.join(value)}" for key, value in stanza) for stanza in stanzas)
    found = debian_sources(text)
    assert found and all(SOURCE_LINE.fullmatch(line) for line in found), found
    assert len(set(found)) == len(found)


def test_the_images_and_tags_are_the_contracts() -> None:
    assert {name: image.tags for name, image in BASE_IMAGES.items()} == {
        "busybox": ("latest",), "debian": ("latest", "12", "bookworm"), "python": ("latest", "3.11"),
        "openjdk": ("latest", "17")}
    assert {"bash", "coreutils"} <= set(RECIPES["debian"].packages)
    assert {"bash", "coreutils", "python3", "python3-cloudpickle"} <= set(RECIPES["python"].packages)
    assert "default-jre-headless" in RECIPES["openjdk"].packages


def test_each_image_is_seeded_where_docker_hubs_official_image_would_be_mirrored() -> None:
    assert references("127.0.0.1:5000", BASE_IMAGES["python"]) == [
        ("latest", "127.0.0.1:5000/docker.io/library/python:latest"),
        ("3.11", "127.0.0.1:5000/docker.io/library/python:3.11")]
    assert references("r:1", BASE_IMAGES["busybox"]) == [("latest", "r:1/docker.io/library/busybox:latest")]
    assert references("r:1", BASE_IMAGES["openjdk"], "mirror/docker.io/library") == [
        ("latest", "r:1/mirror/docker.io/library/openjdk:latest"), ("17", "r:1/mirror/docker.io/library/openjdk:17")]


def test_the_bootstrap_excludes_documentation_and_fills_in_every_hook() -> None:
    for recipe in RECIPES.values():
        argv = mmdebstrap_argv(recipe, DEFAULT_SOURCES, Path("/w/rootfs.tar"), "/usr/lib/x/libfaketime.so.1")
        assert argv[0] == "mmdebstrap" and "--variant=essential" in argv and "--mode=root" in argv
        assert argv[-5:] == ["bookworm", "/w/rootfs.tar", *DEFAULT_SOURCES]
        assert f"--include={','.join(recipe.packages)}" in argv
        for path in ("/usr/share/man/*", "/usr/share/doc/*", "/usr/share/locale/*"):
            assert f"--dpkgopt=path-exclude={path}" in argv
        assert "--dpkgopt=path-include=/usr/share/doc/*/copyright" in argv
        assert not any("{" in arg for arg in argv), argv  # every placeholder filled in
    [hook] = [arg for arg in mmdebstrap_argv(RECIPES["openjdk"], DEFAULT_SOURCES, Path("/t"), "/l/libfaketime.so.1")
              if arg.startswith("--customize-hook=")]
    assert "FAKETIME='2025-05-20 00:00:00'" in hook and "cp /l/libfaketime.so.1 " in hook


def test_the_configuration_is_fixed_and_runs_each_images_program() -> None:
    commands = {}
    for recipe in RECIPES.values():
        argv = base_images.umoci_config_argv(recipe, "L:latest")
        assert argv.count(base_images.CREATED) == 2 and base_images.CREATED == "2025-05-20T00:00:00Z"
        assert f"--config.env=PATH={base_images.PATH}" in argv and "--config.workingdir" in argv
        commands[recipe.name] = [arg.removeprefix("--config.cmd=") for arg in argv if arg.startswith("--config.cmd=")]
    assert commands == {"debian": ["bash"], "python": ["python3"], "openjdk": ["java", "-version"]}


def test_corral_up_takes_a_list_of_known_base_images() -> None:
    assert _base_images("busybox, python,busybox") == ("busybox", "python")
    assert _base_images("") == ()
    with pytest.raises(argparse.ArgumentTypeError, match="no base image 'ubuntu': the base images are busybox, "
                                                         "debian, python, openjdk"):
        _base_images("python,ubuntu")
