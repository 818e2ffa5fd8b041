"""A provider for the driver's own loops' tests: machines are names in a dict, and a test says what the
"cloud" refuses. It stands in for the cloud only where the cloud is not what is tested (the autoscaler's
and the reconciler's reactions); the real providers are tested against loopback servers of their clouds'
REST APIs in tests/clouds."""

from __future__ import annotations

from collections.abc import Collection

from services.driver.providers.interface import InstanceRequest
from services.driver.pricing.products import LOCAL, Machine
from services.driver.providers.errors import ProviderError


class StubCloud:
    """Implements services.driver.providers.interface.InstanceProvider."""

    def __init__(self) -> None:
        self.machines: dict[str, InstanceRequest] = {}
        self.creates: list[InstanceRequest] = []
        """Every create call, refused or not."""
        self.deletes: list[str] = []
        self.refuse_in: dict[str, ProviderError] = {}
        """Region -> what a create there raises."""
        self.refuse_all: ProviderError | None = None
        self.place_in: dict[str, str] = {}
        """Region asked for -> the region the "cloud" puts the machine in instead."""
        self.ended: set[str] = set()
        """Machines it knows are gone for good (`gone`), as the local provider knows its ended workers."""
        self.gcp_prices = False
        """Price its machines as GCP's n2 in their regions (else as the local provider's)."""

    def machine(self, request: InstanceRequest) -> Machine:
        return Machine("gcp", "n2", request.preemptible, request.region) if self.gcp_prices else LOCAL

    def machine_kinds(self) -> set[Machine]:
        return {LOCAL}

    async def create(self, request: InstanceRequest) -> str | None:
        self.creates.append(request)
        refusal = self.refuse_all or self.refuse_in.get(request.region)
        if refusal is not None:
            raise refusal
        self.machines[request.name] = request
        return self.place_in.get(request.region)

    async def delete(self, name: str) -> None:
        self.deletes.append(name)
        self.machines.pop(name, None)

    async def alive(self) -> set[str]:
        return set(self.machines)

    async def gone(self, names: Collection[str]) -> set[str]:
        return self.ended & set(names)
