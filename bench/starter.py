"""No-op attempts through a runtime, as a worker runs them (job-start's process and OCI modes)."""

from __future__ import annotations

import shutil
from pathlib import Path

from corral.batch.v1 import job_spec_pb2
from services.worker.logs import LogSink
from services.worker.runtime import ContainerRuntime, JobRun


class Starter:
    """Runs no-op attempts (`true` in `image`, a quarter core) through one runtime, each checked to succeed
    and its directory removed."""

    def __init__(self, runtime: ContainerRuntime, scratch: Path, memory_bytes: int, image: str = "none"):
        self.runtime = runtime
        self.scratch = scratch
        self.memory_bytes = memory_bytes
        self.image = image
        self._count = 0

    async def start_one(self) -> None:
        self._count += 1
        job = JobRun(batch_id=1, job_id=self._count, attempt_id=f"a{self._count}",
                     spec=job_spec_pb2.JobSpec(image=self.image, argv=job_spec_pb2.Argv(args=["true"])),
                     cores_mcpu=250, memory_bytes=self.memory_bytes, scratch=self.scratch)
        outcome = await self.runtime.run(job, LogSink(job.log_path), _nothing)
        if outcome.state != "Success":
            raise RuntimeError(f"a no-op attempt ended {outcome.state}: {outcome.error_message}")
        shutil.rmtree(job.attempt_dir)

    def container_cpu_ms(self) -> float:
        """CPU the attempts used outside the benchmark's own cgroup: none, for a runtime whose attempts are
        the benchmark's descendants."""
        return 0.0


async def _nothing(pid: int) -> None:
    pass
