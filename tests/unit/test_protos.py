"""Checks on the protobuf contracts (protos/) and their generated code.

The generated code is committed: regenerating must be a no-op. The rest
checks, through descriptors rather than text, what buf lint does not: REST
annotations on public services only, `_UNSPECIFIED` enum zero values, and a
comment on every element.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from corral.authz.v1 import authz_pb2

REPO = Path(__file__).resolve().parents[2]
PROTO_ROOT = REPO / "protos"
GEN_SCRIPT = REPO / "scripts" / "gen_protos.py"
BUF = REPO / ".tools" / "node_modules" / ".bin" / "buf"
PUBLIC_PACKAGES = {"corral.auth.v1", "corral.batch.v1", "corral.billing.v1"}
INTERNAL_PACKAGES = {"corral.driver.v1", "corral.worker.v1"}

# Field numbers of descriptor.proto, used to build SourceCodeInfo paths.
FILE_MESSAGE_TYPE = 4
FILE_ENUM_TYPE = 5
FILE_SERVICE = 6
MESSAGE_FIELD = 2
MESSAGE_NESTED_TYPE = 3
MESSAGE_ENUM_TYPE = 4
MESSAGE_ONEOF_DECL = 8
ENUM_VALUE = 2
SERVICE_METHOD = 2


def corral_protos() -> list[str]:
    """Corral's .proto files relative to protos/ (vendored google/ excluded)."""
    return sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "corral").rglob("*.proto"))


def generated_files(root: Path) -> set[str]:
    """Files under root that the generator owns: the API package folders
    corral/<api>/ and the descriptor set."""
    files: set[str] = set()
    for api in sorted(p.name for p in (PROTO_ROOT / "corral").iterdir() if p.is_dir()):
        for path in (root / "corral" / api).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                files.add(path.relative_to(root).as_posix())
    for name in ("descriptors.binpb", "openapi.json"):
        if (root / "corral" / name).exists():
            files.add(f"corral/{name}")
    return files


def protoc_descriptor_set(tmp_path: Path, *, source_info: bool) -> descriptor_pb2.FileDescriptorSet:
    """Compile corral's protos into a FileDescriptorSet (corral files only)."""
    out = tmp_path / "descriptors.binpb"
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTO_ROOT), f"--descriptor_set_out={out}"]
    if source_info:
        command.append("--include_source_info")
    result = subprocess.run(
        [*command, *corral_protos()], cwd=PROTO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


@pytest.fixture(scope="module")
def committed_descriptors() -> descriptor_pb2.FileDescriptorSet:
    """The committed descriptor set's corral files."""
    data = (REPO / "corral" / "descriptors.binpb").read_bytes()
    descriptor_set = descriptor_pb2.FileDescriptorSet.FromString(data)
    corral_files = [f for f in descriptor_set.file if f.package.startswith("corral.")]
    return descriptor_pb2.FileDescriptorSet(file=corral_files)


def test_regeneration_is_a_no_op(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(GEN_SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    fresh = generated_files(tmp_path)
    committed = generated_files(REPO)
    assert fresh, "the generator produced nothing"
    assert sorted(fresh - committed) == [], "generated files missing from the repository: run scripts/gen_protos.py"
    assert sorted(committed - fresh) == [], "stale generated files in the repository: run scripts/gen_protos.py"
    differing = sorted(name for name in fresh if (tmp_path / name).read_bytes() != (REPO / name).read_bytes())
    assert differing == [], "generated files out of date: run scripts/gen_protos.py"
    assert not (tmp_path / "corral" / "__init__.py").exists(), "the generator must not write corral/__init__.py"


def test_generated_modules_import_without_warnings() -> None:
    modules = sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts)
        for name in generated_files(REPO)
        if name.endswith(".py")
        for path in [REPO / name]
    )
    script = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script, *modules], cwd=REPO, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_every_package_is_public_or_internal(committed_descriptors: descriptor_pb2.FileDescriptorSet) -> None:
    packages = {f.package for f in committed_descriptors.file}
    # corral.authz.v1 only defines the allowed_callers method option.
    assert packages - PUBLIC_PACKAGES - INTERNAL_PACKAGES <= {"corral.common.v1", "corral.authz.v1"}
    with_services = {f.package for f in committed_descriptors.file if f.service}
    assert with_services == PUBLIC_PACKAGES | INTERNAL_PACKAGES


def test_public_rpcs_have_http_rules_and_internal_ones_none(
    committed_descriptors: descriptor_pb2.FileDescriptorSet,
) -> None:
    problems: list[str] = []
    for file in committed_descriptors.file:
        for service in file.service:
            for method in service.method:
                name = f"{file.package}.{service.name}.{method.name}"
                has_rule = method.options.HasExtension(annotations_pb2.http)
                # An RPC that names its allowed callers is internal wherever it is declared
                # (AuthService.VerifyToken): people never reach it, so it has no REST route.
                internal = bool(method.options.Extensions[authz_pb2.allowed_callers])
                if file.package in INTERNAL_PACKAGES or internal:
                    if has_rule:
                        problems.append(f"{name}: internal RPC with a google.api.http rule")
                    continue
                if not has_rule:
                    problems.append(f"{name}: public RPC without a google.api.http rule")
                    continue
                rule = method.options.Extensions[annotations_pb2.http]
                verb = rule.WhichOneof("pattern")
                if verb is None or not getattr(rule, verb).startswith("/api/v1/"):
                    problems.append(f"{name}: REST path must start with /api/v1/")
                if verb in ("post", "put", "patch") and rule.body != "*":
                    problems.append(f'{name}: {verb} rule must have body: "*"')
                if verb in ("get", "delete") and rule.body:
                    problems.append(f"{name}: {verb} rule must have no body")
    assert problems == []


def test_the_openapi_document_has_every_rest_route(committed_descriptors: descriptor_pb2.FileDescriptorSet) -> None:
    """Every public RPC's google.api.http rule is an operation of corral/openapi.json (named after the RPC,
    its failure documented as the google.rpc.Status), and the document has nothing else."""
    document = json.loads((REPO / "corral" / "openapi.json").read_text())
    assert document["swagger"] == "2.0"
    assert document["security"] == [{"bearer": []}]
    routes = set()
    for file in committed_descriptors.file:
        for service in file.service:
            for method in service.method:
                if method.options.HasExtension(annotations_pb2.http):
                    rule = method.options.Extensions[annotations_pb2.http]
                    verb = rule.WhichOneof("pattern")
                    routes.add((verb, getattr(rule, verb), method.name))
    documented = {(verb, path, operation["operationId"])
                  for path, operations in document["paths"].items() for verb, operation in operations.items()}
    assert len(routes) > 40
    assert documented == routes
    for operations in document["paths"].values():
        for operation in operations.values():
            assert operation["responses"]["default"]["schema"] == {"$ref": "#/definitions/googleRpcStatus"}
            assert "200" in operation["responses"]


def all_enums(file: descriptor_pb2.FileDescriptorProto) -> Iterator[descriptor_pb2.EnumDescriptorProto]:
    """Every enum of a file, nested ones included."""

    def in_message(message: descriptor_pb2.DescriptorProto) -> Iterator[descriptor_pb2.EnumDescriptorProto]:
        yield from message.enum_type
        for nested in message.nested_type:
            yield from in_message(nested)

    yield from file.enum_type
    for message in file.message_type:
        yield from in_message(message)


def test_enum_zero_values_are_unspecified(committed_descriptors: descriptor_pb2.FileDescriptorSet) -> None:
    problems = []
    for file in committed_descriptors.file:
        for enum in all_enums(file):
            zero = [value.name for value in enum.value if value.number == 0]
            if len(zero) != 1 or not zero[0].endswith("_UNSPECIFIED") or enum.value[0].number != 0:
                problems.append(f"{file.name}: {enum.name} must start with *_UNSPECIFIED = 0")
    assert problems == []


def commentable_elements(file: descriptor_pb2.FileDescriptorProto) -> Iterator[tuple[tuple[int, ...], str]]:
    """(source path, readable name) of every message, field, real oneof,
    enum, enum value, service and RPC of a file."""

    def enum_elements(enum: descriptor_pb2.EnumDescriptorProto, path: tuple[int, ...], name: str):
        yield path, name
        for i, value in enumerate(enum.value):
            yield (*path, ENUM_VALUE, i), f"{name}.{value.name}"

    def message_elements(message: descriptor_pb2.DescriptorProto, path: tuple[int, ...], name: str):
        if message.options.map_entry:  # synthesized for map fields, not written
            return
        yield path, name
        for i, field in enumerate(message.field):
            yield (*path, MESSAGE_FIELD, i), f"{name}.{field.name}"
        synthetic = {f.oneof_index for f in message.field if f.proto3_optional}
        for i, oneof in enumerate(message.oneof_decl):
            if i not in synthetic:
                yield (*path, MESSAGE_ONEOF_DECL, i), f"{name}.{oneof.name}"
        for i, nested in enumerate(message.nested_type):
            yield from message_elements(nested, (*path, MESSAGE_NESTED_TYPE, i), f"{name}.{nested.name}")
        for i, enum in enumerate(message.enum_type):
            yield from enum_elements(enum, (*path, MESSAGE_ENUM_TYPE, i), f"{name}.{enum.name}")

    for i, message in enumerate(file.message_type):
        yield from message_elements(message, (FILE_MESSAGE_TYPE, i), message.name)
    for i, enum in enumerate(file.enum_type):
        yield from enum_elements(enum, (FILE_ENUM_TYPE, i), enum.name)
    for i, service in enumerate(file.service):
        yield (FILE_SERVICE, i), service.name
        for j, method in enumerate(service.method):
            yield (FILE_SERVICE, i, SERVICE_METHOD, j), f"{service.name}.{method.name}"


def test_every_element_has_a_leading_comment(tmp_path: Path) -> None:
    descriptor_set = protoc_descriptor_set(tmp_path, source_info=True)
    missing = []
    for file in descriptor_set.file:
        comments = {
            tuple(location.path): location.leading_comments.strip() for location in file.source_code_info.location
        }
        missing += [f"{file.name}: {name}" for path, name in commentable_elements(file) if not comments.get(path)]
    assert missing == []


def test_buf_lint_passes() -> None:
    if not BUF.exists():
        pytest.fail(f"buf is not installed at {BUF.relative_to(REPO)}: run scripts/setup.sh --for test")
    result = subprocess.run([str(BUF), "lint"], cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
