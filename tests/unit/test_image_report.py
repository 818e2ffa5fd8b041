"""What a worker tells its driver about its image cache, and what the driver keeps of it: the names a job may
write its image as (as pulled, normalised; as jobs wrote it), within bounds whatever the cache holds; and the
`--prepull` setting's parsing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.driver.v1 import worker_session_pb2 as ws
from corral.errors import UsageError
from services.common import prepull
from services.db.plan_snapshot import image_names
from services.driver.sessions import MAX_REPORTED_IMAGES, MAX_REPORTED_NAMES, reported_names
from services.up.cli import add_commands
from services.worker import image_report
from services.worker.image_report import MAX_IMAGES, MAX_NAMES, MAX_REPORT_BYTES, ImageReporter, cache_report
from services.worker.images import HeldImage

DIGEST = "sha256:" + "a" * 64


def held(digest: str, *references: str) -> HeldImage:
    return HeldImage(digest, tuple(sorted(references)), 1, 0, 0, 0)


def test_an_image_goes_by_its_references_and_the_names_jobs_wrote_for_them() -> None:
    report = cache_report([held(DIGEST, "docker.io/library/python:3.11")],
                          {"python:3.11": "docker.io/library/python:3.11", "debian": "docker.io/library/debian:latest"})
    assert [(i.digest, list(i.names)) for i in report.images] == [
        (DIGEST, ["docker.io/library/python:3.11", "python:3.11"])]
    # What the driver keeps matches the job's image as written, normalised, or by digest.
    names = reported_names(report)
    assert image_names("python:3.11") & names
    assert image_names("127.0.0.1:5000/lab/tool") == {"127.0.0.1:5000/lab/tool", "127.0.0.1:5000/lab/tool:latest"}
    assert image_names(None) == frozenset() and DIGEST in names


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.lists(st.text(min_size=1, max_size=300), max_size=40)),
                max_size=150))
def test_a_report_stays_within_its_bounds_and_the_driver_keeps_no_more(images: list[tuple[int, list[str]]]) -> None:
    report = cache_report([held(f"sha256:{n:064x}", *refs) for n, refs in images], {})
    assert len(report.images) <= MAX_IMAGES and report.ByteSize() <= MAX_REPORT_BYTES + 16
    assert all(len(i.names) <= MAX_NAMES and all(len(n) <= 255 for n in i.names) for i in report.images)
    # The most recently used first: the report is a prefix of what the cache holds.
    assert [i.digest for i in report.images] == [f"sha256:{n:064x}" for n, _ in images[:len(report.images)]]
    flood = ws.ImageCacheReport(images=[ws.CachedImage(digest=f"d{i}", names=[f"n{i}-{j}" for j in range(50)])
                                        for i in range(500)])
    assert len(reported_names(flood)) == MAX_REPORTED_IMAGES * (1 + MAX_REPORTED_NAMES)


def test_prepull_lists_per_pool() -> None:
    parsed = prepull.pool_images(["python:3.11,debian", "gpu=lab/cuda:12", "gpu=python:3.11"])
    assert parsed == {None: ("python:3.11", "debian"), "gpu": ("lab/cuda:12", "python:3.11")}
    assert prepull.for_pool(parsed, "gpu") == ("python:3.11", "debian", "lab/cuda:12")
    assert prepull.for_pool(parsed, "standard") == ("python:3.11", "debian")
    assert prepull.pool_images(prepull.to_args(parsed)[1::2]) == parsed
    for bad in ("", ",", "=busybox", "a b", "x" * 256, ",".join(f"i{n}" for n in range(33))):
        with pytest.raises(ValueError):
            prepull.pool_images([bad])


class Cache:
    """What ImageReporter reads of the image cache."""

    def __init__(self, *images: HeldImage) -> None:
        self.images = list(images)

    def held(self) -> list[HeldImage]:
        return self.images


def test_the_reporter_names_images_as_jobs_wrote_them_while_the_cache_holds_them(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    def normalise(name: str) -> str:
        if not name:
            raise ValueError("an image reference is required")
        return f"registry.example/{name}"

    cache = Cache(held(DIGEST, "registry.example/lab/tool:1"))
    reporter = ImageReporter(cache, normalise)  # type: ignore[arg-type]
    assert reporter.ran("lab/tool:1") and not reporter.ran("lab/tool:1")  # new once
    assert not reporter.ran("")  # not a name (normalising refuses it): nothing to say
    assert list(reporter.report().images[0].names) == ["registry.example/lab/tool:1", "lab/tool:1"]
    cache.images = []  # evicted: neither name is reported
    assert not reporter.report().images
    monkeypatch.setattr(image_report, "MAX_JOB_NAMES", 2)
    for name in ("a", "b", "c"):
        reporter.ran(name)
    cache.images = [held(DIGEST, *(f"registry.example/{n}" for n in ("a", "b", "c")))]
    assert "a" not in reporter.report().images[0].names  # the oldest forgotten


def test_corral_up_refuses_a_prepull_it_cannot_read_naming_the_flag(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    args = parser.parse_args(["up", "--data-dir", str(tmp_path), "--prepull", "=busybox"])
    with pytest.raises(UsageError, match="--prepull: '=busybox': a pool name before '='"):
        args.run(args)
    assert not any(tmp_path.iterdir())  # refused before anything started


def test_prepull_refuses_what_the_reference_grammar_refuses() -> None:
    for text, words in (("Busybox", "repositories are lowercase"), ("busybox:", "tag ''"),
                        ("lab/x@sha256:abc", "is not sha256:"), ("a" * 256, "longer than 255")):
        with pytest.raises(ValueError, match=words):
            prepull.image_list(text)
