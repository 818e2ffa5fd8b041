"""The Debian base images (services.registry.base_images) built for real from this machine's Debian mirror,
with mmdebstrap and umoci: each twice, to the same digest, and holding what its name promises (slow: a
minute or two each); and the cache of built images (services.registry.seed_cache) shared by processes
building at once."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from services.registry import base_images
from services.registry.seed import BASE_IMAGES, layout_digest
from services.registry.seed_cache import cached

WAIT_S = 20.0


def _build_in_another_process(cache_dir: str, name: str, work: str, wait_for: str) -> None:
    """Build `name` in the cache; the build says it started (`work/NAME.building`), then holds on until the
    file `wait_for` exists (or WAIT_S), and counts itself in `work/builds`."""
    def build(layout: Path) -> str:
        Path(work, f"{name}.building").touch()
        deadline = time.monotonic() + WAIT_S
        while wait_for and not Path(wait_for).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(Path(work, "builds"), "a") as builds:
            builds.write(f"{name}\n")
        layout.mkdir()
        digest = f"sha256:{name.encode().hex():0>64}"
        (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": digest}]}))
        return digest

    found = cached(Path(cache_dir), name, {"recipe": 1}, build)
    Path(work, f"{name}.{os.getpid()}.digest").write_text(found.digest)


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.01)


def test_processes_building_at_once_build_each_image_once_and_do_not_wait_for_others(tmp_path: Path) -> None:
    cache_dir, spawn = tmp_path / "cache", multiprocessing.get_context("spawn")
    # The first python build holds on until openjdk's build (another image) has started: it does not wait
    # for python's lock. The second python build starts while the first is under way, and waits for it.
    first = spawn.Process(target=_build_in_another_process,
                          args=(str(cache_dir), "python", str(tmp_path), str(tmp_path / "openjdk.building")))
    first.start()
    _wait_for(tmp_path / "python.building")
    second = spawn.Process(target=_build_in_another_process, args=(str(cache_dir), "python", str(tmp_path), ""))
    other = spawn.Process(target=_build_in_another_process, args=(str(cache_dir), "openjdk", str(tmp_path), ""))
    second.start()
    other.start()
    for process in (first, second, other):
        process.join(WAIT_S * 2)
        assert process.exitcode == 0
    assert sorted((tmp_path / "builds").read_text().split()) == ["openjdk", "python"]
    digests = {p.name.split(".")[0]: p.read_text() for p in tmp_path.glob("*.digest")}
    assert len(list(tmp_path.glob("python.*.digest"))) == 2 and digests["python"] != digests["openjdk"]
    assert not [p for p in cache_dir.iterdir() if p.name.endswith(".building")]


def _unpack(layout: Path, tag: str, bundle: Path) -> Path:
    subprocess.run(["umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle)], check=True, capture_output=True)
    return bundle / "rootfs"


def _run_in(rootfs: Path, *argv: str) -> str:
    """Run `argv` in the root filesystem (a private /proc: the JVM reads it), as the image's Cmd would."""
    result = subprocess.run(["unshare", "--fork", "--pid", f"--mount-proc={rootfs / 'proc'}", "chroot", str(rootfs),
                             "env", f"PATH={base_images.PATH}", "LANG=C.UTF-8", *argv],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.skipif(os.geteuid() != 0, reason="mmdebstrap installs packages in a chroot: root's")
@pytest.mark.parametrize("name", ["debian", "python", "openjdk"])
def test_a_debian_image_builds_twice_to_one_digest_and_holds_what_its_name_says(tmp_path: Path, name: str) -> None:
    image, recipe = BASE_IMAGES[name], base_images.RECIPES[name]
    digest = image.build(tmp_path / "first")
    assert image.build(tmp_path / "second") == digest
    assert {layout_digest(tmp_path / "first", tag) for tag in recipe.tags} == {digest}

    rootfs = _unpack(tmp_path / "first", recipe.tags[-1], tmp_path / "bundle")
    config = json.loads((tmp_path / "bundle" / "config.json").read_text())["process"]
    assert config["args"] == list(recipe.cmd) and config["cwd"] == "/"
    assert f"PATH={base_images.PATH}" in config["env"]
    assert "GNU bash, version 5.2" in _run_in(rootfs, "bash", "--version")
    assert "GNU coreutils" in _run_in(rootfs, "ls", "--version")
    # No manual pages, documentation or translations, but every package's copyright.
    for folder in ("man", "locale", "info"):
        assert not [p for p in (rootfs / "usr/share" / folder).rglob("*")
                    if p.is_file() and not p.is_symlink() and p.name != "dir"]  # info's index, made by install-info
    assert (rootfs / "usr/share/doc/bash/copyright").is_file()
    assert {p.name for p in (rootfs / "usr/share/doc/bash").iterdir()} == {"copyright"}
    packages = set(re.findall(r"^Package: (\S+)$", (rootfs / "var/lib/dpkg/status").read_text(), re.MULTILINE))
    assert {"bash", "coreutils", *recipe.packages} <= packages
    assert not {"usrmerge", "perl", "apt"} & packages  # merged /usr by mmdebstrap's hook, not usrmerge and its perl
    if name == "python":
        said = _run_in(rootfs, "python3", "-c", "import cloudpickle, sys; print(sys.version)")
        assert said.startswith("3.11."), said
    if name == "openjdk":
        assert 'openjdk version "17.' in _run_in(rootfs, "java", "-version")
        listing = _run_in(rootfs, "keytool", "-list", "-cacerts", "-storepass", "changeit")
        assert "trustedCertEntry" in listing and "May 20, 2025" in listing  # the frozen clock's date
