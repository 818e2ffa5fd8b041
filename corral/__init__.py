"""corral: a multi-tenant batch job system.

The Python client (`corral.Client`, and `corral.aio.Client` for asyncio), the
batch builder, typed errors, the `corral` command line, and the code
generated from corral's protobuf contracts (`corral.<api>.v1`).
"""

import os

# gRPC's C core logs each failed TLS handshake on stderr at INFO level unless told otherwise (grpcio 1.6x,
# with its absl logging), on top of the call's own error: `corral` would print it before its one `error:`
# line. ERROR is the level gRPC documents as its default; GRPC_VERBOSITY set by the user wins. Set before
# grpc is first imported, which is below.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from corral.builder import BatchBuilder, JobHandle  # noqa: E402 - after GRPC_VERBOSITY
from corral.client import Client  # noqa: E402
from corral.errors import (  # noqa: E402
    AlreadyExists,
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
    "AlreadyExists", "BatchBuilder", "Client", "CorralError", "FailedPrecondition", "FieldViolation", "InvalidArgument",
    "JobHandle", "NotFound", "PermissionDenied", "ResourceExhausted", "Unauthenticated", "Unavailable", "UsageError",
]
