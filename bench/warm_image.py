"""warm-image: the first and the second job of a new image on one warm worker.

The benchmark builds a new image, corral's busybox plus a layer of
`--layer-mib` MiB of random bytes (incompressible, so the registry serves,
and the worker fetches and unpacks, all of it; a new random layer each run,
so no cache anywhere holds it), pushes it to a loopback `docker-registry`,
and starts `corral up` with that registry as its own (`--registry`), the OCI
runtime (runc) and one local worker of two cores. A warm-up job of busybox
(its own small image) brings the worker up; then two jobs of the new image
run one after the other, each `true`, each in a batch of its own:

  first    the worker has never seen the image: the job waits for the pull
           (skopeo fetches the layers, umoci unpacks them into the cache);
  second   the image is in the worker's cache (services/worker/images.py):
           the job starts as soon as its container does.

For each: seconds from the submission call to the attempt's start (the
container running, as the worker reports it) and to its end, and the ratio of
the first's time to start to the second's. Issue 35's acceptance asks for a
ratio of at least 5 (docs/performance.md has the figures). Every clock is
this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import corral
from bench.common import BenchContext, positive_int, progress
from bench.e2e import fresh_schema
from bench.oci_start import why_not
from services.registry.seed import cached_busybox, layout_digest
from services.registry.server import RegistryServer
from services.up import process as up_process
from services.up.ports import free_port

NAME = "warm-image"
HELP = "the first and the second job of a new 100 MiB image on a warm worker (OCI runtime)"

DEFAULT_LAYER_MIB, SMOKE_LAYER_MIB = 100, 4
PHASES = ("first", "second")
PROJECT = "default"
"""The billing project of the jobs, whose repositories in corral's registry hold the images."""


def figure_names() -> list[str]:
    """Every figure a run prints, in order."""
    return [*(f"{NAME}.{phase}.{what}" for phase in PHASES for what in ("submit_to_start_s", "submit_to_end_s")),
            f"{NAME}.start_ratio"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layer-mib", type=positive_int, metavar="N",
                        help=f"MiB of random bytes in the new image's layer (default {DEFAULT_LAYER_MIB}; "
                             f"{SMOKE_LAYER_MIB} with --smoke)")


def build_image(work: Path, layer_mib: int) -> Path:
    """An OCI layout in `work` holding busybox (tag `busybox`) and busybox plus a layer of `layer_mib` MiB of
    random bytes at /payload.bin (tag `new`)."""
    busybox, _ = cached_busybox(work / "seed")
    layout = work / "layout"
    shutil.copytree(busybox, layout)
    subprocess.run(["umoci", "tag", "--image", f"{layout}:latest", "busybox"], check=True, capture_output=True)
    payload = work / "payload.bin"
    with payload.open("wb") as f:
        for _ in range(layer_mib):
            f.write(os.urandom(1 << 20))
    subprocess.run(["umoci", "insert", "--image", f"{layout}:latest", "--tag", "new", str(payload), "/payload.bin"],
                   check=True, capture_output=True)
    payload.unlink()
    return layout


def push(layout: Path, tag: str, reference: str) -> str:
    """Copy `layout:tag` to the registry as `reference` (plain HTTP, no login); its digest."""
    subprocess.run(["skopeo", "copy", "--quiet", "--dest-tls-verify=false", "--dest-no-creds", f"oci:{layout}:{tag}",
                    f"docker://{reference}"], check=True, capture_output=True, stdin=subprocess.DEVNULL)
    return layout_digest(layout, tag)


@dataclasses.dataclass(frozen=True)
class JobTimes:
    to_start_s: float
    to_end_s: float
    instance: str


def run_one(client: corral.Client, image: str, name: str) -> JobTimes:
    """Submit one `true` job of `image` in a batch of its own; seconds from the submission call to its attempt's
    start and end."""
    batch = corral.BatchBuilder(PROJECT, attributes={"name": name})
    batch.job(image, ["true"], cores=1)
    submitted = time.time()
    done = client.wait(client.submit(batch).batch_id)
    if done.counts.n_succeeded != 1:
        raise RuntimeError(f"the {name} job did not succeed: {done.counts}")
    attempt = client.get_job(done.batch_id, 1).attempts[-1]
    return JobTimes(attempt.started_at.ToMilliseconds() / 1000 - submitted,
                    attempt.ended_at.ToMilliseconds() / 1000 - submitted, attempt.instance_name)


def measure(ctx: BenchContext, layer_mib: int) -> tuple[dict[str, JobTimes], dict[str, Any]]:
    """Build and push the image, start corral up, run the warm-up and both jobs, stop everything (blocking)."""
    with fresh_schema(ctx.server) as database_url, tempfile.TemporaryDirectory(prefix="corral-bench-warm-") as tmp:
        work = Path(tmp)
        registry = RegistryServer(work / "registry", free_port())
        registry.start()
        try:
            registry.wait_ready()
            progress(f"{NAME}: building busybox plus {layer_mib} MiB of random bytes")
            started = time.perf_counter()
            layout = build_image(work, layer_mib)
            build_s = time.perf_counter() - started
            nonce = secrets.token_hex(4)
            # In the billing project the jobs run in: a project's images in corral's registry are its members'.
            busybox = f"{registry.address}/{PROJECT}/busybox:{nonce}"
            image = f"{registry.address}/{PROJECT}/warm-{nonce}:1"
            push(layout, "busybox", busybox)
            digest = push(layout, "new", image)
            shutil.rmtree(layout)
            progress(f"{NAME}: starting corral up (one worker of 2 cores, the OCI runtime)")
            up = up_process.start(work / "up", "--database-url", database_url, "--registry", registry.url,
                                  "--worker-cores", "2", "--max-workers", "1", "--idle-timeout", "300",
                                  "--worker-runtime", "oci")
            try:
                with corral.Client(up.endpoints["frontend"], up.admin_token, ca_cert=up.endpoints["ca_cert"]) as client:
                    progress(f"{NAME}: warm-up (busybox)")
                    warm = run_one(client, busybox, "warm-up")
                    times = {}
                    for phase in PHASES:
                        progress(f"{NAME}: the {phase} job of {image}")
                        times[phase] = run_one(client, image, phase)
            finally:
                up.stop()
        finally:
            registry.stop()
    instances = {warm.instance, *(t.instance for t in times.values())}
    if len(instances) != 1:
        raise RuntimeError(f"the jobs ran on {sorted(instances)}, not on one warm worker")
    return times, {"image": image, "digest": digest, "build_seconds": round(build_s, 1)}


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    if reason := why_not():
        raise RuntimeError(f"{NAME} runs jobs in containers, which this machine cannot: {reason}")
    layer_mib = args.layer_mib or (SMOKE_LAYER_MIB if ctx.smoke else DEFAULT_LAYER_MIB)
    times, about = await asyncio.to_thread(measure, ctx, layer_mib)
    names = iter(figure_names())
    for phase in PHASES:
        ctx.figures.add(next(names), round(times[phase].to_start_s, 3), "s")
        ctx.figures.add(next(names), round(times[phase].to_end_s, 3), "s")
    ctx.figures.add(next(names), round(times["first"].to_start_s / max(times["second"].to_start_s, 1e-3), 1), "x")
    return {**about, "layer_mib": layer_mib, "job": "true (busybox), 1 core, a batch of its own",
            "worker": "one local worker of 2 cores, OCI runtime (runc), warmed up by a busybox job",
            "registry": "docker-registry on loopback, corral up's --registry", "smoke": ctx.smoke}
