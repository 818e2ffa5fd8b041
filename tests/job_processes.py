"""Finding a job's processes from the host, whatever the runtime did to them:
by their environment, which every process of a job inherits (a pid the job
prints is one of its own namespace when the process runtime isolates it)."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

from corral.batch.v1 import job_spec_pb2


def marked(spec: job_spec_pb2.JobSpec) -> tuple[job_spec_pb2.JobSpec, str]:
    """The spec with a unique TEST_MARK in its environment; the mark."""
    mark = uuid.uuid4().hex
    spec.env["TEST_MARK"] = mark
    return spec, mark


def processes_with(**env: str) -> list[int]:
    """Host pids of the live processes whose environment has every NAME=value given (zombies have none)."""
    needles = {f"{name}={value}".encode() for name, value in env.items()}
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needles <= set(Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def processes_marked(mark: str) -> list[int]:
    """Host pids of the live processes of a job `marked` gave `mark`."""
    return processes_with(TEST_MARK=mark)


async def processes_marked_soon(mark: str, timeout_s: float = 10.0) -> list[int]:
    """`processes_marked`, once there are some. runc writes its pid file, and so reports a container
    started, a moment before its init process execs the job's command: until then the only process is
    runc's own, without the job's environment."""
    deadline = time.monotonic() + timeout_s
    while not (pids := processes_marked(mark)):
        assert time.monotonic() < deadline, f"no process of the job marked {mark} in {timeout_s:g} s"
        await asyncio.sleep(0.01)
    return pids
