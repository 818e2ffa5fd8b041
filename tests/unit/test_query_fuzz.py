"""The query language fuzzed in process: grammatical queries, their mutants
and garbage (tests/fuzz/query_inputs.py) through the parser and the SQL
compiler. A few hundred inputs here; `python -m bench fuzz-query` runs a
million (docs/security.md, Fuzzing). Over gRPC and MariaDB:
tests/service/test_query_fuzz.py."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.frontend.query import KeywordTerm, QuerySyntaxError, format_query, parse
from tests.fuzz.query_inputs import GRAMMATICAL, KINDS, check_query, kinds_and_texts, mutants


@settings(max_examples=300, deadline=None)
@given(kinds_and_texts)
def test_any_generated_query_parses_and_compiles_or_is_refused_with_a_position(kind_and_text: tuple) -> None:
    kind, text = kind_and_text
    check_query(text, kind)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(KINDS).flatmap(lambda kind: st.tuples(st.just(kind), GRAMMATICAL[kind])),
       st.integers(min_value=0, max_value=2**32))
def test_mutants_of_a_grammatical_query_too(kind_and_text: tuple, seed: int) -> None:
    kind, text = kind_and_text
    for mutant in mutants(text, seed, 20):
        check_query(mutant, kind)


def test_the_generators_reach_both_outcomes_and_mutants_are_reproducible() -> None:
    """Not vacuous: some inputs parse, some are refused; a seed gives the same mutants again."""
    outcomes = {check_query(text, kind).query is not None
                for kind in KINDS for text in mutants('state=running name="a b" cost>1.5', 7, 200)}
    assert outcomes == {True, False}
    assert list(mutants("cost>1.5 x", 3, 50)) == list(mutants("cost>1.5 x", 3, 50))
    assert len(set(mutants("cost>1.5 x", 3, 50))) > 25


# ---------------------------------------------------------------- what the fuzzer found
# Each of these once escaped the parser as a Python error (an INTERNAL over gRPC)
# or compiled to a parameter no SQL literal spells.


@pytest.mark.parametrize(("text", "message"), [
    ("duration>" + "9" * 400, "is too long"),  # float inf: round() raised OverflowError
    ("duration>" + "9" * 300 + "ms", "is too long"),
    ("cost>1e999", "out of range"),  # float inf reached MariaDB as the word inf
    ("cost<-1e999", "out of range"),
    ("cost>$" + "9" * 400 + ".5", "out of range"),
    ("start_time>0001-01-01T00:00+23:59", "not a valid time"),  # before year 1 in UTC
    ("end_time<9999-12-31T23:59:59-23:59", "not a valid time"),  # after year 9999 in UTC
])
def test_values_out_of_range_are_refused_at_their_position(text: str, message: str) -> None:
    for kind in KINDS:
        with pytest.raises(QuerySyntaxError, match=message) as error:
            parse(text, kind)
        assert error.value.position == re.match(r"[a-z_]+[<>=!]+", text).end()  # the value's first character


def test_times_of_the_first_centuries_format_back_to_themselves() -> None:
    """%Y wrote year 33 as '33', which does not parse: the formatter pads it."""
    query = parse("start_time>=0033-01-01 end_time<0999-12-31T23:00:00-00:30", "jobs")
    assert format_query(query) == "start_time>=0033-01-01T00:00:00Z end_time<0999-12-31T23:30:00Z"
    assert parse(format_query(query), "jobs") == query


def test_the_largest_finite_values_still_parse() -> None:
    assert parse("cost<1e308 duration<100000000d batch_id>9223372036854775807", "batches").terms == (
        KeywordTerm("cost", "<", 1e308), KeywordTerm("duration", "<", 100_000_000 * 86_400_000),
        KeywordTerm("batch_id", ">", 2**63 - 1))
