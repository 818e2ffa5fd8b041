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
  corral proto and its imports, for Envoy's REST/JSON transcoder.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

REPO = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO / "protos"
# Generated Python modules end with one of these.
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
DESCRIPTOR_SET = Path("corral") / "descriptors.binpb"


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


def generate(out: Path) -> None:
    """Regenerate every corral module and the descriptor set under out."""
    files = proto_files()
    out = out.resolve()
    (out / "corral").mkdir(parents=True, exist_ok=True)
    remove_generated(out, files)
    run_protoc(out, files)
    remove_empty_grpc_modules(out)
    write_init_files(out, files)


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
