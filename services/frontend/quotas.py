"""One user's share of a frontend replica: which of its methods are reads and which are submissions,
and the `UserQuotas` (services.common.call_limits) its `Limits` make.

A read is a unary method the contract marks `NO_SIDE_EFFECTS` (read from the compiled descriptors, so a
new read is counted without a change here); server streams have their own count (max_streams_per_user).
A submission is a call that starts a new batch or update: each is a transaction that reserves job ids
and open-job counts, and a script that loops on them (753 batches in 50 s, issue 33) fills the tables.
AddJobs bunches and CommitUpdate belong to an update already counted.
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import ServiceDescriptor

from corral.batch.v1 import (
    batch_service_pb2,
    fleet_service_pb2,
    image_service_pb2,
    job_group_service_pb2,
    job_service_pb2,
    lock_service_pb2,
    secret_service_pb2,
)
from corral.billing.v1 import billing_service_pb2
from services.common.call_limits import UserQuotas
from services.common.rate_limits import TokenBucket
from services.frontend.limits import Limits

SERVICES: tuple[ServiceDescriptor, ...] = (
    batch_service_pb2.DESCRIPTOR.services_by_name["BatchService"],
    job_service_pb2.DESCRIPTOR.services_by_name["JobService"],
    job_group_service_pb2.DESCRIPTOR.services_by_name["JobGroupService"],
    lock_service_pb2.DESCRIPTOR.services_by_name["LockService"],
    billing_service_pb2.DESCRIPTOR.services_by_name["BillingService"],
    secret_service_pb2.DESCRIPTOR.services_by_name["SecretService"],
    image_service_pb2.DESCRIPTOR.services_by_name["ImageService"],
    fleet_service_pb2.DESCRIPTOR.services_by_name["FleetService"],
)
"""Every public service the frontend serves."""

SUBMISSIONS = frozenset({
    "/corral.batch.v1.BatchService/CreateBatch",
    "/corral.batch.v1.BatchService/SubmitBatch",
    "/corral.batch.v1.BatchService/CreateUpdate",
    "/corral.batch.v1.BatchService/RerunFailedJobs",
})
"""The calls that start a batch or an update."""

READ_RETRY_AFTER_S = 1.0
"""What a refusal for too many reads at once tells the client to wait: a read's end is not known in
advance; most take milliseconds, the heaviest the statement time limit (5 s)."""


def read_methods() -> frozenset[str]:
    """Full names of the unary methods that change nothing."""
    return frozenset(
        f"/{service.full_name}/{method.name}" for service in SERVICES for method in service.methods
        if method.GetOptions().idempotency_level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS
        and not method.server_streaming and not method.client_streaming)


def user_quotas(limits: Limits) -> UserQuotas:
    """What `limits` allow one user of one replica."""
    return UserQuotas(
        requests=TokenBucket(limits.max_requests_per_user_per_s, limits.max_request_burst_per_user),
        max_concurrent_reads=limits.max_concurrent_reads_per_user,
        read_methods=read_methods(),
        read_retry_after_s=READ_RETRY_AFTER_S,
        submissions=TokenBucket(limits.max_submissions_per_user_per_minute / 60.0,
                                limits.max_submissions_per_user_per_minute),
        submission_methods=SUBMISSIONS,
    )
