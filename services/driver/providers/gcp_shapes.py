"""The pure half of the GCP provider: which machine type a pool's machine is, whether a region's quotas
can take it, what names and labels Compute Engine accepts, and which typed provider error a Compute
Engine failure is. No SDK calls here (the SDK's exception classes are only read), so all of it is
tested without a server.

Machine types: N2 comes in three shapes per vCPU count (highcpu 1 GiB, standard 4 GiB, highmem 8 GiB
per vCPU; https://cloud.google.com/compute/docs/general-purpose-machines#n2_machine_types); corral takes
the fewest vCPUs that hold the pool's cores, then the leanest shape that holds its memory.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping

from services.driver.providers.errors import (CapacityExhausted, InvalidRequest, PermissionDenied, ProviderError,
                                              QuotaExceeded, TransientError)

GIB = 1024 ** 3

SHAPES: tuple[tuple[str, int], ...] = (("highcpu", 1), ("standard", 4), ("highmem", 8))
"""Each predefined shape of a family and its GiB of memory per vCPU, leanest first."""

SIZES: Mapping[str, tuple[int, ...]] = {
    # vCPU counts Compute Engine offers per N2 shape (highcpu stops at 96, highmem and standard at 128).
    "highcpu": (2, 4, 8, 16, 32, 48, 64, 80, 96),
    "standard": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "highmem": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
}

NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
"""An instance's name (RFC 1035 label, at most 63 characters), as instances.insert requires."""
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
"""A label value (lower case letters, digits, `_` and `-`; at most 63 characters)."""
FAMILY = re.compile(r"[a-z][a-z0-9]{1,9}")
MACHINE_TYPE = re.compile(r"[a-z][-a-z0-9]{0,62}")


@dataclasses.dataclass(frozen=True)
class MachineType:
    name: str
    """e.g. n2-standard-8."""
    vcpus: int
    """What it counts against the region's CPU quotas."""


def machine_type(family: str, cores_mcpu: int, memory_bytes: int) -> MachineType:
    """The predefined machine of `family` with the fewest vCPUs that hold `cores_mcpu` and `memory_bytes`
    and, among those, the leanest shape (0 bytes: no memory asked, the leanest shape)."""
    if not FAMILY.fullmatch(family):
        raise InvalidRequest(f"machine family {family!r} is not a family name such as n2")
    if cores_mcpu <= 0 or memory_bytes < 0:
        raise InvalidRequest(f"a machine needs cores (asked {cores_mcpu} mcpu) and memory >= 0 ({memory_bytes} B)")
    candidates = [(vcpus, rank, shape) for rank, (shape, gib_per_vcpu) in enumerate(SHAPES) for vcpus in SIZES[shape]
                  if vcpus * 1000 >= cores_mcpu and vcpus * gib_per_vcpu * GIB >= memory_bytes]
    if candidates:
        vcpus, _, shape = min(candidates)
        return MachineType(f"{family}-{shape}-{vcpus}", vcpus)
    raise InvalidRequest(f"no {family} machine has {cores_mcpu} mcpu and {memory_bytes} bytes: "
                         f"at most 128 vCPUs and 8 GiB per vCPU; name a machine type instead")


def named_machine_type(name: str, cores_mcpu: int) -> MachineType:
    """A machine type a job or pool names exactly; its vCPUs are taken from the request's cores (the
    name does not say them for every family), rounded up."""
    if not MACHINE_TYPE.fullmatch(name):
        raise InvalidRequest(f"machine type {name!r} is not a machine type name")
    return MachineType(name, max(1, math.ceil(cores_mcpu / 1000)))


@dataclasses.dataclass(frozen=True)
class RegionQuota:
    """A region's quota metric as regions.get reports it."""

    metric: str
    limit: float
    usage: float


def quota_shortfall(quotas: Iterable[RegionQuota], machine: MachineType, family: str, spot: bool) -> str:
    """Why a region's quotas cannot take one more `machine` ('' when they can). Spot machines count
    against PREEMPTIBLE_CPUS when the project has that quota (a limit above 0), else against CPUS; a
    family's own CPU quota (N2_CPUS) counts too."""
    by_metric = {q.metric: q for q in quotas}
    cpu_metric = "PREEMPTIBLE_CPUS" if spot and by_metric.get("PREEMPTIBLE_CPUS", RegionQuota("", 0, 0)).limit > 0 \
        else "CPUS"
    needs = {cpu_metric: machine.vcpus, f"{family.upper()}_CPUS": machine.vcpus, "INSTANCES": 1}
    for metric, amount in needs.items():
        quota = by_metric.get(metric)
        if quota is not None and quota.usage + amount > quota.limit:
            return f"quota {metric} has {quota.limit - quota.usage:g} of {quota.limit:g} left; {amount} needed"
    return ""


def label_value(text: str) -> str:
    """`text` as a label value: lower case, other characters as `-`, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def check_instance_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise InvalidRequest(f"instance name {name!r} is not valid on Compute Engine "
                             f"(lower case letters, digits and '-', starting with a letter, at most 63)")


# Codes of an operation's errors (Operation.error.errors[].code) and reasons of an HTTP error's
# errors[].reason, by the typed error they are.
_CAPACITY = {"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
             "REGION_RESOURCE_POOL_EXHAUSTED", "RESOURCE_POOL_EXHAUSTED", "insufficientCapacity"}
_QUOTA = {"QUOTA_EXCEEDED", "quotaExceeded", "RESOURCE_QUOTA_EXCEEDED"}
_RATE = {"rateLimitExceeded", "userRateLimitExceeded", "RATE_LIMIT_EXCEEDED",
         "CONCURRENT_OPERATIONS_QUOTA_EXCEEDED"}
_PERMISSION = {"forbidden", "PERMISSION_DENIED", "accessNotConfigured", "SERVICE_DISABLED",
               "IAM_PERMISSION_DENIED"}


def classify(status: int, codes: Iterable[str], message: str, *, region: str = "", zone: str = "") -> ProviderError:
    """The typed error for a Compute Engine failure: an HTTP status (of the call, or the operation's
    httpErrorStatusCode; 0 when there is none) and its error codes or reasons. Codes decide first (a
    quota error is a 403, as a permission error is)."""
    codes = set(codes)
    if codes & _CAPACITY:
        return CapacityExhausted(message, region=region, zone=zone)
    if codes & _QUOTA:
        return QuotaExceeded(message, region=region, zone=zone)
    if codes & _RATE or status == 429 or status >= 500 or status == 0:
        return TransientError(message, region=region, zone=zone)
    if codes & _PERMISSION or status in (401, 403):
        return PermissionDenied(message, region=region, zone=zone)
    return InvalidRequest(message, region=region, zone=zone)
