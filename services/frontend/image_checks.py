"""The images of a submission, checked before anything is written: each reference must be one
(services.common.image_refs: `Busybox`, `busybox:` and a malformed digest are refused, one line each), and
its registry one a job may pull from (services.common.registry_rules), the host names resolved now. A bare
name is Docker Hub's (`docker.io`); `localhost/...` is corral's own registry, refused when the deployment
has none.

A name that does not resolve, or not within the resolver's time, is accepted: the worker checks the
registry again, resolving it itself, right before each pull (services.worker.egress), so a name that
resolves to an internal address later is refused there; refusing it here would only make a submission
depend on this replica's DNS. A name that resolves to any internal address is refused, without saying
which address.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from corral.batch.v1 import job_spec_pb2 as spec_pb
from services.common.callback_hosts import Resolve, SystemResolver, Unresolved
from services.common.errors import FieldViolation
from services.common.image_refs import DOCKER_HUB, OWN_REGISTRY, InvalidImageReference, parse_reference
from services.common.registry_rules import RegistryHost, RegistryRules, needs_lookup, refusal
from services.common.urls import IPAddress


class ImageChecks:
    """What the frontend checks jobs' images against: the registries the deployment names, the limit on
    registries per request, and DNS (through `resolve`)."""

    def __init__(self, rules: RegistryRules = RegistryRules(), max_registries: int = 16,
                 resolve: Resolve | None = None):
        self.rules = rules
        self.max_registries = max_registries
        """Most registries the jobs of one request may name (Docker Hub's and the own registry aside): each may
        cost a DNS lookup."""
        self._own_resolver = SystemResolver() if resolve is None else None
        self._resolve: Resolve = resolve or self._own_resolver  # type: ignore[assignment]

    async def violations(self, specs: Sequence[spec_pb.JobSpec], field: str = "jobs") -> list[FieldViolation]:
        """A violation per job whose image is not a reference or names a registry it may not pull from
        (`{field}[i].image`), or one on `field` when the jobs name more registries than `max_registries`. A
        job without an image is check_bunch's to refuse."""
        violations: list[FieldViolation] = []
        by_registry: dict[str, list[int]] = {}
        hosts: dict[str, RegistryHost] = {}
        for i, spec in enumerate(specs):
            if not spec.image.strip():
                continue
            try:
                registry = parse_reference(spec.image).registry
                if registry not in hosts:
                    hosts[registry] = RegistryHost.parse(registry)
            except InvalidImageReference as e:
                violations.append(FieldViolation(f"{field}[{i}].image", str(e)))
                continue
            by_registry.setdefault(registry, []).append(i)
        # Docker Hub (every bare name's) and corral's own (`localhost/...`) are not looked up, nor counted: a
        # submission of `busybox` should not wait on DNS (nor fail offline), and the worker checks every
        # registry again before each pull all the same.
        counted = [registry for registry in by_registry if registry not in (DOCKER_HUB, OWN_REGISTRY)]
        if len(counted) > self.max_registries:
            return violations + [FieldViolation(
                field, f"the jobs name {len(counted)} registries: at most {self.max_registries} in one request "
                       "(max_registries_per_request)")]
        lookups = [registry for registry in counted if needs_lookup(hosts[registry], self.rules)]
        resolved = dict(zip(lookups, await asyncio.gather(*(self._addresses(hosts[r]) for r in lookups))))
        for registry, jobs in by_registry.items():
            if (why := refusal(hosts[registry], self.rules, resolved.get(registry, []))) is not None:
                violations += [FieldViolation(f"{field}[{i}].image", why) for i in jobs]
        return sorted(violations, key=lambda v: _job_index(v.field))

    def close(self) -> None:
        """Stop the resolver's threads, if it made its resolver."""
        if self._own_resolver is not None:
            self._own_resolver.close()

    async def _addresses(self, host: RegistryHost) -> list[IPAddress]:
        """The addresses of a registry's host name; none when it does not resolve (see the module docstring)."""
        try:
            return await self._resolve(host.host, host.port)
        except Unresolved:
            return []


def _job_index(field: str) -> int:
    """The job a violation's field names (`jobs[3].image` is 3), for the order of the answer."""
    _, _, rest = field.partition("[")
    number = rest.partition("]")[0]
    return int(number) if number.isdigit() else -1
