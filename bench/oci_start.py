"""The job-start benchmark's OCI mode: no-op containers through the real OciRuntime.

`OciStarter` runs `busybox true` attempts as a worker does: the image from a
loopback registry (`docker-registry`, seeded with corral's busybox) through
the worker's image cache, each attempt a runc container on an overlay of
its own, in a cgroup of its own, on the worker's public bridge (the network
a job gets unless its spec says otherwise).

`StepClock` times each step of an attempt by wrapping the functions the
runtime calls for it (in this process only, for the benchmark's duration):
the wall time of every call, by step. One attempt at a time, on a quiet
machine, a step's wall time is about its CPU in the worker's process, plus
what it waits for (runc, the kernel).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import percentile, progress
from bench.starter import Starter
from services.common.image_refs import DOCKER_HUB, Mirror
from services.registry.seed import seed
from services.registry.server import RegistryServer
from services.up.ports import free_port
from services.worker.images import ImageCache
from services.worker.oci import cgroups, layer, slots
from services.worker.oci import runc as runc_module
from services.worker.oci import runtime as oci_runtime_module
from services.worker.oci.config import OciRuntimeConfig
from services.worker.oci.images import CachedRootfs
from services.worker.oci.runtime import OciRuntime, host_refusals

IMAGE = "busybox"

# (step, object, attribute): the steps of one attempt in the order they happen. Steps in `TEARDOWN`
# happen inside the teardown (its total is the "teardown" step).
RUNTIME_DELETE = "  runtime delete (runc's; crun deletes its own)"
"""The one step a runtime may skip: crun, in the foreground, deletes its container itself."""
STEPS = (
    ("uid claim", OciRuntime, "_claim_uid"),
    ("attempt directory", layer, "make_attempt_dir"),
    ("image (cached)", CachedRootfs, "acquire"),
    ("root filesystem (overlay mount)", layer, "make_root"),
    ("job directories, inputs", OciRuntime, "_fill"),
    ("network namespace, veth", OciRuntime, "_network_of"),
    ("cgroup (limits)", cgroups.AttemptCgroup, "create"),
    ("config.json", layer, "write_private"),
    ("the keeper asked to start it", runc_module.Keeper, "run"),
    ("the runtime until the job runs", oci_runtime_module, "wait_until_running"),
    ("job runs until exit", OciRuntime, "_supervise"),
    ("teardown", OciRuntime, "_teardown"),
    (RUNTIME_DELETE, runc_module.Runc, "delete"),
    ("  network teardown", slots.Slots, "release"),
    ("  cgroup removal", cgroups, "remove_tree"),
    ("  overlay unmount, removal", layer, "remove_oci_dir"),
)


def why_not() -> str:
    """Why this machine cannot run the OCI mode; '' if it can."""
    if os.geteuid() != 0:
        return "not root"
    if refusals := host_refusals():
        return "; ".join(refusals)
    missing = [tool for tool in ("docker-registry", "skopeo", "umoci") if shutil.which(tool) is None]
    return f"missing {', '.join(missing)}" if missing else ""


class StepClock:
    """Wall time of each step's calls, in ms."""

    def __init__(self) -> None:
        self.calls: dict[str, list[float]] = {step: [] for step, _, _ in STEPS}

    @contextlib.contextmanager
    def installed(self) -> Iterator[StepClock]:
        saved = [(owner, name, owner.__dict__[name]) for _, owner, name in STEPS]
        try:
            for step, owner, name in STEPS:
                setattr(owner, name, self._wrap(step, owner.__dict__[name]))
            yield self
        finally:
            for owner, name, original in saved:
                setattr(owner, name, original)

    def clear(self) -> None:
        for calls in self.calls.values():
            calls.clear()

    def p50_ms(self) -> dict[str, float]:
        """Each step's median wall time per call (steps never called are left out)."""
        return {step: round(percentile(calls, 50), 2) for step, calls in self.calls.items() if calls}

    def _wrap(self, step: str, original: Any) -> Any:
        kind = type(original) if isinstance(original, (classmethod, staticmethod)) else None
        function = original.__func__ if kind is not None else original
        calls = self.calls[step]

        if asyncio.iscoroutinefunction(function):
            @functools.wraps(function)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return await function(*args, **kwargs)
                finally:
                    calls.append((time.perf_counter() - started) * 1000)
            wrapped: Callable[..., Any] = timed_async
        else:
            @functools.wraps(function)
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return function(*args, **kwargs)
                finally:
                    calls.append((time.perf_counter() - started) * 1000)
            wrapped = timed
        return kind(wrapped) if kind is not None else wrapped


class OciStarter(Starter):
    """No-op containers of busybox through one OciRuntime. `container_cpu_ms` is the CPU spent inside the
    attempts' cgroups (the job's processes and runc's init once it joined), which the benchmark's own cgroup
    does not see."""

    def __init__(self, runtime: OciRuntime, scratch: Path, memory_bytes: int):
        super().__init__(runtime, scratch, memory_bytes, IMAGE)
        self.oci = runtime

    def container_cpu_ms(self) -> float:
        """CPU of every attempt so far, from the cgroup parent of this runtime's attempts (cpuacct charges
        each ancestor, so it keeps what removed attempts used)."""
        hierarchies = cgroups.Hierarchies.of_host()
        parent = hierarchies.by_controller["cpuacct"] / self.oci.owner.cgroup_parent.lstrip("/")
        if not parent.exists():
            return 0.0
        if hierarchies.version == cgroups.V1:
            return int((parent / "cpuacct.usage").read_text()) / 1e6
        stat = dict(line.split() for line in (parent / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e3


@contextlib.asynccontextmanager
async def oci_starter(scratch: Path, memory_bytes: int) -> AsyncIterator[OciStarter]:
    """A loopback registry serving busybox, an image cache pulling from it, and an OCI runtime of its own
    (its state under `scratch`); all stopped and removed afterwards."""
    scratch.mkdir(parents=True, exist_ok=True)
    registry = RegistryServer(scratch / "registry", free_port(), log_file=scratch / "registry.log")
    registry.start()
    try:
        registry.wait_ready()
        progress(f"oci: seeding the registry at {registry.url}")
        await asyncio.to_thread(seed, registry.address, scratch / "seed")
        # As corral up's workers: busybox is Docker Hub's, served by the registry as docker.io's mirror.
        images = ImageCache(scratch / "images", registry.url,
                            mirrors=(Mirror.parse(f"{DOCKER_HUB}={registry.url}/{DOCKER_HUB}"),))
        try:
            runtime = OciRuntime(OciRuntimeConfig(CachedRootfs(images), owner=f"bench-{os.getpid()}",
                                                  state_root=scratch / "state"))
            try:
                yield OciStarter(runtime, scratch / "attempts", memory_bytes)
            finally:
                await runtime.close()
        finally:
            await images.close()
    finally:
        registry.stop()

