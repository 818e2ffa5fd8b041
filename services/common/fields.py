"""Field limits of requests, checked before anything is written.

A table maps a proto field's full name (`corral.batch.v1.JobSpec.attributes`)
to its limit: a string's length, an integer's range, a list's or a map's
size. `violations(request, table)` walks a request, nested messages, lists
and maps included, and returns a FieldViolation per field over its limit,
with the field's path as servicers name it (`jobs[3].locks[0].level`), so a
refusal is INVALID_ARGUMENT naming the field and never a database DataError
or a value silently cut short by a VARCHAR.

A limit that a column fixes names the column (`column="batches.user"`);
the tests compare every such limit with the migrated schema's declared
size. A limit an operator sets names its setting. Pure: protobuf
descriptors and plain data, no I/O; the frontend and the auth service
each check their requests with their own table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from google.protobuf import descriptor, message

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
"""The range of a MariaDB INT column."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The range of a MariaDB BIGINT column."""
TEXT_BYTES = 65_535
"""A MariaDB TEXT column holds this many bytes."""
MAX_VIOLATIONS = 100
"""A request with more bad fields is refused naming the first ones only."""


@dataclasses.dataclass(frozen=True)
class FieldViolation:
    """One bad field of a request: its path (e.g. `jobs[3].image`) and why."""

    field: str
    description: str


@dataclasses.dataclass(frozen=True)
class Text:
    """A string: at most `max_chars` characters (a VARCHAR(n) holds n) and at most
    `max_bytes` UTF-8 bytes (a TEXT holds 65,535)."""

    max_chars: int | None = None
    max_bytes: int | None = None
    column: str | None = None
    """`table.column` the value is stored in or compared with; None: none."""
    setting: str | None = None
    """The operator setting that fixes the limit, if one does."""
    by_servicer: bool = False
    """The servicer checks this limit itself, among its own rules (so that a request's
    violations are reported at once); `violations` leaves it alone."""

    def check(self, value: str | bytes) -> str | None:
        """Why `value` is refused, or None (a bytes field counts a byte as a character)."""
        if self.max_chars is not None and len(value) > self.max_chars:
            return f"at most {self.max_chars} characters{_named(self.setting)}"
        if self.max_bytes is not None and len(value if isinstance(value, bytes) else value.encode()) > self.max_bytes:
            return f"at most {self.max_bytes} bytes of UTF-8{_named(self.setting)}"
        return None


@dataclasses.dataclass(frozen=True)
class Integer:
    """An integer between `min` and `max` inclusive (an INT column: INT32_MIN..INT32_MAX)."""

    min: int
    max: int
    column: str | None = None
    """`table.column` the value is stored in or compared with; None: none."""
    setting: str | None = None
    """The operator setting that fixes the limit, if one does."""
    by_servicer: bool = False
    """The servicer checks this limit itself, among its own rules (so that a request's
    violations are reported at once); `violations` leaves it alone."""

    def check(self, value: int) -> str | None:
        if not self.min <= value <= self.max:
            return f"must be between {self.min} and {self.max}{_named(self.setting)}"
        return None


@dataclasses.dataclass(frozen=True)
class Repeated:
    """A list of at most `max_items`; each element is checked with `each` (scalars) or
    walked (messages)."""

    max_items: int
    each: Text | Integer | Unchecked | None = None
    setting: str | None = None


@dataclasses.dataclass(frozen=True)
class Map:
    """A map of at most `max_items` entries with keys and values under their limits."""

    max_items: int
    key: Text | Unchecked
    value: Text | Unchecked
    setting: str | None = None
    pad_space_keys: bool = False
    """The keys are a primary key under a PAD SPACE collation (MariaDB's utf8mb4_bin),
    which ignores trailing spaces: two keys that differ only in them are refused, as
    the database would refuse the second as a duplicate."""


@dataclasses.dataclass(frozen=True)
class Unchecked:
    """A field deliberately left without a limit of its own, and why (e.g. it is only
    stored inside a job's spec, whose size is limited as a whole)."""

    reason: str


Limit = Text | Integer | Repeated | Map | Unchecked
FieldLimits = Mapping[str, Limit]
"""Limits by the field's full proto name."""

# Messages checked as one value: their fields are the contract's, not a user's.
_WHOLE_MESSAGES = frozenset({"google.protobuf.Duration", "google.protobuf.Timestamp"})


def _named(setting: str | None) -> str:
    return f" ({setting})" if setting else ""


def _items(limit: Repeated | Map, n: int) -> str | None:
    if n > limit.max_items:
        return f"at most {limit.max_items} entries{_named(limit.setting)}"
    return None


def _scalar(limit: Text | Integer | Unchecked | None, value: object) -> str | None:
    if isinstance(limit, (Text, Integer)) and limit.by_servicer:
        return None
    if isinstance(limit, Text) and isinstance(value, (str, bytes)):
        return limit.check(value)
    if isinstance(limit, Integer) and isinstance(value, int) and not isinstance(value, bool):
        return limit.check(value)
    return None


def _checks_something(message_type: descriptor.Descriptor, table: FieldLimits, memo: dict[str, bool]) -> bool:
    """Whether `table` limits anything in a message of this type, nested messages included: if not, a walk need
    not go into one (a job spec's command, say, is limited by the spec's size alone)."""
    name = message_type.full_name
    if name not in memo:
        memo[name] = True  # while it is being decided: a recursive type is walked
        memo[name] = any(
            isinstance(limit := table.get(field.full_name), (Repeated, Map))
            or (isinstance(limit, (Text, Integer)) and not limit.by_servicer)
            or (field.message_type is not None and field.message_type.full_name not in _WHOLE_MESSAGES
                and _checks_something(field.message_type, table, memo))
            for field in message_type.fields)
    return memo[name]


def _walk(request: message.Message, table: FieldLimits, prefix: str, memo: dict[str, bool]
          ) -> Iterator[FieldViolation]:
    for field, value in request.ListFields():
        limit = table.get(field.full_name)
        if isinstance(limit, Map):
            path = f"{prefix}{field.name}"
            if (why := _items(limit, len(value))) is not None:
                yield FieldViolation(path, why)
                continue
            if limit.pad_space_keys and len({k.rstrip(" ") for k in value}) < len(value):
                yield FieldViolation(path, "two keys differ only in trailing spaces, which the database ignores")
            for key in sorted(value):
                entry = value[key]
                if (why := _scalar(limit.key, key)) is not None:
                    yield FieldViolation(path, f"key {_excerpt(key)}: {why}")
                if not isinstance(entry, message.Message) and (why := _scalar(limit.value, entry)) is not None:
                    yield FieldViolation(path, f"value of {_excerpt(key)}: {why}")
        elif field.is_repeated:
            if isinstance(limit, Repeated) and (why := _items(limit, len(value))) is not None:
                yield FieldViolation(f"{prefix}{field.name}", why)
                continue
            if field.message_type is not None:
                if _checks_something(field.message_type, table, memo):
                    for i, element in enumerate(value):
                        yield from _walk(element, table, f"{prefix}{field.name}[{i}].", memo)
            elif isinstance(limit, Repeated) and limit.each is not None:
                for i, element in enumerate(value):
                    if (why := _scalar(limit.each, element)) is not None:
                        yield FieldViolation(f"{prefix}{field.name}[{i}]", why)
        elif field.message_type is not None:
            if field.message_type.full_name not in _WHOLE_MESSAGES and _checks_something(field.message_type, table,
                                                                                         memo):
                yield from _walk(value, table, f"{prefix}{field.name}.", memo)
        elif isinstance(limit, (Text, Integer)) and (why := _scalar(limit, value)) is not None:
            yield FieldViolation(f"{prefix}{field.name}", why)


def _excerpt(text: str, chars: int = 20) -> str:
    return repr(text if len(text) <= chars else text[:chars] + "…")


def violations(request: message.Message, table: FieldLimits, limit: int = MAX_VIOLATIONS) -> list[FieldViolation]:
    """Every field of `request` over its limit in `table` (the first `limit` of them)."""
    found = []
    for violation in _walk(request, table, "", {}):
        found.append(violation)
        if len(found) == limit:
            break
    return found


def leaf_fields(message_type: descriptor.Descriptor) -> Iterator[descriptor.FieldDescriptor]:
    """Every field a request of this type can carry, nested messages' fields included,
    each once: what a table of limits must cover."""
    seen: set[str] = set()

    def visit(d: descriptor.Descriptor) -> Iterator[descriptor.FieldDescriptor]:
        if d.full_name in seen:
            return
        seen.add(d.full_name)
        for field in d.fields:
            yield field
            if field.message_type is not None and field.message_type.full_name not in _WHOLE_MESSAGES:
                if field.message_type.GetOptions().map_entry:
                    continue  # its key and value are the map's Map limit
                yield from visit(field.message_type)

    yield from visit(message_type)
