"""The worker's own check of a job's file URLs before it copies anything
(defence in depth: the frontend checked them at submission).

Every `input_files[].from_url` and `output_files[].to_url` must lie under the
storage roots the driver sent with the job (`RunJob.storage_roots`, the
billing project's), by the rules of services/common/urls.py. A local
(`file://`) URL must also stay under its root once symbolic links are
resolved, so a link inside a project's storage cannot lead the worker to
another project's files or to the host's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from corral.batch.v1 import job_spec_pb2
from services.common.urls import storage_url_problem


def _local_path(url: str) -> str:
    return url.split("://", 1)[1]


def _resolves_under(url: str, roots: Sequence[str]) -> bool:
    """Whether a file:// URL (already known to lie under one of `roots`) still does with links resolved."""
    real = os.path.realpath(_local_path(url))
    for root in roots:
        if root.lower().startswith("file://"):
            real_root = os.path.realpath(_local_path(root))
            if real == real_root or real.startswith(real_root.rstrip("/") + "/"):
                return True
    return False


def file_url_refusals(spec: job_spec_pb2.JobSpec, roots: Sequence[str]) -> list[str]:
    """Why each of the job's file URLs may not be copied; empty if all may."""
    refusals = []
    for what, url in ([("input", f.from_url) for f in spec.input_files]
                      + [("output", f.to_url) for f in spec.output_files]):
        if problem := storage_url_problem(url, roots):
            refusals.append(f"{what} URL {url!r} refused: {problem}")
        elif url.lower().startswith("file://") and not _resolves_under(url, roots):
            refusals.append(f"{what} URL {url!r} refused: a symbolic link leads it out of the storage roots")
    return refusals
