"""Reading a batch file's values by the protos' descriptors, with the file's line and column.

A YAML mapping that stands for a protobuf message (a job is a JobSpec, a
group a JobGroupSpec, the batch a SubmitBatchRequest) is checked key by key
against the message's descriptor and turned into the dict that
`google.protobuf.json_format.ParseDict` takes: the proto's field names, enum
values by name, durations as "90s". Reading from `yaml.compose`'s nodes
rather than `yaml.safe_load`'s dicts keeps each value's position, so every
mistake is a `BatchFileError` at its own line and column. The shorthands a job
may use (`command`, `cores`, ...) are described here too, as data, so that the
JSON Schema (scripts/gen_batch_schema.py) and the parser follow one table.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import Any

import yaml
from google.protobuf import descriptor, duration_pb2
from yaml.constructor import SafeConstructor

from corral import quantities
from corral.errors import UsageError

F = descriptor.FieldDescriptor
INT_RANGES = {F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
              F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
              F.TYPE_INT64: (-(2**63), 2**63 - 1), F.TYPE_SINT64: (-(2**63), 2**63 - 1),
              F.TYPE_SFIXED64: (-(2**63), 2**63 - 1), F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1)}
FLOAT_TYPES = {F.TYPE_DOUBLE, F.TYPE_FLOAT}
DURATION = duration_pb2.Duration.DESCRIPTOR.full_name
DURATION_PATTERN = quantities.DURATION_PATTERN
"""A duration as people write it ("90s", "1.5s", "30m", "2h", "1h30m"): corral.quantities reads it; the range
(at most 99,999,999,999 s) is the parser's to check, not the schema's."""
DURATION_DESCRIPTION = ("In a batch file: a number with its unit, ms, s, m (minutes), h or d, or several in a row "
                        "(\"90s\", \"1.5s\", \"30m\", \"2h\", \"1h30m\").")
MAX_DOUBLE = sys.float_info.max
"""Bounds of a number: the schema's way of refusing infinity, as the parser does."""
MAX_CORES = quantities.MAX_MCPU // 1000
MIN_CORES = 0.001
MAX_SECONDS = quantities.MAX_DURATION_NS // 10**9
_MERGE_TAG = "tag:yaml.org,2002:merge"


class BatchFileError(UsageError):
    """A batch file that cannot be read as a batch: `location` is "FILE:LINE:COLUMN" (from 1)."""


def enum_names(enum: descriptor.EnumDescriptor) -> dict[str, str]:
    """Every way a value may be written, to its proto name: the proto name (NETWORK_MODE_NONE) or its
    lower-case short form (none). The zero value (`_UNSPECIFIED`, "not set") is left out: omit the key."""
    prefix = enum.values[0].name.removesuffix("UNSPECIFIED")
    names = {}
    for value in enum.values:
        if value.number != 0:
            names[value.name] = value.name
            names[value.name.removeprefix(prefix).lower()] = value.name
    return names


def message_fields(message: descriptor.Descriptor) -> dict[str, F]:
    return {f.name: f for f in message.fields}


def exclusive_fields(message: descriptor.Descriptor) -> list[tuple[str, ...]]:
    """The message's oneofs of two fields or more (proto3 `optional` makes one-field oneofs: not choices)."""
    return [tuple(f.name for f in oneof.fields) for oneof in message.oneofs if len(oneof.fields) > 1]


@dataclasses.dataclass(frozen=True)
class Shorthand:
    """A job key of the file that stands for a JobSpec field written the long way."""

    schema: dict[str, Any]
    """Its JSON Schema."""
    description: str
    read: Callable[[NodeReader, yaml.Node, str], Any]
    """Its value, checked as `schema` says (reader, node, what)."""
    convert: Callable[[Any], dict[str, Any]]
    """Its value to the JobSpec fields it sets, as ParseDict takes them."""
    replaces: tuple[str, ...] = ()
    """JobSpec fields (or other shorthands) it is an alternative to: a job gives one or the other."""
    into: tuple[str, str] | None = None
    """(message field, its field) it sets: a job may give the message too, without that field."""


def _command(r: NodeReader, node: yaml.Node, what: str) -> list[str] | str:
    if isinstance(node, yaml.SequenceNode):
        if not node.value:
            raise r.error(node, f"{what}: an empty list: give at least the program to run")
        return [r.string(item, f"{what}[{i}]") for i, item in enumerate(node.value)]
    if isinstance(node, yaml.ScalarNode) and r.scalar(node, what) is not None and node.value:
        return r.string(node, what)
    raise r.error(node, f"{what}: expected a list (the program and its arguments) or a string (a shell script), "
                        f"got {r.kind(node)}")


def _cores(r: NodeReader, node: yaml.Node, what: str) -> int:
    """Milli-cores, from cores (0.5, "2") or milli-cores ("250m")."""
    value = r.scalar(node, what)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise r.error(node, f"{what}: expected cores (0.5, 2) or milli-cores (250m), got {r.kind(node)}")
    return r.quantity(node, what, quantities.parse_mcpu, node.value if isinstance(value, str) else value)


def _bytes(r: NodeReader, node: yaml.Node, what: str) -> int:
    value = r.scalar(node, what)
    if isinstance(value, str) and re.fullmatch(quantities.BYTES_PATTERN, value):
        short = what.rsplit(".", 1)[-1].removesuffix("_bytes")
        raise r.error(node, f"{what}: expected a whole number of bytes, got {r.kind(node)} (with a unit, write "
                            f"{short}: {value})")
    return r.integer(node, what, 0, INT_RANGES[F.TYPE_INT64][1])


def _size(r: NodeReader, node: yaml.Node, what: str) -> int:
    """Bytes, from a whole number or a size with its unit ("4Gi", "512Mi", "10G")."""
    value = r.scalar(node, what)
    if isinstance(value, str):
        return r.quantity(node, what, quantities.parse_bytes, node.value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return r.integer(node, what, 0, INT_RANGES[F.TYPE_INT64][1])
    raise r.error(node, f"{what}: expected bytes or a size such as 4Gi or 512Mi, got {r.kind(node)}")


def _seconds(r: NodeReader, node: yaml.Node, what: str) -> float:
    seconds = r.number(node, what)
    if not 0 <= seconds <= MAX_SECONDS:
        raise r.error(node, f"{what}: must be between 0 and {MAX_SECONDS}")
    return seconds


def _timeout(seconds: float) -> dict[str, Any]:
    timeout = duration_pb2.Duration()
    timeout.FromNanoseconds(round(seconds * 1e9))
    return {"timeout": timeout.ToJsonString()}


_BYTES_SCHEMA = {"type": "integer", "minimum": 0, "maximum": INT_RANGES[F.TYPE_INT64][1]}
_SIZE_SCHEMA = {"anyOf": [_BYTES_SCHEMA, {"type": "string", "pattern": quantities.BYTES_PATTERN}]}
UNITS_DESCRIPTION = ("Sizes are bytes, or a number with a unit: Ki, Mi, Gi, Ti (powers of 1024) or k, M, G, T "
                     "(powers of 1000), as in Kubernetes; a fraction is rounded up to a whole byte.")
TEXT_SCHEMA: dict[str, Any] = {"type": ["string", "number", "boolean"]}
"""Where the protos want a string: a number or boolean is taken as written (NodeReader.string)."""
SHORTHANDS = {
    "command": Shorthand(
        {"oneOf": [{"type": "array", "items": TEXT_SCHEMA, "minItems": 1}, {**TEXT_SCHEMA, "minLength": 1}]},
        "What the job runs: a list is the program and its arguments (argv), a string a shell script (script).",
        _command, lambda v: {"argv": {"args": v}} if isinstance(v, list) else {"script": v},
        replaces=("argv", "script")),
    "cores": Shorthand(
        {"anyOf": [{"type": "number", "minimum": MIN_CORES, "maximum": MAX_CORES},
                   {"type": "string", "pattern": quantities.MCPU_PATTERN}]},
        "Cores reserved for the job: cores (0.5, 2, rounded to thousandths) or milli-cores (\"250m\"), at "
        "least 0.001 (resources.cores_mcpu = cores x 1000).",
        _cores, lambda v: {"resources": {"cores_mcpu": v}}, into=("resources", "cores_mcpu")),
    "memory": Shorthand(
        _SIZE_SCHEMA, "Memory reserved for the job: bytes, or a size such as 4Gi, 512Mi or 4G "
                      "(resources.memory_bytes). " + UNITS_DESCRIPTION,
        _size, lambda v: {"resources": {"memory_bytes": v}}, replaces=("memory_bytes",),
        into=("resources", "memory_bytes")),
    "memory_bytes": Shorthand(
        _BYTES_SCHEMA, "Memory reserved for the job, in bytes (resources.memory_bytes).",
        _bytes, lambda v: {"resources": {"memory_bytes": v}}, into=("resources", "memory_bytes")),
    "storage": Shorthand(
        _SIZE_SCHEMA, "Scratch storage reserved for the job: bytes, or a size such as 10Gi "
                      "(resources.storage_bytes). " + UNITS_DESCRIPTION,
        _size, lambda v: {"resources": {"storage_bytes": v}}, replaces=("storage_bytes",),
        into=("resources", "storage_bytes")),
    "storage_bytes": Shorthand(
        _BYTES_SCHEMA, "Scratch storage reserved for the job, in bytes (resources.storage_bytes).",
        _bytes, lambda v: {"resources": {"storage_bytes": v}}, into=("resources", "storage_bytes")),
    "timeout_s": Shorthand(
        {"type": "number", "minimum": 0, "maximum": MAX_SECONDS},
        "Wall-clock limit of one attempt, in seconds (timeout: \"<seconds>s\").",
        _seconds, _timeout, replaces=("timeout",)),
}
"""The job keys that stand for JobSpec fields written the long way (both ways are accepted)."""


Pairs = list[tuple[str, yaml.Node, yaml.Node]]
"""A mapping's entries in file order: (key, key node, value node)."""


class NodeReader:
    """Checks YAML nodes and turns them into values, raising BatchFileError where a node is wrong."""

    def __init__(self, filename: str):
        self.filename = filename
        self._constructor = SafeConstructor()

    def error(self, node: yaml.Node | yaml.Mark, message: str) -> BatchFileError:
        mark = node if isinstance(node, yaml.Mark) else node.start_mark
        return BatchFileError(message, f"{self.filename}:{mark.line + 1}:{mark.column + 1}")

    def entries(self, node: yaml.Node, what: str, allowed: Collection[str]) -> Pairs:
        """A mapping's entries; an unknown key is refused with the nearest allowed ones, a key given twice
        (in the mapping itself, not through a `<<` merge) as such."""
        if not isinstance(node, yaml.MappingNode):
            raise self.error(node, f"{what}: expected a mapping (key: value), got {self.kind(node)}")
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.key(key_node, what)
            if key in seen:
                raise self.error(key_node, f"{what}: key {key!r} is given twice (first at {self.at(seen[key])})")
            seen[key] = key_node
        self._constructor.flatten_mapping(node)  # `<<: *defaults` merges; the mapping's own keys win
        pairs: dict[str, tuple[str, yaml.Node, yaml.Node]] = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, what)
            if key not in allowed:
                raise self.error(key_node, f"{what}: unknown key {key!r}{suggestion(key, allowed)}")
            pairs.pop(key, None)
            pairs[key] = (key, key_node, value_node)
        return list(pairs.values())

    def key(self, node: yaml.Node, what: str) -> str:
        """A mapping's key, as written (`2024:` is the key "2024")."""
        if not isinstance(node, yaml.ScalarNode) or self.scalar(node, what) is None:
            raise self.error(node, f"{what}: a key must be a name, not {self.kind(node)}")
        return str(node.value)

    def at(self, node: yaml.Node) -> str:
        return f"{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def scalar(self, node: yaml.Node, what: str = "") -> Any:
        """A scalar node's value (None for a collection: callers check the node's kind)."""
        if not isinstance(node, yaml.ScalarNode):
            return None
        try:
            return self._constructor.construct_object(node)
        except yaml.constructor.ConstructorError as e:  # an unknown tag, such as !!python/name:...
            raise self.error(node, f"{what or 'value'}: cannot read this value: {e.problem}") from None

    def kind(self, node: yaml.Node) -> str:
        if isinstance(node, yaml.MappingNode):
            return "a mapping"
        if isinstance(node, yaml.SequenceNode):
            return "a list"
        value = self.scalar(node)
        return "nothing" if value is None else repr(value)

    def sequence(self, node: yaml.Node, what: str) -> list[yaml.Node]:
        if not isinstance(node, yaml.SequenceNode):
            raise self.error(node, f"{what}: expected a list, got {self.kind(node)}")
        return list(node.value)

    def string(self, node: yaml.Node, what: str) -> str:
        """A scalar as written: where the protos want a string, `sleep 10`'s 10, a version's 1.10 and a date
        are the text the file has, not the number YAML would read (which would make 1.10 into "1.1")."""
        if not isinstance(node, yaml.ScalarNode) or self.scalar(node, what) is None:
            raise self.error(node, f"{what}: expected a string, got {self.kind(node)}")
        return str(node.value)

    def integer(self, node: yaml.Node, what: str, least: int, most: int) -> int:
        value = self.scalar(node, what)
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # 2.0 is a whole number to JSON Schema (and to ParseDict) too
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(node, f"{what}: expected a whole number, got {self.kind(node)}")
        if not least <= value <= most:
            raise self.error(node, f"{what}: {value} is out of range ({least} to {most})")
        return value

    def number(self, node: yaml.Node, what: str) -> float:
        value = self.scalar(node, what)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.error(node, f"{what}: expected a number, got {self.kind(node)}")
        return value

    def quantity(self, node: yaml.Node, what: str, parse: Callable[[Any], int], value: Any) -> int:
        """`parse(value)` (corral.quantities), its refusal at the node."""
        try:
            return parse(value)
        except quantities.QuantityError as e:
            raise self.error(node, f"{what}: {e}") from None

    def duration(self, node: yaml.Node, what: str) -> str:
        """A duration with its unit ("90s", "30m", "2h", "1h30m") as protobuf's JSON writes it ("5400s"); a
        number alone is refused: seconds or minutes, the file does not say."""
        value = self.scalar(node, what)
        if not isinstance(value, str):
            raise self.error(node, f"{what}: expected a duration with its unit, such as \"90s\", \"30m\" or "
                                   f"\"2h\", got {self.kind(node)}")
        duration = duration_pb2.Duration()
        duration.FromNanoseconds(self.quantity(node, what, lambda v: quantities.parse_duration_ns(v, None),
                                               node.value))
        return duration.ToJsonString()

    def boolean(self, node: yaml.Node, what: str) -> bool:
        value = self.scalar(node, what)
        if not isinstance(value, bool):
            raise self.error(node, f"{what}: expected true or false, got {self.kind(node)}")
        return value

    def enum(self, node: yaml.Node, what: str, names: dict[str, str]) -> str:
        value = self.string(node, what)
        if value not in names:
            short = [n for n in names if n.islower()]
            raise self.error(node, f"{what}: unknown value {value!r} (expected one of {', '.join(short)})"
                                   f"{suggestion(value, names)}")
        return names[value]

    def message(self, pairs: Iterable[tuple[str, yaml.Node, yaml.Node]], message: descriptor.Descriptor,
                path: str = "") -> dict[str, Any]:
        """`pairs` (keys already known to be fields of `message`) as ParseDict's dict; two fields of one
        oneof are refused."""
        fields = message_fields(message)
        result: dict[str, Any] = {}
        chosen: dict[str, str] = {}  # oneof name -> the field given for it
        for key, key_node, value_node in pairs:
            field = fields[key]
            oneof = field.containing_oneof
            if oneof is not None and len(oneof.fields) > 1:
                if oneof.name in chosen:
                    raise self.error(key_node, f"{path}{key}: {chosen[oneof.name]} and {key} are alternatives "
                                               f"(one {oneof.name}): give one of them")
                chosen[oneof.name] = key
            result[key] = self.field(value_node, field, f"{path}{key}")
        return result

    def field(self, node: yaml.Node, field: F, what: str) -> Any:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]  # the keys: strings, in our protos
            return {key: self.value(v, value_field, f"{what}.{key}") for key, _, v in self.entries(node, what, ANY)}
        if field.is_repeated:
            return [self.value(item, field, f"{what}[{i}]") for i, item in enumerate(self.sequence(node, what))]
        return self.value(node, field, what)

    def value(self, node: yaml.Node, field: F, what: str) -> Any:
        """One value of `field`'s type (an element, for a repeated field)."""
        if field.message_type is not None:
            if field.message_type.full_name == DURATION:
                return self.duration(node, what)
            names = message_fields(field.message_type)
            return self.message(self.entries(node, what, names), field.message_type, f"{what}.")
        if field.enum_type is not None:
            return self.enum(node, what, enum_names(field.enum_type))
        if field.type in INT_RANGES:
            return self.integer(node, what, *INT_RANGES[field.type])
        if field.type in FLOAT_TYPES:
            return self.number(node, what)
        if field.type == F.TYPE_BOOL:
            return self.boolean(node, what)
        return self.string(node, what)


class _AnyKey(Collection[str]):
    """Every key is allowed (a map's keys are the user's)."""

    def __contains__(self, key: object) -> bool:
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


ANY = _AnyKey()


SYNONYMS = {"cpus": "cores", "cpu": "cores", "mem": "memory", "ram": "memory", "disk": "storage", "depends_on": "parents", "dependencies": "parents",
            "needs": "parents", "after": "parents", "group": "job_group", "cmd": "command", "args": "command",
            "run": "command", "timeout_seconds": "timeout_s", "retries": "max_attempts", "labels": "attributes",
            "environment": "env", "region": "regions", "project": "billing_project"}
"""Words other batch systems use, and the key that means the same here (when it is one of the choices)."""


def suggestion(word: str, choices: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the nearest choices, or nothing."""
    choices = list(choices)
    if SYNONYMS.get(word) in choices:
        return f"; did you mean {SYNONYMS[word]!r}?"
    close = difflib.get_close_matches(word, choices, n=2, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
