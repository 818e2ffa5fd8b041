"""The batch file JSON Schema (corral/batch-file.schema.json): regenerating it is a no-op, it ships with the
package, and it agrees with the parser on docs/batch-file.md: it accepts every example there and refuses
each documented mistake but those the docs mark as found by `corral submit` only.

docs/batch-file.md's convention: every ```yaml block is a whole batch file; one preceded by
`<!-- mistake: ERROR -->` must be refused with exactly ERROR (`<!-- mistake, submit only: ERROR -->`: the
schema cannot see it, and accepts the file)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from corral.batch.v1 import job_group_pb2, job_spec_pb2
from corral.batch_file import SCHEMA_PATH, BatchFileError, parse_batch_file
from tests.every_field import all_fields, every_field_yaml

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "batch-file.md"
GEN_SCRIPT = REPO / "scripts" / "gen_batch_schema.py"
BLOCK = re.compile(r"(?:<!-- mistake(?P<submit_only>, submit only)?: (?P<error>.*?) -->\n)?```yaml\n(?P<body>.*?)```",
                   re.DOTALL)


def doc_blocks(text: str) -> list[tuple[str, str | None, bool]]:
    """(file, the error it must give or None, found by submit only) for each yaml block of the docs."""
    return [(m["body"], m["error"], bool(m["submit_only"])) for m in BLOCK.finditer(text)]


def validator() -> jsonschema.protocols.Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_regeneration_is_a_no_op() -> None:
    result = subprocess.run([sys.executable, str(GEN_SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_a_stale_schema_is_found(tmp_path: Path) -> None:
    stale = tmp_path / "schema.json"
    stale.write_text(SCHEMA_PATH.read_text().replace('"minItems": 1', '"minItems": 2', 1))
    result = subprocess.run([sys.executable, str(GEN_SCRIPT), "--check", "--out", str(stale)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 1 and "stale" in result.stderr


def test_the_schema_ships_with_the_package() -> None:
    package_data = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert SCHEMA_PATH.name in package_data["*"]
    assert SCHEMA_PATH.parent.name == "corral" and SCHEMA_PATH.is_file()


def test_the_docs_have_examples_and_mistakes() -> None:
    blocks = doc_blocks(DOC.read_text())
    assert sum(error is None for _, error, _ in blocks) >= 4
    assert sum(error is not None and not only for _, error, only in blocks) >= 8
    assert sum(only for _, _, only in blocks) >= 4


@pytest.mark.parametrize("block", doc_blocks(DOC.read_text()), ids=lambda b: (b[1] or "example")[:60])
def test_parser_and_schema_agree_on_the_docs(block: tuple[str, str | None, bool]) -> None:
    text, error, submit_only = block
    schema_errors = list(validator().iter_errors(yaml.safe_load(text)))
    if error is None:
        parse_batch_file(text, "batch.yaml")
        assert schema_errors == []
        return
    with pytest.raises(BatchFileError) as refused:
        parse_batch_file(text, "batch.yaml")
    assert str(refused.value) == error
    if submit_only:
        assert schema_errors == [], "the docs say the schema cannot see this mistake"
    else:
        assert schema_errors, f"the schema accepts a documented mistake: {error}"


def test_the_schema_accepts_the_generated_every_field_file() -> None:
    assert list(validator().iter_errors(yaml.safe_load(every_field_yaml("file:///srv/storage/proj")))) == []


@pytest.mark.parametrize(("change", "path"), [
    ({"cpus": 2}, "cpus"), ({"cores": "lots"}, "cores"), ({"accept": ["done"]}, "accept"),
    ({"parents": [{"accept": ["failed"]}]}, "parents"), ({"argv": {"args": ["a"]}}, "command"),
    ({"machine_type": "n2"}, "machine_type"), ({"resources": {"cores_mcpu": 500}}, "resources"),
    ({"timeout": 90}, "timeout"), ({"timeout": "90s"}, "timeout_s"), ({"network_mode": "nonee"}, "network_mode"),
    ({"locks": [{"level": "d", "mode": "exclusiv"}]}, "locks"), ({"priority": 2**31}, "priority"),
    ({"env": {"N": [1]}}, "env"), ({"retry_policy": {"retry_delay": "soon"}}, "retry_policy"),
])
def test_the_schema_refuses_what_the_parser_refuses(change: dict[str, object], path: str) -> None:
    job = {"image": "busybox", "command": ["true"], "cores": 1, "timeout_s": 5, **change}
    document = {"billing_project": "p", "jobs": [job]}
    assert list(validator().iter_errors(document)), path
    with pytest.raises(BatchFileError):
        parse_batch_file(yaml.safe_dump(document))


def test_the_docs_name_every_field() -> None:
    """docs/batch-file.md documents every field a file may set (the absolute ids a new batch cannot have
    aside), and every key of the file's own."""
    text = DOC.read_text()
    names = {name.rsplit(".", 1)[1] for name in all_fields(job_spec_pb2.JobSpec.DESCRIPTOR)
             | all_fields(job_group_pb2.JobGroupSpec.DESCRIPTOR)}
    names -= {"job_id", "job_group_id", "in_update_offset", "in_update_index", "accepted_states"}
    schema = json.loads(SCHEMA_PATH.read_text())
    names |= set(schema["properties"]) | set(schema["$defs"]["job"]["properties"]) | \
        set(schema["$defs"]["job_group"]["properties"])
    assert sorted(n for n in names if f"`{n}`" not in text) == []
