"""Transient UNAVAILABLE retried by gRPC itself, for the calls that may be repeated.

A method may be retried when its proto says it can be called twice with no
harm (`idempotency_level` NO_SIDE_EFFECTS or IDEMPOTENT): reads, cancels,
and the writes that carry an idempotency token. The list is read from the
compiled descriptors the package ships, so a method marked in the protos is
retried without a change here, and one that is not marked never is.

gRPC's retry policy (gRFC A6) waits a random time between 0 and the current
back-off before each attempt (the jitter), the back-off growing by
`BACKOFF_MULTIPLIER` from `INITIAL_BACKOFF_S` up to `MAX_BACKOFF_S`. A
server stream is retried only until its first message arrives; after that
the client's own resumption takes over (`watch`).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FileDescriptor

from corral.auth.v1 import auth_service_pb2
from corral.batch.v1 import batch_service_pb2, job_group_service_pb2, job_service_pb2, lock_service_pb2
from corral.billing.v1 import billing_service_pb2

MAX_ATTEMPTS = 4
"""The first try and three retries."""
INITIAL_BACKOFF_S = 0.2
MAX_BACKOFF_S = 2.0
BACKOFF_MULTIPLIER = 2.0
RETRYABLE_CODES = ("UNAVAILABLE",)

_PUBLIC_FILES: tuple[FileDescriptor, ...] = (
    auth_service_pb2.DESCRIPTOR, batch_service_pb2.DESCRIPTOR, job_service_pb2.DESCRIPTOR,
    job_group_service_pb2.DESCRIPTOR, lock_service_pb2.DESCRIPTOR, billing_service_pb2.DESCRIPTOR)
_REPEATABLE = (descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS, descriptor_pb2.MethodOptions.IDEMPOTENT)


def repeatable_methods() -> list[tuple[str, str]]:
    """(full service name, method name) of every public method the protos mark as safe to repeat."""
    found = []
    for file in _PUBLIC_FILES:
        for service in file.services_by_name.values():
            for method in service.methods:
                if method.GetOptions().idempotency_level in _REPEATABLE:
                    found.append((service.full_name, method.name))
    return sorted(found)


def service_config() -> dict[str, Any]:
    """The channel's service config: the retry policy on every repeatable method."""
    return {"methodConfig": [{
        "name": [{"service": service, "method": method} for service, method in repeatable_methods()],
        "retryPolicy": {
            "maxAttempts": MAX_ATTEMPTS,
            "initialBackoff": f"{INITIAL_BACKOFF_S}s",
            "maxBackoff": f"{MAX_BACKOFF_S}s",
            "backoffMultiplier": BACKOFF_MULTIPLIER,
            "retryableStatusCodes": list(RETRYABLE_CODES),
        },
    }]}


def channel_options() -> list[tuple[str, Any]]:
    """Options for every channel the client opens."""
    return [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(service_config()))]
