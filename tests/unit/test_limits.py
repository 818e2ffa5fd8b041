"""services/frontend/limits.py: every limit documented, settable by a flag,
and listed in docs/security.md."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from services.frontend import query
from services.frontend.limits import Limits, field_docs

SECURITY_MD = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_every_limit_has_a_docstring() -> None:
    docs = field_docs()
    assert set(docs) == {f.name for f in dataclasses.fields(Limits)}
    assert all(len(doc) > 10 for doc in docs.values())


def test_flags_set_every_limit() -> None:
    parser = argparse.ArgumentParser()
    Limits.add_flags(parser)
    assert Limits.from_args(parser.parse_args([])) == Limits()
    changed = Limits.from_args(parser.parse_args(["--max-query-bytes", "100", "--max-statement-time-s", "0.5"]))
    assert changed == dataclasses.replace(Limits(), max_query_bytes=100, max_statement_time_s=0.5)


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_query_terms"):
        Limits(max_query_terms=0)


def test_the_query_languages_defaults_are_the_settings_defaults() -> None:
    assert (Limits().max_query_bytes, Limits().max_query_terms) == (query.MAX_BYTES, query.MAX_TERMS)


def test_docs_security_lists_every_limit_with_its_flag_and_default() -> None:
    text = SECURITY_MD.read_text()
    table = text[text.index("## Limits"):]
    for field in dataclasses.fields(Limits):
        row = next((line for line in table.splitlines() if f"`{Limits.flag(field.name)}`" in line), None)
        assert row is not None, f"docs/security.md has no row for {Limits.flag(field.name)}"
        default = field.default
        shown = f"{default:,}" if isinstance(default, int) else f"{default:g}"
        assert shown in row, f"{field.name}: the row does not show the default {shown}"
