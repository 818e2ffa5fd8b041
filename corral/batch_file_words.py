"""A refusal of a batch submitted from a batch file, said in the file's words.

The server names a bad field by the request's path and in the API's units:
`jobs[0].resources.cores_mcpu: must be between 0 and 64000`. The file said
`cores: 100` on line 5. `FileSource` keeps where the file wrote each job,
group and top-level key (the YAML nodes corral.batch_file read them from), and
`file_refusal` turns each violation into `FILE:LINE:COLUMN: jobs[0] (name:
small): cores: must be between 0 and 64`: the key as the file wrote it (a
shorthand such as `cores`, or the long `resources.cores_mcpu`), at its value,
its numbers in the shorthand's unit, and `(from defaults)` when the job took
the key from `defaults`. A field the file never wrote (a missing `image`) is
placed at its job. The server's paths stay in the error's field violations
(`corral --debug` prints them).
"""

from __future__ import annotations

import dataclasses
import re

import yaml

from corral.batch_file_fields import SHORTHANDS
from corral.errors import CorralError, FieldViolation
from corral.refusal_words import CORES, SIZE, Unit, in_unit, line

_UNITS = {"cores_mcpu": CORES, "memory_bytes": SIZE, "storage_bytes": SIZE}
"""A shorthand that sets one of these fields is written in the user's unit (`cores: 2`, `memory: 4Gi`)."""
_SEGMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")
_AT_START = re.compile(r"^((?:jobs|job_groups)\[\d+\][A-Za-z0-9_.\[\]]*): ")
"""A message that names its field itself (PERMISSION_DENIED has no field violations): `jobs[2].image: ...`."""


@dataclasses.dataclass(frozen=True)
class Written:
    """One mapping of the file (the batch, `defaults`, a job or a group): where it is, and its keys."""

    node: yaml.Node
    what: str
    """How the file's own errors name it: `jobs[0]`, `job_groups[1]`, `defaults`; '' for the top level."""
    name: str | None
    keys: dict[str, tuple[yaml.Node, yaml.Node]]
    """Each key the file gives it: (key node, value node)."""


@dataclasses.dataclass(frozen=True)
class FileSource:
    """Where a batch file wrote each part of the request it became."""

    filename: str
    top: Written
    defaults: Written | None
    groups: list[Written]
    jobs: list[Written]


@dataclasses.dataclass(frozen=True)
class _Found:
    """Where a field is in the file: its node, the key path as written, and the unit it is written in."""

    node: yaml.Node
    key: str
    unit: Unit | None = None
    from_defaults: bool = False


def _segments(path: str) -> list[str | int]:
    return [int(index) if index else name for name, index in _SEGMENT.findall(path)]


def _descend(node: yaml.Node, key: str, segments: list[str | int]) -> _Found:
    """As deep into `node` (the value of `key`) as the file follows `segments`."""
    for segment in segments:
        if isinstance(segment, int) and isinstance(node, yaml.SequenceNode) and segment < len(node.value):
            node, key = node.value[segment], f"{key}[{segment}]"
        elif isinstance(segment, str) and isinstance(node, yaml.MappingNode):
            value = next((v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == segment), None)
            if value is None:
                break
            node, key = value, f"{key}.{segment}"
        else:
            break
    return _Found(node, key)


def _in_mapping(written: Written, segments: list[str | int]) -> _Found | None:
    """Where `written` (a job, the defaults, a group, the top) gives the field at `segments`, if it does."""
    if not segments or not isinstance(segments[0], str):
        return None
    first = segments[0]
    for key, shorthand in SHORTHANDS.items():
        if key not in written.keys:
            continue
        into = shorthand.into
        if into is not None and segments[:2] == list(into):
            return _Found(written.keys[key][1], key, _UNITS.get(into[1]))
        if first in shorthand.replaces or (first == key and key == "command"):
            return _Found(written.keys[key][1], key)
    if first in written.keys:
        return _descend(written.keys[first][1], first, segments[1:])
    return None


def _place(source: FileSource, field: str, offsets: dict[str, int]) -> tuple[str, _Found | None]:
    """(how to name the part of the file, where in it) for the server's field path `field`."""
    segments = _segments(field)
    if len(segments) >= 2 and segments[0] in ("jobs", "job_groups") and isinstance(segments[1], int):
        kind = str(segments[0])
        entries = source.jobs if kind == "jobs" else source.groups
        index = segments[1] + offsets.get(kind, 0)
        if index < len(entries):
            entry = entries[index]
            what = entry.what + (f" (name: {entry.name})" if entry.name else "")
            found = _in_mapping(entry, segments[2:])
            if found is None and kind == "jobs" and source.defaults is not None:
                found = _in_mapping(source.defaults, segments[2:])
                if found is not None:
                    found = dataclasses.replace(found, from_defaults=True)
            if found is None:
                rest = field.split("]", 1)[1].lstrip(".")
                return what, _Found(entry.node, rest)
            return what, found
    found = _in_mapping(source.top, segments)
    return "", found if found is not None else _Found(source.top.node, field)


def _at(source: FileSource, node: yaml.Node) -> str:
    return f"{source.filename}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def said_in_file(source: FileSource, violation: FieldViolation, offsets: dict[str, int] | None = None
                 ) -> tuple[str, str]:
    """(FILE:LINE:COLUMN, `what (name: n): key: description`) for one violation of the request `source` became."""
    what, found = _place(source, violation.field, offsets or {})
    assert found is not None
    key = found.key + (" (from defaults)" if found.from_defaults else "")
    named = ": ".join(part for part in (what, key) if part)
    description = in_unit(violation.description, found.unit)
    return _at(source, found.node), f"{named}: {description}" if named else description


def file_refusal(source: FileSource, error: CorralError) -> str | None:
    """The refusal's line in the file's words: the first violation's place leads (`FILE:LINE:COLUMN: `), each
    violation named as the file wrote it; None when the refusal names no field (it is not the file's)."""
    offsets = getattr(error, "offsets", {}) or {}
    violations = list(error.field_violations)
    message = error.message
    if not violations and (start := _AT_START.match(message)):
        violations = [FieldViolation(start.group(1), message[start.end():])]
        message = "invalid request"
    said = [said_in_file(source, v, offsets) if v.field else ("", v.description) for v in violations]
    if not said:
        return None
    # Each violation at its own place, the first leading as a compiler's would: FILE:LINE:COLUMN: ...
    text = line(message, [FieldViolation("", f"{at}: {words}" if at and i else words)
                          for i, (at, words) in enumerate(said)])
    return f"{said[0][0]}: {text}" if said[0][0] else text
