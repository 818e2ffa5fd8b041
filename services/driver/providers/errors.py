"""What a provider's `create` raises when a cloud refuses a machine, whatever the cloud.

The autoscaler reacts by kind: a full zone or region is tried elsewhere (another zone, then another of
the pool's regions for jobs that may run anywhere); a permission or configuration error is not retried
until an operator acts, and is logged loudly; anything else backs off.
"""

from __future__ import annotations


class ProviderError(Exception):
    """A cloud refused or failed a request. `retry_elsewhere`: another zone or region may succeed."""

    retry_elsewhere = False

    def __init__(self, message: str, *, region: str = "", zone: str = ""):
        super().__init__(message)
        self.region = region
        self.zone = zone


class QuotaExceeded(ProviderError):
    """The project's or subscription's quota in `region` is used up (cores, instances, addresses)."""

    retry_elsewhere = True


class CapacityExhausted(ProviderError):
    """The cloud has no machines of this shape in `zone` now (GCP ZONE_RESOURCE_POOL_EXHAUSTED, Azure
    AllocationFailed / SkuNotAvailable)."""

    retry_elsewhere = True


class PermissionDenied(ProviderError):
    """The driver's identity may not do this: an operator must grant it."""


class InvalidRequest(ProviderError):
    """The cloud rejected the request's shape (bad machine type, image, network): a configuration error."""


class TransientError(ProviderError):
    """A failure that may pass by itself (rate limit, 5xx, a time-out): try again later."""
