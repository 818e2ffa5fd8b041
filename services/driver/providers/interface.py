"""The one seam between the driver and a cloud (design §6): what the autoscaler asks for
(`InstanceRequest`) and what makes and removes machines (`InstanceProvider`).

The local provider (`local.py`) makes a "machine" a worker process on this host; the clouds'
(`gcp.py`, `azure.py`) make virtual machines. The autoscaler drives each the same way: it records
the instance (pending) with a fresh activation token, then asks the provider to create it; the
worker activates itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from typing import Protocol

from services.driver.pricing.products import Machine


@dataclasses.dataclass(frozen=True)
class InstanceRequest:
    """What the autoscaler asks a provider for."""

    name: str
    inst_coll: str
    cores_mcpu: int
    memory_bytes: int
    region: str
    activation_token: str = dataclasses.field(repr=False)
    """One-time; never in a log line (hence not in the repr)."""
    preemptible: bool = False
    """A spot machine, which the cloud may reclaim."""
    storage_bytes: int = 0
    """Its scratch storage (the pool's machine's; 0: not known)."""
    machine_type: str = ""
    """A cloud machine type to use as is (a job-private pool's); '': the provider picks one from the
    pool's cores and memory."""
    any_region: bool = False
    """The jobs it is for may run in any region: a provider may place it in another of its regions when
    `region` has no quota or capacity left."""


class InstanceProvider(Protocol):
    """Creates and deletes machines that run a corral worker."""

    def machine(self, request: InstanceRequest) -> Machine:
        """What the machine for `request` is, for its price: series or size, spot or not, `request.region`."""

    def machine_kinds(self) -> set[Machine]:
        """Every machine it may create, for their prices (services.driver.pricing)."""

    async def create(self, request: InstanceRequest) -> str | None:
        """Start a machine; its worker will call ActivateWorker with the token. The region it is in, where
        that is not `request.region` (an `any_region` request placed elsewhere); None: the one asked for."""

    async def delete(self, name: str) -> None:
        """Stop a machine (idempotent)."""

    async def alive(self) -> set[str]:
        """Names of machines that exist (for cleaning up orphans)."""

    async def gone(self, names: Collection[str]) -> set[str]:
        """Those of `names` (instances `alive` did not list) whose machines it knows to be gone for good, not
        merely not listed yet: the reconciler ends them at once instead of after its grace period. A cloud's
        listing may lag its creates, so a cloud knows none; the local provider knows the worker processes its
        data directory's drivers started, and which of them ended."""
