"""Write corral/batch-file.schema.json: the JSON Schema of batch files, from the protos.

The schema walks the descriptors of SubmitBatchRequest, JobSpec and
JobGroupSpec (the generated corral.batch.v1 modules) and adds the file's own
keys and the job shorthands from corral.batch_file and corral.batch_file_fields,
the tables the parser follows too; each key's description is its field's
comment in protos/ (compiled here with protoc --include_source_info). Editors
use the schema to check batch files as people type (docs/batch-file.md,
*Editors*). Run it after changing a proto; tests/unit/test_batch_schema.py
fails while the checked-in schema differs from what this writes.

    .venv/bin/python scripts/gen_batch_schema.py           # rewrite the schema
    .venv/bin/python scripts/gen_batch_schema.py --check   # exit 1 if it is stale
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from google.protobuf import descriptor, descriptor_pb2

from corral import batch_file
from corral.batch_file_fields import (
    DURATION,
    DURATION_DESCRIPTION,
    DURATION_PATTERN,
    FLOAT_TYPES,
    INT_RANGES,
    MAX_DOUBLE,
    SHORTHANDS,
    TEXT_SCHEMA,
    enum_names,
    exclusive_fields,
)

REPO = Path(__file__).resolve().parents[1]
PROTO_ROOT = REPO / "protos"
SCHEMA = REPO / "corral" / "batch-file.schema.json"
F = descriptor.FieldDescriptor
PACKAGE = "corral.batch.v1."

# Field numbers of descriptor.proto, for SourceCodeInfo paths.
FILE_MESSAGE_TYPE, FILE_ENUM_TYPE, MESSAGE_FIELD, MESSAGE_NESTED_TYPE, ENUM_VALUE = 4, 5, 2, 3, 2


def proto_comments() -> dict[str, str]:
    """Each corral message's, field's and enum value's leading comment, by full name."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "descriptors.binpb"
        protos = sorted(p.relative_to(PROTO_ROOT).as_posix() for p in (PROTO_ROOT / "corral").rglob("*.proto"))
        subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", str(PROTO_ROOT),
                        f"--descriptor_set_out={out}", "--include_source_info", *protos],
                       cwd=PROTO_ROOT, check=True)
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    comments: dict[str, str] = {}
    for file in files:
        by_path = {tuple(loc.path): " ".join(loc.leading_comments.split()) for loc in file.source_code_info.location}

        def walk(message: descriptor_pb2.DescriptorProto, prefix: str, path: tuple[int, ...]) -> None:
            name = f"{prefix}.{message.name}"
            comments[name] = by_path.get(path, "")
            for i, field in enumerate(message.field):
                comments[f"{name}.{field.name}"] = by_path.get((*path, MESSAGE_FIELD, i), "")
            for i, nested in enumerate(message.nested_type):
                walk(nested, name, (*path, MESSAGE_NESTED_TYPE, i))

        for i, message in enumerate(file.message_type):
            walk(message, file.package, (FILE_MESSAGE_TYPE, i))
        for i, enum in enumerate(file.enum_type):
            for j, value in enumerate(enum.value):
                comments[f"{file.package}.{value.name}"] = by_path.get((FILE_ENUM_TYPE, i, ENUM_VALUE, j), "")
    return comments


class SchemaWriter:
    """Builds the schema; each message reached gets a `$defs` entry named after it."""

    def __init__(self, comments: dict[str, str]):
        self.comments = comments
        self.defs: dict[str, Any] = {}

    def field(self, field: F) -> dict[str, Any]:
        """The schema of a field's value, with its comment."""
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            schema = {"type": "object", "additionalProperties": self.value(field.message_type.fields_by_name["value"])}
        elif field.is_repeated:
            schema = {"type": "array", "items": self.value(field)}
        else:
            schema = self.value(field)
        description = batch_file.FILE_DESCRIPTIONS.get(field.full_name) or self.comments.get(field.full_name, "")
        if field.message_type is not None and field.message_type.full_name == DURATION:
            description += f" {DURATION_DESCRIPTION}"
        if field.enum_type is not None:
            package = field.enum_type.full_name.rsplit(".", 1)[0]
            description += " Values: " + ", ".join(
                f"{written} ({self.comments.get(f'{package}.{name}', '').rstrip('.')})"
                for written, name in enum_names(field.enum_type).items() if written.islower()) + "."
        return {"description": description, **schema}

    def value(self, field: F) -> dict[str, Any]:
        """The schema of one value of the field's type."""
        if field.message_type is not None:
            if field.message_type.full_name == DURATION:
                return {"type": "string", "pattern": DURATION_PATTERN}
            if not field.message_type.full_name.startswith(PACKAGE):
                raise NotImplementedError(f"{field.full_name}: no schema for {field.message_type.full_name} yet")
            return {"$ref": f"#/$defs/{self.message(field.message_type)}"}
        if field.enum_type is not None:
            return {"enum": list(enum_names(field.enum_type))}
        if field.type in INT_RANGES:
            least, most = INT_RANGES[field.type]
            return {"type": "integer", "minimum": least, "maximum": most}
        if field.type in FLOAT_TYPES:
            return {"type": "number", "minimum": -MAX_DOUBLE, "maximum": MAX_DOUBLE}
        if field.type == F.TYPE_BOOL:
            return {"type": "boolean"}
        return dict(TEXT_SCHEMA)

    def message(self, message: descriptor.Descriptor) -> str:
        name = message.full_name.removeprefix(PACKAGE)
        if name not in self.defs:
            self.defs[name] = {}  # reserved before the fields, for messages that contain themselves
            self.defs[name] = self.object(message, message.fields, {})
        return name

    def object(self, message: descriptor.Descriptor, fields: Any, own: dict[str, Any],
               required: tuple[str, ...] = ()) -> dict[str, Any]:
        """A mapping of `fields` (of `message`) and the file's `own` keys, nothing else; the members of a
        oneof exclude each other."""
        names = {f.name for f in fields} | set(own)
        schema: dict[str, Any] = {
            "type": "object",
            "description": self.comments.get(message.full_name, ""),
            "additionalProperties": False,
            "properties": {**{f.name: self.field(f) for f in fields}, **own},
        }
        if required:
            schema["required"] = list(required)
        pairs = [(a, b) for choices in exclusive_fields(message) for i, a in enumerate(choices)
                 for b in choices[i + 1:] if a in names and b in names]
        if pairs:
            schema["allOf"] = [{"not": {"required": [a, b]}} for a, b in pairs]
        return schema


def job_schema(writer: SchemaWriter, in_defaults: bool) -> dict[str, Any]:
    """A job (or the defaults): JobSpec's fields but those the file names by name, its shorthands, its keys."""
    spec = batch_file.JOB_SPEC
    fields = [f for f in spec.fields if f.name not in batch_file.REPLACED_JOB_FIELDS]
    own = {**{key: {"description": s.description, **s.schema} for key, s in SHORTHANDS.items()},
           **{key: {"description": k.description, **k.schema} for key, k in batch_file.JOB_KEYS.items()}}
    if in_defaults:
        own = {key: value for key, value in own.items() if key not in batch_file.NOT_IN_DEFAULTS}
    schema = writer.object(spec, fields, own)
    exclusions = schema.setdefault("allOf", [])
    for key, shorthand in SHORTHANDS.items():
        exclusions += [{"not": {"required": [key, field]}} for field in shorthand.replaces]
        if shorthand.into is not None:
            field, inner = shorthand.into
            exclusions.append({"not": {"required": [key, field], "properties": {field: {"required": [inner]}}}})
            oneof = spec.fields_by_name[field].containing_oneof
            exclusions += [{"not": {"required": [key, other.name]}} for other in oneof.fields if other.name != field]
    schema["description"] = (
        "Keys every job starts from (a job's own value wins; messages and maps merge)." if in_defaults
        else "A job: " + writer.comments.get(spec.full_name, ""))
    return schema


def batch_file_schema(comments: dict[str, str]) -> dict[str, Any]:
    """The whole schema."""
    writer = SchemaWriter(comments)
    submit = batch_file.SUBMIT
    batch_fields = [submit.fields_by_name[name] for name in batch_file.BATCH_FIELDS]
    top_keys = {key: {"description": k.description, **k.schema} for key, k in batch_file.TOP_KEYS.items()}
    root = writer.object(submit, batch_fields, top_keys, required=batch_file.REQUIRED)
    group_spec = batch_file.GROUP_SPEC
    writer.defs["job"] = job_schema(writer, in_defaults=False)
    writer.defs["defaults"] = job_schema(writer, in_defaults=True)
    writer.defs["job_group"] = writer.object(
        group_spec, [f for f in group_spec.fields if f.name not in batch_file.GROUP_KEYS],
        {key: {"description": k.description, **k.schema} for key, k in batch_file.GROUP_KEYS.items()},
        required=("name",))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "corral batch file",
        **root,
        "description": "A batch for `corral submit` (docs/batch-file.md). Generated from protos/ by "
                       "scripts/gen_batch_schema.py: do not edit.",
        "$defs": dict(sorted(writer.defs.items())),
    }


def render() -> str:
    return json.dumps(batch_file_schema(proto_comments()), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the checked-in schema is stale")
    parser.add_argument("--out", type=Path, default=SCHEMA, help=f"where to write (default {SCHEMA})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run scripts/gen_batch_schema.py", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
