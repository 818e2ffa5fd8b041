"""The parser and the JSON Schema judge generated jobs alike: a job made of any keys the schema knows (and
a few it does not), each with a value of any type, is refused by the parser exactly when the schema refuses
it. Names and parents are left out: they refer across jobs, which the schema cannot see (docs/batch-file.md
says so)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from corral import quantities
from corral.batch_file import SCHEMA_PATH, BatchFileError, parse_batch_file

SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
JOB_KEYS = sorted(set(SCHEMA["$defs"]["job"]["properties"]) - {"name", "parents", "job_group"})
ODD_KEYS = ["cpus", "parent", "always_runn", "Image", "timeout_ms"]

scalars = st.one_of(
    st.sampled_from(["", "x", "busybox", "none", "NETWORK_MODE_NONE", "on_demand", "succeeded", "done", "90s",
                     "1.5s", "soon", "exclusive", "shared", "lots", "4Gi", "4GB", "250m", "2h", "2 h", "-2s", "1.5",
                     "90"]),
    st.integers(min_value=-(2**64), max_value=2**64), st.sampled_from([0, 1, -1, 2**31, 2**31 - 1, 2**63]),
    st.floats(allow_nan=False, width=32), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3),
    st.dictionaries(st.sampled_from(["args", "cores_mcpu", "memory_bytes", "level", "mode", "names", "from_url",
                                     "to_path", "max_failed_retries", "retry_delay", "k", "MODE"]), inner,
                    max_size=3)), max_leaves=6)


PATTERN_EXAMPLES = {
    quantities.DURATION_PATTERN: ["90s", "1.5s", "0s", "0.000000001s", "30m", "2h", "1h30m", "250ms", "1d", ".5s"],
    quantities.BYTES_PATTERN: ["4Gi", "512Mi", "4G", "1.5Gi", "0", "1000", "2Ti", "1k", ".5M"],
    quantities.MCPU_PATTERN: ["250m", "1m", "0.25", "2", "64000m", ".5"],
}


def valid(schema: dict[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values a schema fragment accepts (most of them: a duration's pattern, an object's exclusions aside)."""
    if "$ref" in schema:
        return valid(SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[1]], depth)
    for either in ("oneOf", "anyOf"):
        if either in schema:
            return st.one_of([valid(s, depth) for s in schema[either]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):  # text: a string, or a number or boolean taken as written
        return st.one_of([valid({**schema, "type": k}, depth) for k in kind])
    if kind == "string":
        if "pattern" in schema:  # the forms of corral.quantities, in range (which a pattern cannot see)
            return st.sampled_from(PATTERN_EXAMPLES[schema["pattern"]])
        return st.text(min_size=schema.get("minLength", 0), max_size=5)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "number":
        least = schema.get("minimum", schema.get("exclusiveMinimum"))
        return st.floats(min_value=least, max_value=1e6, exclude_min="exclusiveMinimum" in schema,
                         allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "array":
        return st.lists(valid(schema["items"], depth + 1), min_size=schema.get("minItems", 0), max_size=2)
    if kind == "object" and "properties" in schema:
        if depth > 2:
            return st.just({})
        return st.fixed_dictionaries({}, optional={k: valid(v, depth + 1) for k, v in schema["properties"].items()})
    if kind == "object":
        return st.dictionaries(st.sampled_from(["A", "B_1"]), valid(schema["additionalProperties"], depth + 1),
                               max_size=2)
    raise AssertionError(f"no strategy for {schema}")


JOB_PROPERTIES = SCHEMA["$defs"]["job"]["properties"]
entries = st.one_of(
    st.sampled_from(JOB_KEYS).flatmap(lambda key: st.tuples(st.just(key), valid(JOB_PROPERTIES[key]))),
    st.tuples(st.sampled_from(JOB_KEYS + ODD_KEYS), values))
jobs = st.lists(entries, max_size=5).map(dict)


def parser_accepts(document: dict[str, Any]) -> bool:
    try:
        parse_batch_file(yaml.safe_dump(document))
    except BatchFileError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(job=jobs, in_defaults=st.booleans())
def test_parser_and_schema_agree_on_generated_jobs(job: dict[str, Any], in_defaults: bool) -> None:
    document: dict[str, Any] = {"billing_project": "p", "job_groups": [{"name": "g"}]}
    document["defaults" if in_defaults else "jobs"] = job if in_defaults else [job]
    schema_accepts = VALIDATOR.is_valid(document)
    assert parser_accepts(document) == schema_accepts, list(VALIDATOR.iter_errors(document))
