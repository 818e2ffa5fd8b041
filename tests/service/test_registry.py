"""The loopback registry `corral up` runs (services.registry.server) and the seed images it is given
(services.registry.seed), with the real docker-registry, umoci and skopeo."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from services.registry import seed as seed_module
from services.registry.seed import build_busybox, registry_digest, seed
from services.registry.server import RegistryServer
from services.up.ports import free_port
from tests.registry import SeededRegistry

pytestmark = pytest.mark.timeout(60)


def test_the_registry_starts_answers_and_stops_by_pid(tmp_path: Path) -> None:
    server = RegistryServer(tmp_path / "registry", free_port())
    server.start()
    try:
        started = time.monotonic()
        server.wait_ready()
        assert time.monotonic() - started < 5
        assert server.ready()
        config = (tmp_path / "registry" / "config.yml").read_text()
        assert f"addr: 127.0.0.1:{server.port}" in config and "tls" not in config
        assert (tmp_path / "registry" / "config.yml").stat().st_mode & 0o777 == 0o600  # it holds the HTTP secret
        assert "listening on 127.0.0.1" in (tmp_path / "registry" / "registry.log").read_text()
    finally:
        server.stop()
    assert server.exit_status() is not None
    assert not server.ready()


def test_a_registry_that_cannot_start_says_why(tmp_path: Path) -> None:
    first = RegistryServer(tmp_path / "first", free_port())
    second = RegistryServer(tmp_path / "second", first.port)  # its port is taken, by a registry that answers
    try:
        first.start()
        first.wait_ready()
        second.start()
        with pytest.raises(RuntimeError, match="the registry exited with 1: the last line of .*address already in use"):
            second.wait_ready()
    finally:
        second.stop()
        first.stop()


def test_the_seed_image_is_busybox_alone_and_reproducible(tmp_path: Path) -> None:
    digest = build_busybox(tmp_path / "a")
    time.sleep(1.1)  # a build a second later would differ if any timestamp leaked in
    assert build_busybox(tmp_path / "b") == digest
    subprocess.run(["umoci", "unpack", "--image", f"{tmp_path / 'a'}:latest", str(tmp_path / "bundle")],
                   check=True, capture_output=True)
    rootfs = tmp_path / "bundle" / "rootfs"
    assert (rootfs / "bin" / "busybox").read_bytes() == Path("/bin/busybox").read_bytes()
    assert os.readlink(rootfs / "bin" / "sh") == "/bin/busybox"
    assert os.readlink(rootfs / "usr" / "bin" / "env") == "/bin/busybox"
    assert (rootfs / "tmp").stat().st_mode & 0o7777 == 0o1777
    assert (rootfs / "etc" / "passwd").read_text().startswith("root:x:0:0:")
    assert sorted(p.name for p in rootfs.iterdir()) == ["bin", "etc", "root", "sbin", "tmp", "usr"]
    config = json.loads((tmp_path / "bundle" / "config.json").read_text())
    assert config["process"]["args"] == ["/bin/sh"]
    if os.geteuid() != 0:
        return  # chroot is root's
    # The image runs: the static busybox needs nothing else from the root filesystem.
    result = subprocess.run(["chroot", str(rootfs), "/bin/sh", "-c", "echo hello from $(basename $0)"],
                            capture_output=True, text=True)
    assert result.stdout == "hello from sh\n", result.stderr


def test_seeding_pushes_once_and_skips_what_the_registry_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = RegistryServer(tmp_path / "registry", free_port())
    server.start()
    said: list[str] = []
    try:
        server.wait_ready()
        [first] = seed(server.address, tmp_path / "seed", say=said.append)
        # Where docker.io's mirror keeps it: `busybox` is docker.io/library/busybox.
        assert first.pushed and first.reference == f"{server.address}/docker.io/library/busybox:latest"
        assert registry_digest(first.reference) == first.digest
        assert said[0] == f"registry: building the base image busybox (busybox-static) in {tmp_path / 'seed'}"
        assert said[1].startswith("registry: built busybox in ") and said[1].endswith(f" s ({first.digest})")

        # Seeded again (corral up restarted): the cached build is reused, nothing is pushed, nothing said.
        def no_build(layout: Path) -> str:
            raise AssertionError("built again")

        monkeypatch.setattr(seed_module, "build_busybox", no_build)
        said.clear()
        again = seed(server.address, tmp_path / "seed", say=said.append)
        assert [(s.digest, s.pushed) for s in again] == [(first.digest, False)] and said == []

        # A registry whose storage was lost is pushed to again, from the cached build.
        server.stop()
        server = RegistryServer(tmp_path / "registry", server.port, storage=tmp_path / "new-storage")
        server.start()
        server.wait_ready()
        assert registry_digest(first.reference) is None
        pushed = seed(server.address, tmp_path / "seed")
        assert [(s.digest, s.pushed) for s in pushed] == [(first.digest, True)]
    finally:
        server.stop()


def test_a_login_registry_refuses_anonymous_readers(registry: SeededRegistry) -> None:
    refused = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--no-creds",
                              f"docker://{registry.at('busybox:latest', login=True)}"], capture_output=True,
                             text=True)
    assert refused.returncode != 0 and "authentication required" in refused.stderr
    assert registry_digest(registry.at("busybox:latest")) == registry.busybox_digest


def test_an_image_only_root_can_build_is_left_out_with_a_word_when_not_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = RegistryServer(tmp_path / "registry", free_port())
    server.start()
    said: list[str] = []
    try:
        server.wait_ready()
        seed(server.address, tmp_path / "seed")  # busybox built (as root or not, it can be)
        account = os.geteuid() or 1000  # as root, pretend to be another account, whose cache this is
        os.chown(tmp_path / "seed", account, account)
        monkeypatch.setattr(os, "geteuid", lambda: account)
        seeded = seed(server.address, tmp_path / "seed", images=("busybox", "python"), say=said.append)
        assert [s.reference for s in seeded] == [f"{server.address}/docker.io/library/busybox:latest"]
        assert said == ["registry: not seeding the base image python: building it needs root (mmdebstrap "
                        "installs packages in a chroot)"]
        assert registry_digest(f"{server.address}/docker.io/library/python:latest") is None
    finally:
        server.stop()


def test_a_build_that_fails_names_its_image_and_leaves_the_others_seeded_next_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(layout: Path) -> str:
        raise RuntimeError("mmdebstrap --quiet failed: E: Failed to fetch http://deb.debian.org/debian/dists/bookworm")

    monkeypatch.setitem(seed_module.BASE_IMAGES, "debian",
                        dataclasses.replace(seed_module.BASE_IMAGES["debian"], build=unreachable))
    with pytest.raises(seed_module.BaseImageError, match=r"^could not build the base image debian: mmdebstrap "
                       r"--quiet failed: E: Failed to fetch .* \(corral up --base-images without it starts "
                       r"without it\)$"):
        seed("127.0.0.1:9", tmp_path / "seed", images=("busybox", "debian"))
    # busybox, built at the same time, is kept: the next start builds only what failed.
    assert [p.name.split("-")[0] for p in (tmp_path / "seed").iterdir() if not p.name.startswith(".")] == ["busybox"]
