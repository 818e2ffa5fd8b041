"""What `corral images ls` may show of the workers' caches, from the worker's report through the driver's merge
to the frontend's filter: only references any job may run (pulled without a job's credentials, never a project's
`localhost/...` image), counted per digest, within bounds whatever the fleet reports."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.batch.v1 import image_pb2
from corral.cli_images import image_line
from corral.driver.v1 import driver_service_pb2 as pb
from corral.driver.v1 import worker_session_pb2 as ws
from services.driver.held_images import MAX_ANSWER_BYTES, MAX_HELD_IMAGES, MAX_INSTANCES, MAX_REFERENCES, held_images
from services.driver.sessions import reported_images
from services.frontend.images import workers_hold
from services.worker.image_report import cache_report
from services.worker.images import HeldImage

PUBLIC = "sha256:" + "a" * 64
PRIVATE = "sha256:" + "b" * 64
PROJECT = "sha256:" + "c" * 64


def held(digest: str, *references: str, public: bool) -> HeldImage:
    return HeldImage(digest, tuple(sorted(references)), 1, 0, 0, 0, public)


def test_a_worker_reports_as_public_only_what_any_job_may_run() -> None:
    report = cache_report([
        held(PUBLIC, "docker.io/library/busybox:latest", "localhost/alpha/busybox:1", public=True),
        held(PRIVATE, "registry.lab.example/lab/secret:1", public=False),  # pulled with a job's credentials
        held(PROJECT, "localhost/alpha/tool:1", public=True),  # the own registry's login: "public" to the cache
    ], {"busybox": "docker.io/library/busybox:latest"})
    assert {i.digest: list(i.public_references) for i in report.images} == {
        PUBLIC: ["docker.io/library/busybox:latest"], PRIVATE: [], PROJECT: []}
    # The names the scheduler matches are all still there.
    assert "busybox" in report.images[0].names and "localhost/alpha/busybox:1" in report.images[0].names


def test_the_driver_counts_workers_per_digest_and_the_frontend_lists_only_public_references() -> None:
    worker = cache_report([held(PUBLIC, "docker.io/lab/tool:1", public=True),
                           held(PRIVATE, "registry.lab.example/lab/secret:1", public=False)], {})
    # A worker that says a `localhost/` name is public is not believed, by the driver nor the frontend.
    liar = ws.ImageCacheReport(images=[ws.CachedImage(digest=PROJECT, public_references=["localhost/alpha/tool:1"]),
                                       ws.CachedImage(digest=PUBLIC, public_references=["docker.io/lab/tool:1"])])
    images, truncated = held_images({"i1": reported_images(worker), "i2": reported_images(liar)})
    assert not truncated
    assert [(i.digest, i.workers_holding, list(i.public_references), list(i.instances)) for i in images] == [
        (PUBLIC, 2, ["docker.io/lab/tool:1"], ["i1", "i2"]), (PRIVATE, 1, [], ["i1"]), (PROJECT, 1, [], ["i2"])]
    forged = pb.ListHeldImagesResponse(images=[
        *images, pb.HeldImage(digest=PROJECT, workers_holding=1, public_references=[
            "localhost/alpha/tool:1", "tool:1", "Not A Reference"])])
    hold = workers_hold(forged)
    assert hold.public == {"docker.io/lab/tool:1": PUBLIC}  # not normalised, not a reference, localhost: left out
    assert hold.workers_holding == {PUBLIC: 2, PRIVATE: 1, PROJECT: 1}


references = st.lists(st.text(st.sampled_from("abc/:.l"), min_size=1, max_size=300), max_size=20)


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=8),
                       st.dictionaries(st.integers(0, 3000).map(lambda n: f"sha256:{n:064x}"), references, max_size=64),
                       max_size=40))
def test_the_answer_is_bounded_and_the_most_widely_held_come_first(
        fleet: dict[str, dict[str, list[str]]]) -> None:
    reports = {instance: reported_images(ws.ImageCacheReport(images=[
        ws.CachedImage(digest=d, public_references=r) for d, r in images.items()])) for instance, images in fleet.items()}
    images, truncated = held_images(reports)
    distinct = {d for held in reports.values() for d in held}
    assert len(images) <= MAX_HELD_IMAGES and sum(i.ByteSize() + 4 for i in images) <= MAX_ANSWER_BYTES
    assert truncated == (len(images) < len(distinct))
    counts = [i.workers_holding for i in images]
    assert counts == sorted(counts, reverse=True)
    for image in images:
        holders = [n for n, held in reports.items() if image.digest in held]
        assert image.workers_holding == len(holders) and list(image.instances) == sorted(holders)[:MAX_INSTANCES]
        assert len(image.public_references) <= MAX_REFERENCES
        assert not any(r.startswith("localhost/") for r in image.public_references)


def test_a_flood_of_images_is_cut_to_the_most_widely_held() -> None:
    one = {f"sha256:{n:064x}": ("docker.io/lab/x" + "y" * 200 + f":{n}",) for n in range(2000)}
    everyone = {f"sha256:{n:064x}": () for n in range(3)}
    images, truncated = held_images({"i1": one, "i2": everyone, "i3": everyone})
    assert truncated and len(images) == MAX_HELD_IMAGES
    assert [i.workers_holding for i in images[:3]] == [3, 3, 3]


def test_images_ls_shows_how_many_workers_hold_each_image_or_that_it_is_unknown() -> None:
    base = image_pb2.Image(reference="docker.io/library/busybox:latest", name="busybox", tag="latest", digest=PUBLIC,
                           size_bytes=2 << 20, layers=1, workers_holding=1)
    assert image_line(base) == f"docker.io/library/busybox:latest  {PUBLIC}  2 MiB  layers=1  workers=1"
    only_held = image_pb2.Image(reference="docker.io/lab/tool:1", digest=PRIVATE, workers_holding=3)
    assert image_line(only_held) == f"docker.io/lab/tool:1  {PRIVATE}  -  layers=-  workers=3"
    unknown = image_pb2.Image(reference="localhost/alpha/tool:1", billing_project="alpha", name="tool", tag="1",
                              digest=PROJECT, size_bytes=1024, layers=2)
    assert image_line(unknown).endswith("layers=2  workers=?")
    none = image_pb2.Image(reference="localhost/alpha/tool:1", billing_project="alpha", digest=PROJECT,
                           workers_holding=0)
    assert image_line(none).endswith("workers=0")
