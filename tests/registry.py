"""A real registry for tests: `docker-registry` on a free loopback port in a temporary directory,
seeded with corral's busybox (services.registry.seed) and a few variants of it (same layer, each its
own digest), and a second registry on the same storage that asks for a login. Stopped by pid.

As in `corral up`, the images are under `docker.io/library/` (`docker.io/library/busybox:latest`,
`docker.io/library/variant:N`): with the registry as docker.io's mirror (`SeededRegistry.mirror`), the bare
names `busybox` and `variant:N` are served by it."""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path

import bcrypt

from services.common.image_refs import DOCKER_HUB, Mirror
from services.registry.seed import SEED_NAMESPACE, cached_busybox, layout_digest, seed
from services.registry.server import RegistryServer
from services.up.ports import free_port

USERNAME = "alice"
PASSWORD = "correct horse battery staple"
VARIANTS = 3


@dataclasses.dataclass(frozen=True)
class SeededRegistry:
    """What the tests pull from."""

    server: RegistryServer
    login_server: RegistryServer
    """The same images behind a login (USERNAME, PASSWORD)."""
    busybox_digest: str
    variants: dict[str, str]
    """`variant:N` -> digest: busybox with a label `n=N`, so each is an image of its own."""

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def address(self) -> str:
        return self.server.address

    @property
    def mirror(self) -> Mirror:
        """This registry as docker.io's mirror (`docker.io=http://ADDRESS/docker.io`)."""
        return Mirror.parse(f"{DOCKER_HUB}={self.url}/{DOCKER_HUB}")

    def at(self, name: str, login: bool = False) -> str:
        """`name` (`busybox`, `variant:0`) as this registry holds it: `ADDRESS/docker.io/library/NAME`
        (on the login server with `login`)."""
        address = self.login_server.address if login else self.address
        return f"{address}/{SEED_NAMESPACE}/{name}"


def _variants(registry: str, work: Path) -> dict[str, str]:
    layout, _ = cached_busybox(work / "seed")
    found = {}
    for n in range(VARIANTS):
        tag = f"v{n}"
        subprocess.run(["umoci", "config", "--image", f"{layout}:latest", "--tag", tag, "--config.label", f"n={n}",
                        "--history.created", "1970-01-01T00:00:00Z"], check=True, capture_output=True)
        subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--dest-no-creds",
                        f"oci:{layout}:{tag}", f"docker://{registry}/{SEED_NAMESPACE}/variant:{n}"],
                       check=True, capture_output=True)
        found[f"variant:{n}"] = layout_digest(layout, tag)
    return found


def start(work: Path) -> SeededRegistry:
    """Start both registries in `work` and seed them; stop them with `stop`."""
    server = RegistryServer(work / "open", free_port())
    htpasswd = work / "htpasswd"
    htpasswd.write_bytes(USERNAME.encode() + b":" + bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)) + b"\n")
    login_server = RegistryServer(work / "login", free_port(), htpasswd=htpasswd, storage=server.storage)
    try:
        server.start()
        login_server.start()
        server.wait_ready()
        login_server.wait_ready()
        [busybox] = seed(server.address, work / "seed")
        return SeededRegistry(server, login_server, busybox.digest, _variants(server.address, work))
    except BaseException:
        login_server.stop()
        server.stop()
        raise


def stop(registry: SeededRegistry) -> None:
    registry.login_server.stop()
    registry.server.stop()


def running(work: Path) -> Iterator[SeededRegistry]:
    """For fixtures: the registries, stopped afterwards."""
    registry = start(work)
    try:
        yield registry
    finally:
        stop(registry)
