"""The OCI runtime running images pulled from a real registry on loopback through the worker's image cache
(CachedRootfs over services.worker.images.ImageCache): the image's digest in the attempt's isolation note,
held while attempts run it and released by each, 50 attempts of a new image pulling and unpacking it once,
a pull that fails ending the attempt in Error in corral's words (no such image, not authorised, registry
unreachable: never the registry's own, nor its address), a registry on the host's loopback never contacted
unless the deployment allows it, and a private image behind a login run only by jobs whose credentials the
registry accepts."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from services.worker.image_tools import Credentials
from services.worker.images import ImageCache
from services.worker.oci.images import CachedRootfs
from services.worker.runtime_api import JobOutcome
from tests import registry as test_registry
from tests.oci.host import OciHost, fields, run, spec
from tests.registry import PASSWORD, USERNAME
from tests.service.test_image_cache import Runs, open_cache


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[test_registry.SeededRegistry]:
    yield from test_registry.running(tmp_path_factory.mktemp("registry"))


@pytest.fixture
async def cache(tmp_path: Path, registry: test_registry.SeededRegistry) -> AsyncIterator[ImageCache]:
    images = open_cache(tmp_path / "image-cache", registry.url, Runs())  # docker.io's mirror: `busybox` is there
    try:
        yield images
    finally:
        await images.close()


async def test_jobs_run_the_registrys_busybox_held_while_they_run(oci_host: OciHost, cache: ImageCache,
                                                          registry: test_registry.SeededRegistry) -> None:
    runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
    started: list[str] = []

    async def one(i: int) -> None:
        job = oci_host.job(spec("echo pid=$$; echo host=$(hostname)"), attempt_id=f"r{i}")

        async def on_started(pid: int) -> None:
            started.append(runtime.isolation(job))
            assert cache.held()[0].users >= 1  # held while it runs, so never evicted then

        outcome, log = await run(runtime, job, on_started)
        assert outcome.state == "Success", log
        assert fields(log)["pid"] == "1"
        assert registry.busybox_digest in outcome.isolation  # the digest that ran, for `corral job`

    await asyncio.gather(*(one(i) for i in range(5)))
    assert len(started) == 5 and all(registry.busybox_digest in note for note in started)
    [held] = cache.held()
    assert (held.digest, held.users) == (registry.busybox_digest, 0)  # one image, released by every attempt


async def test_an_image_the_registry_does_not_have_is_an_error_in_corrals_words(oci_host: OciHost,
                                                                               cache: ImageCache) -> None:
    runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
    missing = spec("true")
    missing.image = "localhost/lab/no-such-image:1"
    job = oci_host.job(missing)
    outcome, _ = await run(runtime, job)
    # The registry's own answer: the spec's image, which no other worker would find either; not retried.
    assert (outcome.state, outcome.end_reason) == ("Error", "refused")
    assert outcome.error_message == "image: could not get 'localhost/lab/no-such-image:1': no such image", \
        outcome.error_message
    assert cache.held() == []


async def test_a_registry_that_does_not_answer_is_the_systems_error_and_tried_again(
        oci_host: OciHost, tmp_path: Path, registry: test_registry.SeededRegistry) -> None:
    """Unlike the registry's own refusals (refused, above), a registry nobody answers at may be back, or
    reachable from another worker: system_error, which the driver tries again elsewhere. (The deployment
    allows this loopback registry: otherwise it is refused before any pull, below.)"""
    cache = ImageCache(tmp_path / "allowing-cache", registry.url, allowed_registries=("127.0.0.1:9",))
    try:
        runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
        unreachable = spec("true")
        unreachable.image = "127.0.0.1:9/busybox:latest"  # the discard port: nothing listens
        outcome, _ = await run(runtime, oci_host.job(unreachable))
    finally:
        await cache.close()
    assert (outcome.state, outcome.end_reason) == ("Error", "system_error"), outcome
    # corral's words: not skopeo's "dial tcp 127.0.0.1:9: connect: connection refused".
    assert outcome.error_message == \
        "image: could not get '127.0.0.1:9/busybox:latest': registry unreachable: 127.0.0.1:9", outcome.error_message


async def test_a_registry_on_the_hosts_loopback_is_refused_before_any_connection(oci_host: OciHost,
                                                                                 cache: ImageCache) -> None:
    """Issue 33 part 6: `image: 127.0.0.1:PORT/x` made the worker connect to the host's own port and tell the
    user what answered ("connection refused", "certificate signed by unknown authority"). Now the worker
    checks the registry again before a pull (DNS may have changed since submission) and contacts nothing.
    docs/security.md, "What must not happen": an image reference makes a worker probe the host."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
        for image in (f"127.0.0.1:{port}/x", "169.254.169.254/latest/meta-data", "[::1]:22/x",
                      f"localhost:{port}/x"):
            probe = spec("true")
            probe.image = image
            outcome, _ = await run(runtime, oci_host.job(probe))
            assert (outcome.state, outcome.end_reason) == ("Error", "refused"), outcome
            assert outcome.error_message.startswith(f"image: could not get {image!r}: registry "), outcome
            assert "a job's image comes from a public registry, or from one this deployment allows" in \
                outcome.error_message
            assert "connection refused" not in outcome.error_message
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked


async def test_50_jobs_of_a_new_image_pull_and_unpack_it_once(oci_host: OciHost, tmp_path: Path,
                                                              registry: test_registry.SeededRegistry) -> None:
    """Acceptance 7 of issue 13: 50 attempts starting together on an image no worker holds yet."""
    runs = Runs()
    cache = open_cache(tmp_path / "counted-cache", registry.url, runs)
    try:
        runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
        image = spec("true")
        image.image = "variant:0"
        outcomes = await asyncio.gather(*(run(runtime, oci_host.job(image, attempt_id=f"v{i}")) for i in range(50)))
        assert [outcome.state for outcome, _ in outcomes] == ["Success"] * 50, [o.error_message for o, _ in outcomes]
        assert runs.count() == {"inspect": 1, "copy": 1, "unpack": 1}
        assert [(held.digest, held.users) for held in cache.held()] == [(registry.variants["variant:0"], 0)]
    finally:
        await cache.close()


async def test_a_private_image_runs_only_for_jobs_whose_login_the_registry_accepts(
        oci_host: OciHost, tmp_path: Path, registry: test_registry.SeededRegistry) -> None:
    """Issue 13, Images: a job's image on a registry that asks for a login (the login server's htpasswd)
    runs with its image pull secret's credentials (JobRun.pull_credentials); with a wrong password or none it
    ends in Error with the registry's reason, never Failed. Once held, the private image is not handed to a
    job without credentials or with a wrong password (another project's job, say): the registry is asked
    again with theirs. A later job with a good login reuses it, unpacked once."""
    runs = Runs()
    cache = open_cache(tmp_path / "private-cache", None, runs,
                       allowed_registries=(f"http://{registry.login_server.address}",))
    private = registry.at("busybox", login=True)
    try:
        runtime = oci_host.runtime(rootfs=CachedRootfs(cache))
        good, wrong = Credentials(USERNAME, PASSWORD), Credentials(USERNAME, "not the password")

        async def attempt(attempt_id: str, credentials: Credentials | None) -> JobOutcome:
            job = spec("echo ran")
            job.image = private
            outcome, _ = await run(runtime, oci_host.job(job, attempt_id=attempt_id, pull_credentials=credentials))
            return outcome

        for attempt_id, credentials in (("wrong", wrong), ("anonymous", None)):
            refused = await attempt(attempt_id, credentials)
            assert (refused.state, refused.end_reason) == ("Error", "refused"), refused
            assert refused.error_message == f"image: could not get {private!r}: not authorised", refused.error_message
            assert PASSWORD not in refused.error_message and "not the password" not in refused.error_message
        assert runs.count()["copy"] == 0 and cache.held() == []

        ran = await attempt("good", good)
        assert ran.state == "Success", ran.error_message
        assert registry.busybox_digest in ran.isolation
        assert runs.count()["unpack"] == 1

        for attempt_id, credentials in (("other-project", None), ("other-wrong", wrong)):
            runs.clear()
            refused = await attempt(attempt_id, credentials)
            assert (refused.state, refused.end_reason) == ("Error", "refused"), refused
            assert refused.error_message == f"image: could not get {private!r}: not authorised", refused.error_message
            assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}  # asked the registry, handed nothing
        assert [(held.digest, held.users) for held in cache.held()] == [(registry.busybox_digest, 0)]

        runs.clear()
        again = await attempt("good-again", good)
        assert again.state == "Success", again.error_message
        assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}  # the cached image: no second unpack
    finally:
        await cache.close()
    # The auth files skopeo read are gone: the password is in no file of the cache or the attempts.
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()
                and PASSWORD.encode() in p.read_bytes()]
