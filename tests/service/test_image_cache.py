"""The worker's image cache (services.worker.images) over a real registry on loopback, with the real
skopeo and umoci: every run of either is counted (`SkopeoUmoci.on_run`), nothing is mocked."""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from services.common.image_refs import InvalidImageReference, Mirror
from services.up.ports import free_port
from services.worker.image_tools import Credentials, ImagePullError, PullFailure, SkopeoUmoci, ToolTimeouts
from services.worker.images import TAG_TTL_S, CacheInUse, ImageCache
from tests.registry import PASSWORD, USERNAME, SeededRegistry

pytestmark = pytest.mark.timeout(60)


class Runs:
    """Every skopeo and umoci command the cache ran, in order."""

    def __init__(self) -> None:
        self.argv: list[list[str]] = []
        self.checks: list[Callable[[list[str]], None]] = []

    def __call__(self, argv: list[str]) -> None:
        for check in self.checks:
            check(argv)
        self.argv.append(argv)

    def count(self) -> dict[str, int]:
        """{'inspect': n, 'copy': n, 'unpack': n}."""
        return {"inspect": sum(a[:2] == ["skopeo", "inspect"] for a in self.argv),
                "copy": sum(a[:2] == ["skopeo", "copy"] for a in self.argv),
                "unpack": sum(a[:3] == ["umoci", "raw", "unpack"] for a in self.argv)}

    def clear(self) -> None:
        self.argv.clear()


class Clock:
    """Milliseconds that move by one at each look, and by more when the test says."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        self.ms += 1
        return self.ms


async def eventually(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.02)


def open_cache(root: Path, own: str | None, runs: Runs, clock: Clock | None = None, **options: object) -> ImageCache:
    """A cache whose own registry is `own` and, unless `mirrors` says otherwise, docker.io's mirror too (its
    images under docker.io/, as `corral up` has it)."""
    mirrors = (Mirror.parse(f"docker.io={own}/docker.io"),) if own else ()
    return ImageCache(root, own, tools=SkopeoUmoci(options.pop("timeouts", ToolTimeouts()), on_run=runs),
                      clock_ms=clock or Clock(), mirrors=options.pop("mirrors", mirrors),  # type: ignore[arg-type]
                      **options)  # type: ignore[arg-type]


@pytest.fixture
def runs() -> Runs:
    return Runs()


@pytest.fixture
async def cache(tmp_path: Path, registry: SeededRegistry, runs: Runs) -> AsyncIterator[ImageCache]:
    images = open_cache(tmp_path / "cache", registry.url, runs)
    try:
        yield images
    finally:
        await images.close()


async def test_a_pull_by_tag_and_then_by_digest_unpacks_the_image_once(
        cache: ImageCache, registry: SeededRegistry, runs: Runs) -> None:
    image = await cache.pull("busybox")
    assert (image.digest, image.reference) == (registry.busybox_digest, "docker.io/library/busybox:latest")
    assert runs.argv[0][-1] == f"docker://{registry.at('busybox')}:latest"  # docker.io's mirror
    assert (image.rootfs / "bin" / "busybox").read_bytes() == Path("/bin/busybox").read_bytes()
    assert image.config["config"]["Cmd"] == ["/bin/sh"]
    assert image.size_bytes >= Path("/bin/busybox").stat().st_size
    assert runs.count() == {"inspect": 1, "copy": 1, "unpack": 1}

    runs.clear()
    for reference in (f"busybox@{image.digest}", "docker.io/library/busybox", "index.docker.io/busybox:latest"):
        assert (await cache.pull(reference)).rootfs == image.rootfs
    assert runs.argv == []  # a held digest needs no registry; the tag was resolved a moment ago
    [held] = cache.held()
    assert held.references == ("docker.io/library/busybox:latest", f"docker.io/library/busybox@{image.digest}")
    assert (held.digest, held.size_bytes, held.users) == (image.digest, image.size_bytes, 0)


async def test_a_pull_by_digest_needs_no_tag_resolution(cache: ImageCache, registry: SeededRegistry,
                                                        runs: Runs) -> None:
    image = await cache.pull(f"busybox@{registry.busybox_digest}")
    assert image.digest == registry.busybox_digest
    assert runs.count() == {"inspect": 0, "copy": 1, "unpack": 1}


async def test_50_concurrent_pulls_of_a_new_image_run_skopeo_and_umoci_once(
        cache: ImageCache, registry: SeededRegistry, runs: Runs) -> None:
    images = await asyncio.gather(*(cache.acquire("variant:0") for _ in range(50)))
    assert {image.digest for image in images} == {registry.variants["variant:0"]}
    assert runs.count() == {"inspect": 1, "copy": 1, "unpack": 1}
    assert [held.users for held in cache.held()] == [50]
    for image in images:
        cache.release(image)
    assert [held.users for held in cache.held()] == [0]
    with pytest.raises(ValueError, match="is not held"):
        cache.release(images[0])


async def test_a_cancelled_caller_leaves_the_shared_pull_to_the_others(
        cache: ImageCache, registry: SeededRegistry, runs: Runs) -> None:
    reference = f"variant:1@{registry.variants['variant:1']}"
    first = asyncio.create_task(cache.pull(reference))
    second = asyncio.create_task(cache.pull(reference))
    while runs.count()["copy"] == 0:
        await asyncio.sleep(0.001)
    first.cancel()
    image = await second
    assert first.cancelled() and image.digest == registry.variants["variant:1"]
    assert runs.count() == {"inspect": 0, "copy": 1, "unpack": 1}


async def test_a_tag_is_resolved_again_once_its_resolution_is_a_minute_old(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    clock = Clock()
    cache = open_cache(tmp_path / "cache", registry.url, runs, clock)
    try:
        await cache.pull("busybox")
        runs.clear()
        clock.ms += int(TAG_TTL_S * 1000) - 1000
        await cache.pull("busybox")
        assert runs.argv == []
        clock.ms += 2000
        await cache.pull("busybox")
        assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}
    finally:
        await cache.close()


@pytest.mark.parametrize(("reference", "words"), [
    ("localhost/docker.io/library/busybox:no-such-tag",
     "reading manifest no-such-tag in {registry}/docker.io/library/busybox: manifest unknown"),
    ("{registry}/no-such-image", "reading manifest latest in {registry}/no-such-image: manifest unknown"),
    ("localhost/docker.io/library/busybox@sha256:" + "0" * 64, "manifest unknown"),
])
async def test_a_missing_image_fails_with_the_registrys_words(
        cache: ImageCache, registry: SeededRegistry, reference: str, words: str) -> None:
    with pytest.raises(ImagePullError) as failed:
        await cache.pull(reference.format(registry=registry.address))
    assert failed.value.failure is PullFailure.NOT_FOUND
    assert failed.value.user_words == "no such image"
    assert words.format(registry=registry.address) in failed.value.detail
    assert str(failed.value).startswith(f"pulling {registry.address}/")
    assert cache.held() == []
    await eventually(lambda: list((cache.root / "tmp").iterdir()) == [], "the partial pull removed")


async def test_an_image_the_mirror_lacks_is_asked_of_its_registry_and_unreachable_names_it(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    """`registry.invalid` never resolves (RFC 2606), as docker.io does not offline: the mirror has no such image,
    the registry cannot be reached, and the user is told so naming the registry their reference names."""
    cache = open_cache(tmp_path / "cache", registry.url, runs,
                       mirrors=(Mirror.parse(f"registry.invalid={registry.url}/registry.invalid"),))
    try:
        started = time.monotonic()
        with pytest.raises(ImagePullError) as failed:
            await cache.pull("registry.invalid/lab/tool:1")
        print(f"mirror, then an unresolvable registry: failed in {time.monotonic() - started:.3f} s")
    finally:
        await cache.close()
    assert [argv[-1] for argv in runs.argv] == [f"docker://{registry.address}/registry.invalid/lab/tool:1",
                                               "docker://registry.invalid/lab/tool:1"]
    assert failed.value.failure is PullFailure.UNREACHABLE
    assert failed.value.user_words == "registry unreachable: registry.invalid"
    assert "manifest unknown" in failed.value.detail and "no such host" in failed.value.detail


async def test_a_job_with_a_pull_secret_gets_the_mirrors_image_without_sending_its_login_there(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    sent: list[str] = []
    runs.checks.append(lambda argv: sent.extend(Path(argv[argv.index(flag) + 1]).read_text()
                                                for flag in ("--authfile", "--src-authfile") if flag in argv))
    cache = open_cache(tmp_path / "cache", registry.url, runs)
    try:
        image = await cache.pull("busybox", Credentials("someone", "their docker hub password"))
        assert image.digest == registry.busybox_digest
        assert all("--no-creds" in argv or "--src-no-creds" in argv for argv in runs.argv[:2])  # no own login here
        assert sent == []
    finally:
        await cache.close()


async def test_a_registry_that_is_down_fails_at_once(tmp_path: Path, runs: Runs) -> None:
    cache = open_cache(tmp_path / "cache", f"http://127.0.0.1:{free_port()}", runs)
    try:
        started = time.monotonic()
        with pytest.raises(ImagePullError) as failed:
            await cache.pull("localhost/lab/tool")
        assert time.monotonic() - started < 5
        assert failed.value.failure is PullFailure.UNREACHABLE
        assert failed.value.user_words == "registry unreachable: localhost"
        assert "connection refused" in failed.value.detail
    finally:
        await cache.close()


async def test_a_registry_that_never_answers_times_out_and_its_skopeo_is_killed(tmp_path: Path, runs: Runs) -> None:
    with socket.socket() as silent:  # connections complete in the backlog; nothing ever answers them
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        cache = open_cache(tmp_path / "cache", f"http://{address}", runs, timeouts=ToolTimeouts(manifest_s=1.0))
        try:
            started = time.monotonic()
            with pytest.raises(ImagePullError) as failed:
                await cache.pull("localhost/lab/tool")
            assert time.monotonic() - started < 5
        finally:
            await cache.close()
    assert failed.value.failure is PullFailure.TIMED_OUT
    assert "skopeo inspect did not finish within 1 s" in failed.value.detail
    assert not [pid for pid in os.listdir("/proc") if pid.isdigit() and address.encode() in _cmdline(pid)]


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_a_reference_that_is_not_one_is_refused_before_any_pull(cache: ImageCache, runs: Runs) -> None:
    with pytest.raises(InvalidImageReference, match="repositories are lowercase"):
        await cache.pull("BusyBox")
    assert runs.argv == []


async def test_credentials_reach_skopeo_in_a_private_file_never_on_its_command_line(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    login = f"http://{registry.login_server.address}"
    auth_files: list[tuple[Path, int, int, str]] = []

    def auth_file_now(argv: list[str]) -> None:
        for flag in ("--authfile", "--src-authfile"):
            if flag in argv:
                path = Path(argv[argv.index(flag) + 1])
                auth_files.append((path, path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777,
                                   path.read_text()))

    runs.checks.append(auth_file_now)
    cache = open_cache(tmp_path / "cache", None, runs, allowed_registries=(login,))
    private = registry.at("busybox", login=True)
    try:
        with pytest.raises(ImagePullError) as anonymous:
            await cache.pull(private)
        assert anonymous.value.failure is PullFailure.UNAUTHORIZED
        assert "authentication required" in anonymous.value.detail
        assert "--no-creds" in runs.argv[0]  # never the worker's own credentials

        with pytest.raises(ImagePullError) as wrong:
            await cache.pull(private, Credentials(USERNAME, "not the password"))
        assert wrong.value.failure is PullFailure.UNAUTHORIZED

        image = await cache.pull(private, Credentials(USERNAME, PASSWORD))
        assert image.digest == registry.busybox_digest
    finally:
        await cache.close()
    assert not any(PASSWORD in arg or "not the password" in arg for argv in runs.argv for arg in argv)
    assert len(auth_files) == 3  # the wrong password's inspect; the right one's inspect and copy
    for path, mode, directory_mode, text in auth_files:
        assert (mode, directory_mode) == (0o600, 0o700)
        assert registry.login_server.address in text
        assert not path.exists() and not path.parent.exists()


async def test_a_private_image_in_the_cache_is_not_handed_to_someone_the_registry_refuses(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    cache = open_cache(tmp_path / "cache", None, runs, allowed_registries=(f"http://{registry.login_server.address}",))
    pinned = f"{registry.at('busybox', login=True)}@{registry.busybox_digest}"
    try:
        await cache.pull(registry.at("busybox", login=True), Credentials(USERNAME, PASSWORD))
        runs.clear()
        with pytest.raises(ImagePullError) as refused:
            await cache.pull(pinned)
        assert refused.value.failure is PullFailure.UNAUTHORIZED
        assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}  # asked the registry; fetched nothing

        runs.clear()
        image = await cache.pull(pinned, Credentials(USERNAME, PASSWORD))
        assert image.digest == registry.busybox_digest
        assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}
    finally:
        await cache.close()


async def test_anothers_wrong_password_does_not_fail_my_pull(tmp_path: Path, registry: SeededRegistry,
                                                             runs: Runs) -> None:
    cache = open_cache(tmp_path / "cache", None, runs, allowed_registries=(f"http://{registry.login_server.address}",))
    pinned = f"{registry.at('busybox', login=True)}@{registry.busybox_digest}"
    try:
        wrong, right = await asyncio.gather(cache.pull(pinned, Credentials(USERNAME, "wrong")),
                                            cache.pull(pinned, Credentials(USERNAME, PASSWORD)),
                                            return_exceptions=True)
        assert isinstance(wrong, ImagePullError) and wrong.failure is PullFailure.UNAUTHORIZED
        assert not isinstance(right, BaseException) and right.digest == registry.busybox_digest
        assert runs.count()["copy"] == 2
    finally:
        await cache.close()


async def test_the_own_registry_is_pulled_with_the_deployments_login_whatever_the_job_brings(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    """`corral up`'s registry asks for its pull login (issue 33 part 5): the cache pulls `localhost/...` and,
    as docker.io's mirror, bare names with it, a job's own login (meant for other registries) notwithstanding,
    and the password reaches skopeo in an auth file only. An image so pulled is public: every job may use the
    own registry."""
    deployment = Credentials(USERNAME, PASSWORD)
    sent: list[str] = []
    runs.checks.append(lambda argv: sent.extend(Path(argv[argv.index(flag) + 1]).read_text()
                                                for flag in ("--authfile", "--src-authfile") if flag in argv))
    cache = open_cache(tmp_path / "cache", f"http://{registry.login_server.address}", runs,
                       own_login=deployment, allowed_registries=(registry.address,))
    try:
        image = await cache.pull("busybox", Credentials("someone", "their own"))
        assert image.digest == registry.busybox_digest
        assert "--authfile" in runs.argv[0] and "--no-creds" not in runs.argv[0]
        deployments = base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()
        assert sent and all(deployments in text for text in sent)  # never the job's
        runs.clear()
        again = await cache.pull(f"busybox@{registry.busybox_digest}", Credentials("someone", "their own"))
        assert again.digest == image.digest and runs.count() == {"inspect": 0, "copy": 0, "unpack": 0}
        named = await cache.pull("localhost/docker.io/library/busybox", Credentials("someone", "their own"))
        assert named.digest == image.digest and "--authfile" in runs.argv[-1]
        with pytest.raises(ImagePullError) as other:  # the deployment's login is for the own registry only
            await cache.pull(f"{registry.address}/no-such-image:1")
        assert "--no-creds" in runs.argv[-1]
        assert other.value.failure is PullFailure.UNREACHABLE  # asked over HTTPS: allowed, but not written http://
    finally:
        await cache.close()
    assert not any(PASSWORD in arg for argv in runs.argv for arg in argv)


def images_on_disk(cache: ImageCache) -> set[str]:
    return {f"sha256:{path.name}" for path in (cache.root / "images").iterdir()}


async def test_the_least_recently_used_image_nobody_holds_is_evicted_first(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    v0, v1, v2 = (registry.variants[f"variant:{n}"] for n in range(3))
    probe = open_cache(tmp_path / "probe", registry.url, runs)
    size = (await probe.pull("variant:0")).size_bytes  # every variant unpacks to the same files
    await probe.close()
    cache = open_cache(tmp_path / "cache", registry.url, runs, max_bytes=2 * size + size // 2)  # room for two
    try:
        await cache.pull("variant:0")
        await cache.pull("variant:1")
        await cache.pull("variant:2")
        assert {held.digest for held in cache.held()} == {v1, v2}  # variant:0 was the least recently used
        await cache.pull("variant:1")  # used again: now variant:2 is the least recently used
        await cache.pull("variant:0")
        assert {held.digest for held in cache.held()} == {v0, v1}

        # An image in use is never evicted, however long ago it was last used.
        held = await cache.acquire("variant:1")
        await cache.pull("variant:0")
        await cache.pull("variant:2")
        assert {held.digest for held in cache.held()} == {v1, v2}
        await cache.pull("variant:0")
        assert {held.digest for held in cache.held()} == {v1, v0}
        cache.release(held)
        assert cache.size_bytes == 2 * size
        await eventually(lambda: images_on_disk(cache) == {v0, v1}, "the evicted images deleted")
    finally:
        await cache.close()


async def test_an_image_larger_than_the_cache_stays_while_held(tmp_path: Path, registry: SeededRegistry,
                                                               runs: Runs) -> None:
    cache = open_cache(tmp_path / "cache", registry.url, runs, max_bytes=1)
    try:
        async with cache.using("busybox") as image:
            # Not held, but a pull does not evict what it returns: it goes at the next eviction.
            other = await cache.pull("variant:0")
            assert {held.digest for held in cache.held()} == {image.digest, other.digest}
            await cache.pull("variant:1")
            assert {held.digest for held in cache.held()} == {image.digest, registry.variants["variant:1"]}
            assert (image.rootfs / "bin" / "busybox").exists()
        assert cache.held() == [] and cache.size_bytes == 0
        await eventually(lambda: images_on_disk(cache) == set(), "the images deleted")
    finally:
        await cache.close()


async def test_a_restarted_worker_finds_its_cache_and_drops_what_a_crash_left(
        tmp_path: Path, registry: SeededRegistry, runs: Runs) -> None:
    root = tmp_path / "cache"
    cache = open_cache(root, registry.url, runs)
    try:
        busybox = await cache.pull("busybox")
        await cache.pull(f"variant:0@{registry.variants['variant:0']}")
        before = cache.held()
        with pytest.raises(CacheInUse, match="another worker uses the image cache"):
            ImageCache(root, registry.url)
    finally:
        await cache.close()
    # What a worker killed mid-pull or mid-eviction leaves: a partial pull, an image directory with no
    # metadata (it cannot come from this cache's renames, but a disk can lose files), one whose files lie.
    (root / "tmp" / "pull-0123456789abcdef" / "layout").mkdir(parents=True)
    (root / "images" / ("ab" * 32) / "rootfs").mkdir(parents=True)
    liar = root / "images" / ("cd" * 32)
    (liar / "rootfs").mkdir(parents=True)
    (liar / "image-config.json").write_text("{}")
    (liar / "image.json").write_text('{"digest": "sha256:' + "ef" * 32 + '"}')

    runs.clear()
    restarted = open_cache(root, registry.url, runs)
    try:
        assert restarted.held() == before  # references, sizes, and when each was pulled and last used
        assert images_on_disk(restarted) == {held.digest for held in before}  # the debris was moved away at once
        await eventually(lambda: list((root / "tmp").iterdir()) == [], "the debris deleted")
        assert (await restarted.pull(f"busybox@{busybox.digest}")).rootfs == busybox.rootfs
        assert runs.argv == []
        await restarted.pull("busybox")  # what a tag names is asked again after a restart
        assert runs.count() == {"inspect": 1, "copy": 0, "unpack": 0}
    finally:
        await restarted.close()
    assert list((root / "tmp").iterdir()) == []


async def test_localhost_without_an_own_registry_asks_nobody(tmp_path: Path, runs: Runs) -> None:
    """`localhost/...` is corral's own registry, never this machine: with none, nothing is contacted."""
    cache = open_cache(tmp_path / "cache", None, runs)
    try:
        with pytest.raises(ImagePullError) as failed:
            await cache.pull("localhost/lab/tool:1")
    finally:
        await cache.close()
    assert failed.value.failure is PullFailure.NOT_FOUND
    assert failed.value.user_words == ("no such image: localhost/... names corral's own registry, and this "
                                       "deployment has none")
    assert runs.argv == []
