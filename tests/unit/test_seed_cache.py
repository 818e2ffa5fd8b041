"""The cache of built seed images (services.registry.seed_cache), with builds that only write a layout's
index: what is built again, what is kept, and what a failed build leaves. (Two processes at once:
tests/service/test_base_images.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.registry.seed_cache import cached, entry_name, read_entry


class Builds:
    """A build that writes an OCI index naming one digest, and counts itself."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, layout: Path) -> str:
        self.count += 1
        digest = f"sha256:{self.count:064x}"
        layout.mkdir()
        (layout / "index.json").write_text(json.dumps({"manifests": [{"digest": digest}]}))
        return digest


STAMP = {"recipe": 1, "image": {"packages": ("bash", "python3")}, "sources": ["deb http://m/debian bookworm main"]}


def test_an_image_is_built_once_then_read_from_the_cache(tmp_path: Path) -> None:
    builds = Builds()
    first = cached(tmp_path, "python", STAMP, builds)
    assert first.build_s is not None and builds.count == 1
    # The same stamp, as built.json gives it back (lists for tuples) and in another order: no build.
    again = cached(tmp_path, "python", {"sources": STAMP["sources"], "image": {"packages": ["bash", "python3"]},
                                        "recipe": 1}, builds)
    assert (again.layout, again.digest, again.build_s, builds.count) == (first.layout, first.digest, None, 1)
    assert read_entry(first.layout.parent, STAMP) == first.digest


def test_a_changed_input_builds_again_and_only_a_pruning_cache_forgets_the_old(tmp_path: Path) -> None:
    builds = Builds()
    old = cached(tmp_path / "shared", "python", STAMP, builds)
    new = cached(tmp_path / "shared", "python", {**STAMP, "recipe": 2}, builds)
    assert builds.count == 2 and new.layout != old.layout and old.layout.exists()  # a shared cache keeps both

    (tmp_path / "own" / "busybox").mkdir(parents=True)  # the layout of before the cache had entries
    (tmp_path / "own" / "busybox.json").write_text("{}")
    kept = cached(tmp_path / "own", "busybox", STAMP, builds, prune=True)
    other = cached(tmp_path / "own", "python", STAMP, builds, prune=True)
    newest = cached(tmp_path / "own", "busybox", {**STAMP, "recipe": 2}, builds, prune=True)
    assert not kept.layout.parent.exists() and newest.layout.exists() and other.layout.exists()
    assert sorted(p.name for p in (tmp_path / "own").iterdir()) == sorted(
        [newest.layout.parent.name, other.layout.parent.name, f".{newest.layout.parent.name}.lock",
         f".{other.layout.parent.name}.lock"])


def test_a_failed_build_leaves_nothing_and_the_next_start_builds(tmp_path: Path) -> None:
    def failing(layout: Path) -> str:
        layout.mkdir()
        raise RuntimeError("mmdebstrap failed: the mirror is unreachable")

    with pytest.raises(RuntimeError, match="unreachable"):
        cached(tmp_path, "debian", STAMP, failing)
    assert [p.name for p in tmp_path.iterdir()] == [f".{entry_name('debian', STAMP)}.lock"]
    builds = Builds()
    assert cached(tmp_path, "debian", STAMP, builds).build_s is not None and builds.count == 1


def test_a_damaged_entry_is_built_again(tmp_path: Path) -> None:
    builds = Builds()
    first = cached(tmp_path, "debian", STAMP, builds)
    (first.layout / "index.json").write_text(json.dumps({"manifests": []}))  # lost its image
    again = cached(tmp_path, "debian", STAMP, builds)
    assert builds.count == 2 and again.digest != first.digest and read_entry(again.layout.parent, STAMP)


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=5),
                                                       st.lists(st.integers(), max_size=3)), max_size=4),
       st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=10))
def test_an_entrys_name_is_its_images_and_a_hash_of_the_stamp(stamp: dict, name: str) -> None:
    key = entry_name(name, stamp).removeprefix(f"{name}-")
    assert len(key) == 16 and set(key) <= set("0123456789abcdef")
    assert entry_name(name, dict(reversed(stamp.items()))) == entry_name(name, stamp)
    assert entry_name(name, {**stamp, "recipe": "another"}) != entry_name(name, {**stamp, "recipe": "other"})


def test_a_cache_another_account_could_write_to_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(RuntimeError, match="is not this account's alone .* mode 777.*another account could put"):
        cached(shared, "python", STAMP, Builds())
    shared.chmod(0o755)
    assert cached(shared, "python", STAMP, Builds()).build_s is not None
