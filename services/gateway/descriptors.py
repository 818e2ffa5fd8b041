"""The descriptor set the REST/JSON transcoder reads, and the OpenAPI document the gateway serves.

The `corral` package ships `corral/descriptors.binpb` (scripts/gen_protos.py
writes it: every corral proto and its imports). The transcoder also needs
`google.rpc.Status` and the detail types corral's errors carry, to print a
failed call's status as JSON; the protos import neither, so they are added
here. The package's `corral/openapi.json` is written beside the descriptor
set (`openapi_path`): the public gateway serves it at OPENAPI_ROUTE; and the
Lua filter that refuses unknown REST body keys (services.gateway.rest_body_keys).
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from google.protobuf import any_pb2, descriptor, descriptor_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from services.gateway.rest_body_keys import lua_path, lua_source


def package_descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """The FileDescriptorSet the `corral` package ships (scripts/gen_protos.py writes it)."""
    data = importlib.resources.files("corral").joinpath("descriptors.binpb").read_bytes()
    return descriptor_pb2.FileDescriptorSet.FromString(data)


_ERROR_MODULES = (any_pb2, duration_pb2, status_pb2, error_details_pb2)
"""google.rpc.Status and the detail types corral's errors carry (BadRequest, PreconditionFailure, ...):
the transcoder prints an error's status as JSON only when it knows every type in it."""


def gateway_descriptor_set() -> bytes:
    """The package's descriptor set plus google.rpc.Status and its detail types, for the transcoder's
    `convert_grpc_status` (the protos themselves import neither)."""
    files = package_descriptor_set()
    present = {f.name for f in files.file}
    for module in _ERROR_MODULES:
        file: descriptor.FileDescriptor = module.DESCRIPTOR
        if file.name not in present:
            file.CopyToProto(files.file.add())
            present.add(file.name)
    return files.SerializeToString(deterministic=True)


OPENAPI_ROUTE = "/api/v1/openapi.json"
"""Where the public gateway serves the REST API's OpenAPI document (no token needed)."""


def openapi_path(descriptor_set: Path) -> Path:
    """Where the OpenAPI document lies for a deployment whose descriptor set is `descriptor_set`."""
    return descriptor_set.with_name("openapi.json")


def write_descriptor_set(path: Path) -> Path:
    """Write `gateway_descriptor_set()` to `path` (the deployment's `descriptor_set`), and beside it the
    package's OpenAPI document (`openapi_path`) and the Lua filter that refuses unknown REST body keys
    (`rest_body_keys.lua_path`), each if it differs."""
    openapi = importlib.resources.files("corral").joinpath("openapi.json").read_bytes()
    lua = lua_source(package_descriptor_set()).encode()
    for target, data in ((path, gateway_descriptor_set()), (openapi_path(path), openapi), (lua_path(path), lua)):
        if not target.exists() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    return path
