"""corral: a multi-tenant batch job system.

The Python client (`corral.Client`, and `corral.aio.Client` for asyncio), the
batch builder, typed errors, the `corral` command line, and the code
generated from corral's protobuf contracts (`corral.<api>.v1`).
"""

from corral.builder import BatchBuilder, JobHandle
from corral.client import Client
from corral.errors import (
    CorralError,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "BatchBuilder", "Client", "CorralError", "FailedPrecondition", "FieldViolation", "InvalidArgument",
    "JobHandle", "NotFound", "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "UsageError",
]
