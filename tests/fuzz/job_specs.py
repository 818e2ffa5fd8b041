"""Submissions generated from the protobuf descriptors, valid and not.

`submissions()` starts from a valid SubmitBatchRequest (a few jobs, some
depending on others, some in job groups nested in each other) and applies
zero to four perturbations. A perturbation walks the request's descriptor:
it picks any field of the message it is in (so a field added to the protos
is reached without a change here), and either descends into it (a nested
message, an element of a list of messages) or gives it a value drawn for
its type:
- strings: empty, blank, plausible, at their limit (services/frontend/
  field_limits.py) and one past it, long, with NUL bytes, right-to-left
  overrides, combining marks, astral characters, trailing spaces;
- integers: 0, ±1, the type's extremes, the limit's bounds and one past;
- doubles: 0, negatives, NaN, ±inf, the largest and smallest;
- enums: every defined value and unknown numbers (proto3 keeps them);
- lists and maps: emptied, an element more, duplicated up to one past
  their limit, odd keys;
- messages: cleared, or set empty.
`SubmitBatch` must answer OK or refuse with one of `ALLOWED_REFUSALS`, and
a refused submission must write nothing (tests/service/test_job_spec_fuzz.py).
"""

from __future__ import annotations

import math
import uuid
from typing import Any

from google.protobuf import descriptor, message
from hypothesis import strategies as st

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_group_pb2, job_spec_pb2
from services.common.fields import Integer, Map, Repeated, Text
from services.frontend.field_limits import request_field_limits
from services.frontend.limits import Limits

F = descriptor.FieldDescriptor
LIMITS = request_field_limits(Limits())
INT_RANGES = {F.TYPE_INT32: (-(2**31), 2**31 - 1), F.TYPE_SINT32: (-(2**31), 2**31 - 1),
              F.TYPE_SFIXED32: (-(2**31), 2**31 - 1), F.TYPE_UINT32: (0, 2**32 - 1), F.TYPE_FIXED32: (0, 2**32 - 1),
              F.TYPE_INT64: (-(2**63), 2**63 - 1), F.TYPE_SINT64: (-(2**63), 2**63 - 1),
              F.TYPE_SFIXED64: (-(2**63), 2**63 - 1), F.TYPE_UINT64: (0, 2**64 - 1), F.TYPE_FIXED64: (0, 2**64 - 1)}
MOST_ITEMS = 1_200
"""Lists are grown to one past their limit, but no longer than this (a request stays small)."""
ODD_TEXT = ("", " ", "  x  ", "\x00", "a\x00b", "\u202egnp.exe", "e\u0301", "\U0001f600", "\ufeff", "x ", "\t\n",
            "../../etc/passwd", "file:///etc/shadow", "%s%n", "'; DROP TABLE jobs; --", "İ", "\uffff", "\U0010ffff")
PLAUSIBLE = ("busybox", "local", "proj", "true", "name", "x", "/in", "/out", "level", "n2-standard-8",
             "http://8.8.8.8/done", "file:///tmp/in")


def _text_limit(field: F) -> tuple[int | None, bool]:
    """(the most a string field may hold, whether counted in bytes), from the limits table."""
    limit = LIMITS.get(field.full_name)
    if isinstance(limit, Repeated):
        limit = limit.each
    if isinstance(limit, Text):
        if limit.max_chars is not None:
            return limit.max_chars, False
        return limit.max_bytes, True
    return None, False


def _sized(n: int, in_bytes: bool) -> str:
    return ("é" * (n // 2) + "x" * (n % 2)) if in_bytes else "é" * n


def strings(field: F) -> st.SearchStrategy[str]:
    most, in_bytes = _text_limit(field)
    options = [st.sampled_from(ODD_TEXT), st.sampled_from(PLAUSIBLE),
               st.text(st.characters(codec="utf-8"), max_size=40),
               st.integers(min_value=1, max_value=5_000).map(lambda n: "x" * n)]
    if most is not None:
        options.append(st.sampled_from([_sized(most, in_bytes), _sized(most + 1, in_bytes)]))
    return st.one_of(options)


def integers(field: F) -> st.SearchStrategy[int]:
    least, most = INT_RANGES[field.type]
    edges = {0, 1, -1, least, most, least + 1, most - 1, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1}
    limit = LIMITS.get(field.full_name)
    if isinstance(limit, Repeated):
        limit = limit.each
    if isinstance(limit, Integer):
        edges |= {limit.min, limit.max, limit.min - 1, limit.max + 1}
    return st.one_of(st.sampled_from(sorted(e for e in edges if least <= e <= most)),
                     st.integers(min_value=max(least, -1_000), max_value=min(most, 1_000)),
                     st.integers(min_value=least, max_value=most))


doubles = st.one_of(st.sampled_from([0.0, -0.0, -1.0, 0.5, 1.0, 1.5, 2.0, math.nan, math.inf, -math.inf, 1e308,
                                     5e-324]), st.floats())


def enums(field: F) -> st.SearchStrategy[int]:
    defined = [v.number for v in field.enum_type.values]
    return st.one_of(st.sampled_from(defined), st.sampled_from([-1, max(defined) + 1, 99, 2**31 - 1, -(2**31)]))


def scalars(field: F) -> st.SearchStrategy[Any]:
    """A value of a scalar field's type (an element's, for a list)."""
    if field.type == F.TYPE_STRING:
        return strings(field)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == F.TYPE_BOOL:
        return st.booleans()
    if field.type in (F.TYPE_DOUBLE, F.TYPE_FLOAT):
        return doubles
    if field.type == F.TYPE_ENUM:
        return enums(field)
    return integers(field)


def _items_limit(field: F) -> int:
    limit = LIMITS.get(field.full_name)
    if isinstance(limit, (Repeated, Map)):
        return limit.max_items
    return 3


def _is_map(field: F) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@st.composite
def perturb(draw: st.DrawFn, holder: message.Message, depth: int = 0) -> str:
    """Change one field somewhere in `holder` (in place); returns the path it changed."""
    field = draw(st.sampled_from(list(holder.DESCRIPTOR.fields)))
    name = field.name
    if _is_map(field):
        entries = getattr(holder, name)
        key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
        how = draw(st.sampled_from(["clear", "add", "many"]))
        if how == "clear":
            holder.ClearField(name)
        elif value_field.message_type is None:
            count = 1 if how == "add" else min(_items_limit(field) + draw(st.integers(0, 1)), MOST_ITEMS)
            key, value = draw(scalars(key_field)), draw(scalars(value_field))
            for i in range(count):
                entries[key if count == 1 else f"{key}{i}"] = value
        return f"{name}{{{how}}}"
    if field.is_repeated:
        items = getattr(holder, name)
        if field.message_type is not None and len(items) and depth < 4 and draw(st.booleans()):
            i = draw(st.integers(min_value=0, max_value=len(items) - 1))
            return f"{name}[{i}]." + draw(perturb(items[i], depth + 1))
        how = draw(st.sampled_from(["clear", "add", "many"]))
        if how == "clear":
            holder.ClearField(name)
        elif field.message_type is not None:
            element = items[draw(st.integers(0, len(items) - 1))] if len(items) else None
            count = 1 if how == "add" else min(_items_limit(field) + draw(st.integers(0, 1)), MOST_ITEMS)
            for _ in range(count):
                added = items.add()
                if element is not None and draw(st.booleans()):
                    added.CopyFrom(element)
        else:
            value = draw(scalars(field))
            count = 1 if how == "add" else min(_items_limit(field) + draw(st.integers(0, 1)), MOST_ITEMS)
            items.extend([value] * count)
        return f"{name}[{how}]"
    if field.message_type is not None:
        child = getattr(holder, name)
        if depth < 4 and field.message_type.fields and draw(st.booleans()):
            return f"{name}." + draw(perturb(child, depth + 1))
        if draw(st.booleans()):
            holder.ClearField(name)
            return f"{name}=unset"
        child.SetInParent()
        return f"{name}=empty"
    value = draw(scalars(field))
    setattr(holder, name, value)
    return f"{name}={value!r:.40}"


def valid_job(i: int, n_groups: int, draw: st.DrawFn) -> job_spec_pb2.JobSpec:
    """Job `i` of a new batch: valid, depending on earlier jobs, maybe in one of the groups."""
    job = job_spec_pb2.JobSpec(image="busybox", argv=job_spec_pb2.Argv(args=["true"]),
                               attributes={"name": f"job-{i}"})
    if i:
        for offset in sorted(set(draw(st.lists(st.integers(min_value=1, max_value=i), max_size=2)))):
            job.parents.append(job_spec_pb2.ParentRef(in_update_offset=-offset))
    if n_groups and draw(st.booleans()):
        job.job_group.in_update_index = draw(st.integers(min_value=0, max_value=n_groups - 1))
    return job


@st.composite
def valid_submissions(draw: st.DrawFn) -> bpb.SubmitBatchRequest:
    """A SubmitBatchRequest that is accepted as it is."""
    n_groups = draw(st.integers(min_value=0, max_value=3))
    groups = []
    for g in range(n_groups):
        group = job_group_pb2.JobGroupSpec(attributes={"group": str(g)})
        if g and draw(st.booleans()):
            group.parent.in_update_index = draw(st.integers(min_value=0, max_value=g - 1))
        groups.append(group)
    jobs = [valid_job(i, n_groups, draw) for i in range(draw(st.integers(min_value=1, max_value=4)))]
    return bpb.SubmitBatchRequest(idempotency_token=uuid.uuid4().hex,
                                  billing_project="proj", attributes={"name": "fuzz"}, job_groups=groups, jobs=jobs)


@st.composite
def submissions(draw: st.DrawFn) -> tuple[bpb.SubmitBatchRequest, tuple[str, ...]]:
    """A submission and the perturbations applied to it (none: a valid one)."""
    request = draw(valid_submissions())
    changed = []
    for _ in range(draw(st.integers(min_value=0, max_value=4))):
        # Most perturbations inside a job, where most fields are; some in a group or the request.
        where = draw(st.sampled_from(["jobs", "jobs", "jobs", "job_groups", "request"]))
        items = getattr(request, where) if where != "request" else []
        if len(items):
            i = draw(st.integers(min_value=0, max_value=len(items) - 1))
            changed.append(f"{where}[{i}]." + draw(perturb(items[i])))
        else:
            changed.append(draw(perturb(request)))
    return request, tuple(changed)
