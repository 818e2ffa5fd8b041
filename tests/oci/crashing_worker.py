"""A worker's OCI runtime in a process of its own, for tests that kill it:
`python -m tests.oci.crashing_worker STATE_ROOT OWNER SCRATCH IMAGES MARK MODE DEPLOYMENT`
runs one attempt of `sleep 120` (network_mode MODE) in the cgroups of DEPLOYMENT (its environment carries TEST_MARK=MARK),
prints `started` once it runs, and waits to be killed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from corral.batch.v1 import job_spec_pb2 as js
from services.worker.logs import LogSink
from services.worker.oci import OciRuntime, OciRuntimeConfig
from services.worker.oci.images import DirectoryRootfs
from services.worker.runtime_api import JobRun


async def main(state_root: str, owner: str, scratch: str, images: str, mark: str, mode: str,
               deployment: str) -> None:
    runtime = OciRuntime(OciRuntimeConfig(DirectoryRootfs(Path(images)), owner=owner, state_root=Path(state_root),
                                          deployment=deployment))
    spec = js.JobSpec(image="busybox", script="sleep 120", network_mode=js.NetworkMode.Value(mode),
                       env={"TEST_MARK": mark})
    job = JobRun(batch_id=9, job_id=1, attempt_id="crash", spec=spec, cores_mcpu=500, memory_bytes=2**25,
                 scratch=Path(scratch))

    async def started(pid: int) -> None:
        print("started", flush=True)

    await runtime.run(job, LogSink(job.log_path), started)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
