"""Helpers over a batch: `concatenate`, a tree of `cat` jobs."""

from __future__ import annotations

import math

from corral.pipeline.batch import Batch
from corral.pipeline.exceptions import BatchException
from corral.pipeline.resource import ResourceFile


def concatenate(b: Batch, files: list[ResourceFile], image: str | None = None,
                branching_factor: int = 100) -> ResourceFile:
    """One file that is `files` one after the other, made by jobs named `concatenate-LEVEL-INDEX` that each
    `cat` at most `branching_factor` files (a tree, so no job reads thousands)."""
    if not files:
        raise BatchException("Must have at least one file to concatenate.")
    if not all(isinstance(f, ResourceFile) for f in files):
        raise BatchException("Invalid input file(s) - all inputs must be resource files.")
    if not isinstance(branching_factor, int) or branching_factor < 2:
        raise BatchException(f"branching_factor must be an int of at least 2; found {branching_factor!r}")
    n_levels = math.ceil(math.log(len(files), branching_factor)) if len(files) > 1 else 0
    level_digits = len(str(max(n_levels - 1, 0)))
    level_files = list(files)
    for level in range(n_levels):
        groups = [level_files[i:i + branching_factor] for i in range(0, len(level_files), branching_factor)]
        index_digits = len(str(len(groups) - 1))
        merged = []
        for index, group in enumerate(groups):
            job = b.new_job(name=f"concatenate-{level:0{level_digits}}-{index:0{index_digits}}")
            if image:
                job.image(image)
            job.command(f"cat {' '.join(group)} > {job.ofile}")
            merged.append(job.ofile)
        level_files = merged
    return level_files[0]
