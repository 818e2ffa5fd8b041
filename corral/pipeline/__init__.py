"""corral.pipeline: hailtop.batch's public API on corral.

A hailtop.batch script runs by changing its import: `import corral.pipeline as hb`. A `Batch` of bash and
Python jobs, with the files between them, runs on this machine (`LocalBackend`) or on corral
(`ServiceBackend`). docs/pipeline.md is the tour and lists every difference from hailtop.batch.
"""

from corral.pipeline.backend.local import LocalBackend
from corral.pipeline.backend.service import ServiceBackend
from corral.pipeline.batch import Batch
from corral.pipeline.exceptions import BatchException
from corral.pipeline.job import BashJob, Job, PythonJob
from corral.pipeline.pool_executor import BatchPoolExecutor, BatchPoolFuture
from corral.pipeline.resource import (
    InputResourceFile,
    JobResourceFile,
    PythonResult,
    Resource,
    ResourceFile,
    ResourceGroup,
)
from corral.pipeline.utils import concatenate

__all__ = [
    "BashJob", "Batch", "BatchException", "BatchPoolExecutor", "BatchPoolFuture", "InputResourceFile", "Job",
    "JobResourceFile", "LocalBackend", "PythonJob", "PythonResult", "Resource", "ResourceFile", "ResourceGroup", "ServiceBackend", "concatenate",
]
