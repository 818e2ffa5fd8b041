"""Regenerate corral's Python protobuf/gRPC code from protos/.

Run from anywhere: ``python scripts/gen_protos.py [--out DIR]``.

The proto package is the Python package is the folder
(``protos/corral/batch/v1/batch_service.proto`` -> ``corral.batch.v1`` ->
``corral/batch/v1/batch_service_pb2.py``), so protoc's imports are correct as
generated and nothing is rewritten afterwards. The output is a pure function
of the .proto files and the pinned grpcio-tools version: a test regenerates
into a temporary directory and compares bytes with the committed code.

Besides ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` (only for files that
declare a service) it writes:

- ``__init__.py`` for every generated package (``corral/<api>/`` and
  ``corral/<api>/v1/``) but never ``corral/__init__.py``, which is not
  generated;
- ``corral/descriptors.binpb``: a serialized FileDescriptorSet of every
  corral proto and its imports, for Envoy's REST/JSON transcoder;
- ``corral/openapi.json``: the REST API as OpenAPI (Swagger 2.0), made by
  ``protoc-gen-swagger`` (Debian's golang-grpc-gateway) from the
  ``google.api.http`` annotations of the public packages, merged into one
  document with the bearer token as its security scheme. That plugin
  predates proto3's ``optional``: it is given a copy of the protos without
  the keyword, which changes no field's JSON name or type.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
# Generated Python modules end with one of these.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
DESCRIPTOR_SET = Path("corral") / "descriptors.binpb"
OPENAPI = Path("corral") / "openapi.json"
PUBLIC_PACKAGES = ("auth", "batch", "billing")
"""corral/<api>/v1 folders whose services people call (the others are the services' own)."""
SWAGGER_PLUGIN = Path("/usr/bin/protoc-gen-swagger")


def proto_files() -> list[str]:
    """Corral's .proto files, relative to protos/, sorted (the vendored
    google/ files are imports, not generated: googleapis-common-protos
    provides their Python code)."""
    return sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "corral").rglob("*.proto"))


def package_dirs(files: list[str]) -> list[Path]:
    """Every package folder under corral/ that holds generated code, parents
    included, corral/ itself excluded."""
    dirs: set[Path] = set()
    for name in files:
        parent = Path(name).parent
        while parent != Path("corral"):
            dirs.add(parent)
            parent = parent.parent
    return sorted(dirs)


def remove_generated(out: Path, files: list[str]) -> None:
    """Delete previously generated modules, so that a removed or renamed
    .proto leaves nothing stale behind."""
    for directory in package_dirs(files):
        target = out / directory
        if not target.is_dir():
            continue
        for path in sorted(target.iterdir()):
            if path.is_file() and path.name.endswith(GENERATED_SUFFIXES):
                path.unlink()


def run_protoc(out: Path, files: list[str]) -> None:
    """Run grpc_tools' protoc on the files, writing Python code and the
    descriptor set under out."""
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        "-I",
        str(PROTO_ROOT),
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        "--include_imports",
        f"--descriptor_set_out={out / DESCRIPTOR_SET}",
        *files,
    ]
    result = subprocess.run(command, cwd=PROTO_ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"protoc failed ({result.returncode}):\n{result.stderr}")


def remove_empty_grpc_modules(out: Path) -> None:
    """protoc's gRPC plugin writes a *_pb2_grpc.py for every file, even one
    without a service; keep only those of files that declare a service."""
    descriptor_set = descriptor_pb2.FileDescriptorSet.FromString((out / DESCRIPTOR_SET).read_bytes())
    for file in descriptor_set.file:
        if file.name.startswith("corral/") and not file.service:
            grpc_module = out / (file.name.removesuffix(".proto") + "_pb2_grpc.py")
            grpc_module.unlink(missing_ok=True)


def write_init_files(out: Path, files: list[str]) -> None:
    """Write each generated package's __init__.py (never corral/'s)."""
    for directory in package_dirs(files):
        package = ".".join(directory.parts)
        (out / directory / "__init__.py").write_text(
            f'"""Generated protobuf and gRPC code of {package} (see protos/)."""\n'
        )


_STATUS_DEFINITIONS = {
    "googleRpcStatus": {
        "type": "object",
        "description": "An error: its gRPC code, a message in words, and typed details (BadRequest field "
                       "violations, ...).",
        "properties": {"code": {"type": "integer", "format": "int32"}, "message": {"type": "string"},
                       "details": {"type": "array", "items": {"$ref": "#/definitions/protobufAny"}}},
    },
    "protobufAny": {
        "type": "object",
        "description": "A detail of an error: its type URL in `@type`, its fields beside it.",
        "properties": {"@type": {"type": "string"}},
        "additionalProperties": {},
    },
}


def write_openapi(out: Path) -> None:
    """corral/openapi.json: one Swagger 2.0 document of every public package's REST routes."""
    if not SWAGGER_PLUGIN.exists():
        raise SystemExit(f"{SWAGGER_PLUGIN} is missing: install Debian's golang-grpc-gateway "
                         "(scripts/setup.sh --for test does)")
    merged: dict = {"paths": {}, "definitions": {}}
    with tempfile.TemporaryDirectory(prefix="corral-openapi-") as work:
        protos, swagger = Path(work) / "protos", Path(work) / "swagger"
        shutil.copytree(PROTO_ROOT, protos)
        for proto in protos.rglob("*.proto"):
            proto.write_text(re.sub(r"^(\s*)optional ", r"\1", proto.read_text(), flags=re.M))
        swagger.mkdir()
        for api in PUBLIC_PACKAGES:  # the plugin takes one package per run
            files = sorted(p.relative_to(protos).as_posix() for p in (protos / "corral" / api).rglob("*.proto"))
            command = [sys.executable, "-m", "grpc_tools.protoc", "-I", str(protos),
                       f"--plugin=protoc-gen-swagger={SWAGGER_PLUGIN}",
                       f"--swagger_out=json_names_for_fields=true:{swagger}", *files]
            result = subprocess.run(command, cwd=protos, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise SystemExit(f"protoc-gen-swagger failed ({result.returncode}):\n{result.stderr}")
        for document in sorted(swagger.rglob("*.swagger.json")):
            part = json.loads(document.read_text())
            for path, operations in part.get("paths", {}).items():
                merged["paths"].setdefault(path, {}).update(operations)
            for name, definition in part.get("definitions", {}).items():
                if merged["definitions"].setdefault(name, definition) != definition:
                    raise SystemExit(f"two public packages define {name} differently: rename one")
    # A failed call answers with its gRPC code as the HTTP status and the google.rpc.Status as the body
    # (the gateway's convert_grpc_status); the plugin documents only success.
    for operations in merged["paths"].values():
        for operation in operations.values():
            operation["responses"]["default"] = {
                "description": "The call failed: the HTTP status of its gRPC code, and the google.rpc.Status with "
                               "its details", "schema": {"$ref": "#/definitions/googleRpcStatus"}}
    merged["definitions"].update(_STATUS_DEFINITIONS)
    openapi = {
        "swagger": "2.0",
        "info": {"title": "corral", "version": "v1",
                 "description": "corral's REST API: the public gRPC services through the gateway's JSON transcoding "
                                "(generated from protos/ by scripts/gen_protos.py)."},
        "consumes": ["application/json"],
        "produces": ["application/json"],
        "securityDefinitions": {"bearer": {"type": "apiKey", "name": "Authorization", "in": "header",
                                           "description": "`Bearer TOKEN`, the token `corral login` keeps"}},
        "security": [{"bearer": []}],
        **merged,
    }
    (out / OPENAPI).write_text(json.dumps(openapi, indent=1, sort_keys=True) + "\n")


def generate(out: Path) -> None:
    """Regenerate every corral module, the descriptor set and the OpenAPI document under out."""
    files = proto_files()
    out = out.resolve()
    (out / "corral").mkdir(parents=True, exist_ok=True)
    remove_generated(out, files)
    run_protoc(out, files)
    remove_empty_grpc_modules(out)
    write_init_files(out, files)
    write_openapi(out)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO,
        help="directory to write corral/... into (default: the repository root)",
    )
    args = parser.parse_args(argv)
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
