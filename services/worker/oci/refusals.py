"""What in a job's spec the OCI runtime cannot honour, on any machine."""

from __future__ import annotations

from pathlib import PurePosixPath

from corral.batch.v1 import job_spec_pb2
from services.worker.job_files import path_refusals, url_refusals
from services.worker.runtime_api import command_refusals

CONTAINER_MOUNTS = ("/proc", "/sys", "/dev")
"""Where the container's own mounts hide the root filesystem: no input or output may be there."""


def oci_refusals(spec: job_spec_pb2.JobSpec) -> list[str]:
    """What in `spec` the OCI runtime cannot honour (on any machine)."""
    reasons = command_refusals(spec)
    hidden = (*CONTAINER_MOUNTS, *(s.mount_path for s in spec.secrets))
    for s in spec.secrets:
        reasons += path_refusals(f"secret {s.name!r} mount_path", s.mount_path)
    for what, path in ([("input to_path", f.to_path) for f in spec.input_files]
                       + [("output from_path", f.from_path) for f in spec.output_files]):
        refused = path_refusals(what, path)
        reasons += refused
        if not refused and any(_below(path, top) for top in hidden):
            reasons.append(f"{what} {path!r} is where the container mounts something of its own (/proc, /sys, "
                           "/dev or a secret), which hides the files the worker copies")
    for f in spec.input_files:
        reasons += url_refusals("input", f.from_url)
    for f in spec.output_files:
        reasons += url_refusals("output", f.to_url)
    return reasons


def _below(path: str, top: str) -> bool:
    return PurePosixPath(path) == PurePosixPath(top) or PurePosixPath(top) in PurePosixPath(path).parents
