"""Which gRPC services each gateway exposes, and where each one goes, read from the descriptor set.

No route is written by hand: the public gateway exposes every service that
has a `google.api.http` annotation (the style guide puts them on public
services only), the internal gateway every service of the driver's internal
package. The one thing written here is which upstream serves which proto
package, so a new public package fails generation until someone says where
it is served.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from services.gateway.descriptors import package_descriptor_set

PUBLIC_UPSTREAMS = {
    "corral.auth.v1": "auth",
    "corral.batch.v1": "frontend",
    "corral.billing.v1": "frontend",
}
"""Which upstream serves each public proto package."""
INTERNAL_PACKAGES = ("corral.driver.v1",)
"""The packages the internal gateway routes to the leading driver."""
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")
"""Server reflection (grpcurl, buf curl), routed to the frontends: they list their own services (not yet
the auth service's)."""


@dataclasses.dataclass(frozen=True)
class RoutedService:
    """A gRPC service and the upstream that serves it."""

    name: str
    """Full name, e.g. 'corral.batch.v1.BatchService'."""
    upstream: str
    """'auth', 'frontend' or 'driver'."""
    streaming_methods: tuple[str, ...]
    """Methods that stream (either way): their routes have no timeout."""
    client_streaming_methods: tuple[str, ...] = ()
    """Methods whose requests stream (an image's upload): their gRPC routes have no body size limit, as the
    service bounds what it reads itself (REST bodies keep the limit: they are routed by their REST path)."""


def _routed(files: Iterable[descriptor_pb2.FileDescriptorProto], upstream_of: dict[str, str],
            public: bool) -> list[RoutedService]:
    found = []
    for file in files:
        for service in file.service:
            annotated = any(m.options.HasExtension(annotations_pb2.http) for m in service.method)
            if annotated != public:
                continue
            name = f"{file.package}.{service.name}"
            upstream = upstream_of.get(file.package)
            if upstream is None:
                if public:
                    raise ValueError(f"{name} has REST annotations but no upstream serves {file.package}: "
                                     f"add it to services.gateway.routing.PUBLIC_UPSTREAMS")
                continue
            streaming = tuple(m.name for m in service.method if m.client_streaming or m.server_streaming)
            uploads = tuple(m.name for m in service.method if m.client_streaming and not m.server_streaming)
            found.append(RoutedService(name, upstream, streaming, uploads))
    return sorted(found, key=lambda s: s.name)


def public_services(files: descriptor_pb2.FileDescriptorSet | None = None) -> list[RoutedService]:
    """Every service with a REST annotation and the upstream serving it, sorted by name."""
    files = files if files is not None else package_descriptor_set()
    return _routed(files.file, PUBLIC_UPSTREAMS, public=True)


def internal_services(files: descriptor_pb2.FileDescriptorSet | None = None) -> list[RoutedService]:
    """The driver's services, which workers reach through the internal gateway."""
    files = files if files is not None else package_descriptor_set()
    return _routed(files.file, {p: "driver" for p in INTERNAL_PACKAGES}, public=False)
