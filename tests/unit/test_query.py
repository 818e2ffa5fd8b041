"""The query language of ListBatches and ListJobs: parsing, errors, the
formatter and the SQL it becomes (services/frontend/query.py). That the SQL
runs on MariaDB is checked in tests/db/test_query_sql.py."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

import services.frontend.query as query_module
from services.frontend.query import (
    KEYWORDS,
    MAX_BYTES,
    MAX_TERMS,
    AttributeTerm,
    KeywordTerm,
    Query,
    QuerySyntaxError,
    QueryTooLarge,
    WordTerm,
    format_query,
    parse,
    to_sql,
)

JAN_2_2026_MS = 1_767_312_000_000  # 2026-01-02T00:00:00Z


# ---------------------------------------------------------------- parsing


def test_empty_query_matches_everything() -> None:
    assert parse("", "batches") == Query("batches", ())
    assert parse("  \n\t ", "jobs") == Query("jobs", ())
    assert to_sql(parse("", "jobs")) == ("TRUE", [])


def test_attribute_terms() -> None:
    q = parse('name=align  sample!=7 tag=~"big run" env!~prod', "batches")
    assert q.terms == (
        AttributeTerm("name", "=", "align"),
        AttributeTerm("sample", "!=", "7"),
        AttributeTerm("tag", "=~", "big run"),
        AttributeTerm("env", "!~", "prod"),
    )


def test_bare_words_and_quoted_strings() -> None:
    q = parse(r'hello "a b" "say \"hi\"" "back\\slash" "x=y"', "jobs")
    assert q.terms == (WordTerm("hello"), WordTerm("a b"), WordTerm('say "hi"'), WordTerm("back\\slash"),
                       WordTerm("x=y"))


def test_spaces_around_operators_are_optional() -> None:
    assert parse("cost >= 1.5", "batches") == parse("cost>=1.5", "batches")
    assert parse("name = x", "jobs") == parse("name=x", "jobs")


def test_keywords_and_their_values() -> None:
    q = parse("state=Running user=alice billing_project!=proj batch_id>=10 job_id<5 exit_code!=0 "
              "cost>1.5 duration<=5m start_time>2026-01-02 end_time<2026-01-02T00:00:01Z "
              "instance=i-1 job_group=3", "jobs")
    assert q.terms == (
        KeywordTerm("state", "=", "running"),
        KeywordTerm("user", "=", "alice"),
        KeywordTerm("billing_project", "!=", "proj"),
        KeywordTerm("batch_id", ">=", 10),
        KeywordTerm("job_id", "<", 5),
        KeywordTerm("exit_code", "!=", 0),
        KeywordTerm("cost", ">", 1.5),
        KeywordTerm("duration", "<=", 300_000),
        KeywordTerm("start_time", ">", JAN_2_2026_MS),
        KeywordTerm("end_time", "<", JAN_2_2026_MS + 1_000),
        KeywordTerm("instance", "=", "i-1"),
        KeywordTerm("job_group", "=", 3),
    )


@pytest.mark.parametrize(("text", "ms"), [
    ("90", 90_000), ("30s", 30_000), ("5m", 300_000), ("2h", 7_200_000), ("1d", 86_400_000),
    ("250ms", 250), ("1.5h", 5_400_000), ("0", 0),
])
def test_durations(text: str, ms: int) -> None:
    assert parse(f"duration>{text}", "batches").terms == (KeywordTerm("duration", ">", ms),)


@pytest.mark.parametrize(("text", "ms"), [
    ("2026-01-02", JAN_2_2026_MS),
    ("2026-01-02T03:04:05", JAN_2_2026_MS + 11_045_000),
    ("2026-01-02T03:04:05Z", JAN_2_2026_MS + 11_045_000),
    ("2026-01-02T03:04:05.250Z", JAN_2_2026_MS + 11_045_250),
    ("2026-01-02T03:04", JAN_2_2026_MS + 11_040_000),
    ("2026-01-02T03:04:05+01:00", JAN_2_2026_MS + 11_045_000 - 3_600_000),
    ('"2026-01-02 03:04:05"', JAN_2_2026_MS + 11_045_000),
])
def test_times_are_utc_milliseconds(text: str, ms: int) -> None:
    assert parse(f"start_time>={text}", "batches").terms == (KeywordTerm("start_time", ">=", ms),)


def test_state_groups_and_aliases() -> None:
    assert parse("state=DONE", "jobs").terms == (KeywordTerm("state", "=", "done"),)
    assert parse("state=canceled", "batches").terms == (KeywordTerm("state", "=", "cancelled"),)
    assert parse("state!=success", "batches").terms == (KeywordTerm("state", "!=", "success"),)


def test_batches_and_jobs_take_each_others_word_for_failed() -> None:
    """Batch queries said `failure` where job queries say `failed` (issue 36): each takes both."""
    assert parse("state=failed", "batches").terms == (KeywordTerm("state", "=", "failure"),)
    assert parse("state=failure", "jobs").terms == (KeywordTerm("state", "=", "failed"),)
    assert parse("state=succeeded", "jobs").terms == (KeywordTerm("state", "=", "success"),)


@pytest.mark.parametrize(("text", "kind", "near"), [
    ("stat=running", "batches", "state"), ("states=running", "jobs", "state"), ("State=running", "jobs", "state"),
    ("status=running", "batches", "state"), ("users=alice", "batches", "user"), ("project=lab", "jobs",
                                                                                   "billing_project"),
    ("name=x dur>5", "jobs", "duration"),
])
def test_a_key_that_is_a_slip_of_a_keyword_is_refused_where_it_is(text: str, kind: str, near: str) -> None:
    """`corral ls stat=running` printed nothing: `stat` was an attribute no batch has (issue 36)."""
    with pytest.raises(QuerySyntaxError) as e:
        parse(text, kind)  # type: ignore[arg-type]
    key = text.split()[-1].split("=")[0].split(">")[0]
    assert e.value.position == text.index(key)
    assert e.value.message.startswith(f"unknown key {key!r}; did you mean {near}?")
    # Quoted, it is the attribute it says.
    if f"{key}=" in text:
        quoted = text.replace(key, f'"{key}"')
        assert any(isinstance(t, AttributeTerm) and t.key == key for t in parse(quoted, kind).terms)  # type: ignore


@pytest.mark.parametrize("key", ["name", "stage", "host", "sample", "username", "step"])
def test_an_attribute_merely_near_a_keyword_is_an_attribute(key: str) -> None:
    assert parse(f"{key}=x", "jobs").terms == (AttributeTerm(key, "=", "x"),)


def test_a_quoted_key_is_an_attribute_even_if_it_is_a_keyword() -> None:
    assert parse('"state"=odd', "batches").terms == (AttributeTerm("state", "=", "odd"),)


@pytest.mark.parametrize(("text", "kind", "position", "message"), [
    ("name=x bogus>3", "batches", 7, "unknown keyword 'bogus'"),
    ("state>running", "batches", 5, "state takes =, !="),
    ("state=sleeping", "jobs", 6, "unknown job state 'sleeping'"),
    ("state=sleeping", "batches", 6, "unknown batch state 'sleeping'"),
    ("batch_id=12x", "batches", 9, "expected an integer"),
    ("cost>cheap", "jobs", 5, "expected a cost"),
    ("cost > ", "batches", 6, "a value must follow >"),
    ("cost > <= 3", "batches", 7, "a value must follow >"),
    ("duration>5y", "batches", 9, "expected a duration"),
    ("start_time>2026-13-01", "jobs", 11, "not a valid time"),
    ("start_time>yesterday", "jobs", 11, "expected a time"),
    ('name="unterminated', "batches", 5, "unterminated quote"),
    ('name="ends in backslash\\"', "batches", 5, "unterminated quote"),
    ("job_id=3", "batches", 0, "job_id is not a keyword for batches"),
    ("exit_code=1", "batches", 0, "exit_code is not a keyword for batches"),
    ("instance=i1", "batches", 0, "instance is not a keyword for batches"),
    ("a=b=c", "jobs", 3, "needs a key or keyword"),
    ("= x", "jobs", 0, "needs a key or keyword"),
    ("name=", "jobs", 5, "a value must follow ="),
    ('ab"c"', "jobs", 2, "a quote inside a word"),
    ('"ab"c', "jobs", 4, "expected a space or an operator"),
    ('""', "jobs", 0, "empty search word"),
    ('""=x', "jobs", 0, "empty attribute key"),
    ("cost=~1", "batches", 4, "cost takes"),
])
def test_syntax_errors_carry_the_position(text: str, kind: str, position: int, message: str) -> None:
    with pytest.raises(QuerySyntaxError) as e:
        parse(text, kind)  # type: ignore[arg-type]
    assert e.value.position == position, e.value
    assert message in e.value.message
    assert isinstance(e.value, ValueError)


# ---------------------------------------------------------------- SQL


def test_attribute_sql_batches() -> None:
    sql, params = to_sql(parse("name=x tag!~y", "batches"))
    assert sql == (
        "(EXISTS (SELECT 1 FROM batch_attributes attr WHERE attr.batch_id = b.batch_id"
        " AND attr.`key` = %s AND attr.`value` = %s))"
        " AND (NOT EXISTS (SELECT 1 FROM batch_attributes attr WHERE attr.batch_id = b.batch_id"
        " AND attr.`key` = %s AND attr.`value` LIKE %s ESCAPE '|'))"
    )
    assert params == ["name", "x", "tag", "%y%"]


def test_like_patterns_escape_wildcards() -> None:
    _, params = to_sql(parse('"100%_|done"', "jobs"))
    assert params == ["%100|%|_||done%"] * 2


def test_jobs_sql_uses_j_and_the_latest_attempt() -> None:
    sql, params = to_sql(parse("name=x instance!=i1 start_time>2026-01-02", "jobs"))
    assert "job_attributes attr WHERE attr.batch_id = j.batch_id AND attr.job_id = j.job_id" in sql
    assert "NOT EXISTS (SELECT 1 FROM attempts la WHERE" in sql
    assert "la.attempt_id = j.attempt_id" in sql
    assert params == ["name", "x", "i1", JAN_2_2026_MS]


@pytest.mark.parametrize(("text", "kind", "fragment", "params"), [
    ("state=open", "batches", "(b.state = %s)", ["open"]),
    ("state!=running", "batches", "(NOT (b.state = %s))", ["running"]),
    ("state=cancelled", "batches", "job_groups_cancelled bgc", []),
    ("state=success", "batches", "SUM(bcs.n_succeeded)", ["complete"]),
    ("state=failure", "batches", "SUM(bcs.n_failed + bcs.n_errored)", []),
    ("state=done", "jobs", "(j.state IN (%s, %s, %s, %s))", ["Success", "Failed", "Error", "Cancelled"]),
    ("state!=live", "jobs", "(NOT (j.state IN (%s, %s, %s)))", ["Ready", "Creating", "Running"]),
    ("user=alice", "batches", "(b.user = %s)", ["alice"]),
    ("user!=alice", "jobs", "jb.user <> %s", ["alice"]),
    ("billing_project=p", "batches", "(b.billing_project = %s)", ["p"]),
    ("batch_id<=7", "jobs", "(j.batch_id <= %s)", [7]),
    ("exit_code>0", "jobs", "(j.exit_code > %s)", [0]),
    ("job_group!=2", "jobs", "NOT EXISTS (SELECT 1 FROM job_group_self_and_ancestors jg", [2]),
    ("cost>=0.25", "batches", "FROM batch_cost bc WHERE bc.batch_id = b.batch_id), 0) >= %s", [0.25]),
    ("cost<1", "jobs", "aggregated_job_resources ajr", [1.0]),
    ("duration>1h", "batches", "b.time_completed_ms", [3_600_000]),
    ("end_time!=2026-01-02", "batches", "(b.time_completed_ms <> %s)", [JAN_2_2026_MS]),
])
def test_keyword_sql(text: str, kind: str, fragment: str, params: list[object]) -> None:
    sql, got = to_sql(parse(text, kind))  # type: ignore[arg-type]
    assert fragment in sql
    assert got == params
    assert sql.count("%s") == len(got)


def test_an_injection_attempt_stays_a_parameter() -> None:
    evil = "x'); DROP TABLE batches; --"
    sql, params = to_sql(parse(f'name="{evil}" user="{evil}" "{evil}"', "batches"))
    assert "DROP" not in sql and "'x" not in sql
    assert params[:2] == ["name", evil] and evil in params


# ---------------------------------------------------------------- properties

free_text = st.text(max_size=20)
keys = st.text(min_size=1, max_size=12)
words = st.text(min_size=1, max_size=12)
comparisons = st.sampled_from(["=", "!=", ">", ">=", "<", "<="])
equality = st.sampled_from(["=", "!="])
ids = st.integers(min_value=-(2**63) + 1, max_value=2**63 - 1)
times = st.integers(min_value=-(10**13), max_value=10**14)  # years 1653 to 5138
BATCH_STATES = ["open", "running", "complete", "cancelled", "success", "failure"]
JOB_STATES = ["pending", "ready", "creating", "running", "success", "failed", "error", "cancelled", "done", "live"]


def terms(kind: str) -> st.SearchStrategy:
    common = [
        st.builds(AttributeTerm, keys, st.sampled_from(["=", "!=", "=~", "!~"]), free_text),
        st.builds(WordTerm, words),
        st.builds(KeywordTerm, st.sampled_from(["user", "billing_project"]), equality, free_text),
        st.builds(KeywordTerm, st.just("batch_id"), comparisons, ids),
        st.builds(KeywordTerm, st.just("cost"), comparisons,
                  st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f + 0.0)),
        st.builds(KeywordTerm, st.just("duration"), comparisons, st.integers(min_value=0, max_value=10**15)),
        st.builds(KeywordTerm, st.sampled_from(["start_time", "end_time"]), comparisons, times),
        st.builds(KeywordTerm, st.just("state"), equality,
                  st.sampled_from(BATCH_STATES if kind == "batches" else JOB_STATES)),
    ]
    if kind == "jobs":
        common += [
            st.builds(KeywordTerm, st.sampled_from(["job_id", "exit_code"]), comparisons, ids),
            st.builds(KeywordTerm, st.just("job_group"), equality, ids),
            st.builds(KeywordTerm, st.just("instance"), equality, free_text),
        ]
    return st.one_of(common)


queries = st.sampled_from(["batches", "jobs"]).flatmap(
    lambda kind: st.builds(Query, st.just(kind), st.lists(terms(kind), max_size=6).map(tuple))
)


@given(queries)
def test_format_then_parse_is_the_identity(query: Query) -> None:
    text = format_query(query)
    assert parse(text, query.kind) == query


def _blank_free_text(query: Query) -> Query:
    """The same query with every user-written string replaced by one constant."""
    def blank(term: object) -> object:
        if isinstance(term, AttributeTerm):
            return AttributeTerm("k", term.op, "v")
        if isinstance(term, WordTerm):
            return WordTerm("w")
        if isinstance(term, KeywordTerm) and term.keyword != "state":
            return dataclasses.replace(term, value="v" if isinstance(term.value, str) else 0)
        return term
    return Query(query.kind, tuple(blank(t) for t in query.terms))  # type: ignore[misc]


@given(queries)
def test_values_only_ever_travel_as_parameters(query: Query) -> None:
    sql, params = to_sql(query)
    assert sql.count("%s") == len(params)
    assert "%" not in sql.replace("%s", "")  # aiomysql would read any other % as a placeholder
    # The SQL text depends on the shape of the query only: change every value
    # and the text stays the same.
    assert to_sql(_blank_free_text(query))[0] == sql
    for term in query.terms:
        if isinstance(term, AttributeTerm):
            assert term.key in params
        elif isinstance(term, KeywordTerm) and term.keyword != "state":
            assert term.value in params


FRAGMENTS = [*KEYWORDS, "name", "=", "!=", "=~", "!~", ">", ">=", "<", "<=", "!", "~", " ", "\n", '"', "\\",
             "x", "1", "1.5", "5m", "2026-01-02", "T03:04:05Z", ";", "%", "'", "é", "_"]
query_like_text = st.lists(st.sampled_from(FRAGMENTS), max_size=12).map("".join)


@given(st.one_of(st.text(max_size=40), query_like_text), st.sampled_from(["batches", "jobs"]))
def test_any_text_parses_or_fails_cleanly(text: str, kind: str) -> None:
    try:
        query = parse(text, kind)  # type: ignore[arg-type]
    except QuerySyntaxError as e:
        assert 0 <= e.position <= len(text)
    else:
        sql, params = to_sql(query)
        assert sql.count("%s") == len(params)
        assert parse(format_query(query), query.kind) == query


def test_keywords_are_all_documented() -> None:
    import services.frontend.query as module

    assert module.__doc__ is not None
    for keyword in KEYWORDS:
        assert keyword in module.__doc__


# ---------------------------------------------------------------- limits


def test_a_query_over_the_byte_limit_is_refused_naming_the_limit() -> None:
    parse("x" * MAX_BYTES, "batches")
    with pytest.raises(QueryTooLarge, match="max_query_bytes") as error:
        parse("x" * (MAX_BYTES + 1), "batches")
    assert error.value.position == MAX_BYTES
    # Bytes, not characters: é is two.
    with pytest.raises(QueryTooLarge) as error:
        parse("é" * 6, "jobs", max_bytes=11)
    assert error.value.position == 5
    assert parse("é" * 5, "jobs", max_bytes=10) == Query("jobs", (WordTerm("é" * 5),))


def test_a_query_over_the_term_limit_is_refused_at_the_first_term_too_many() -> None:
    text = " ".join(["a"] * MAX_TERMS)
    assert len(parse(text, "batches").terms) == MAX_TERMS
    with pytest.raises(QueryTooLarge, match="max_query_terms") as error:
        parse(text + " state=open", "batches")
    assert error.value.position == len(text) + 1
    with pytest.raises(QueryTooLarge):
        parse("a=1 b=2 c", "jobs", max_terms=2)


@pytest.mark.parametrize("text", ["(state=open)", "a (b c)", "name=f(x)", ")", "((((((((((x))))))))))"])
def test_parentheses_do_not_group_and_are_refused_unless_quoted(text: str) -> None:
    with pytest.raises(QuerySyntaxError, match="parentheses do not group"):
        parse(text, "batches")
    assert parse('name="f(x)" "(a)"', "batches").terms == (AttributeTerm("name", "=", "f(x)"), WordTerm("(a)"))


def test_the_attacks_of_issue_9_are_refused_by_the_parser() -> None:
    for text in (" ".join(f"word{i}" for i in range(60_000)), "x" * 1_000_000, "(" * 10_000 + ")" * 10_000):
        with pytest.raises(QueryTooLarge):
            parse(text, "batches")


class CountingOperatorScan:
    """Counts the tokenizer's per-character work (operator look-ups), a measure
    of its running time that does not depend on the machine."""

    def __init__(self) -> None:
        self.calls = 0
        self._original = query_module._operator_at

    def __enter__(self) -> CountingOperatorScan:
        def counted(text: str, i: int) -> str | None:
            self.calls += 1
            return self._original(text, i)

        query_module._operator_at = counted
        return self

    def __exit__(self, *exc: object) -> None:
        query_module._operator_at = self._original


def parse_cost(text: str, kind: str = "batches") -> int:
    """Operator look-ups to parse (or refuse) `text` with limits high enough to parse it all."""
    with CountingOperatorScan() as counter:
        try:
            parse(text, kind, max_bytes=10**8, max_terms=10**8)  # type: ignore[arg-type]
        except QuerySyntaxError:
            pass
    return counter.calls


@pytest.mark.parametrize("text", [
    " ".join(f"word{i}" for i in range(60_000)),
    "(" * 10_000 + ")" * 10_000,
    "=" * 100_000,
    '"' + "\\\"" * 50_000 + '"',
    "a=" * 50_000,
    "x" * 1_000_000,
])
def test_parsing_is_linear_in_the_length_of_the_text(text: str) -> None:
    assert parse_cost(text) <= 2 * len(text) + 2


@given(st.one_of(st.text(max_size=2000), query_like_text, st.lists(st.sampled_from(FRAGMENTS), max_size=400).map("".join)),
       st.sampled_from(["batches", "jobs"]), st.integers(min_value=1, max_value=5000), st.integers(min_value=1, max_value=50))
def test_any_text_under_any_limits_parses_or_fails_with_a_query_error(text: str, kind: str, max_bytes: int,
                                                                      max_terms: int) -> None:
    try:
        query = parse(text, kind, max_bytes=max_bytes, max_terms=max_terms)  # type: ignore[arg-type]
    except QuerySyntaxError as e:  # QueryTooLarge is one
        assert 0 <= e.position <= len(text)
        assert e.description.startswith(f"at character {e.position}: ")
    else:
        assert len(text.encode()) <= max_bytes and len(query.terms) <= max_terms


@given(st.one_of(st.text(max_size=3000), st.lists(st.sampled_from(FRAGMENTS), max_size=600).map("".join)))
def test_the_parsers_work_grows_linearly_with_any_text(text: str) -> None:
    assert parse_cost(text) <= 2 * len(text) + 2
