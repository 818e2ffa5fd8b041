"""Generated queries for the query language, and the check each must pass.

`query_texts(kind)` is a hypothesis strategy mixing three families:
- *grammatical* queries built from the grammar of docs/query-language.md:
  every keyword with values of its type (and of other types), attribute
  terms, bare and quoted words, every operator, spaces around operators or
  not, odd whitespace between terms, huge numbers, every state name and
  alias in any letter case, times with zones, durations with units;
- *mutants* of grammatical queries: characters inserted, deleted,
  replaced or duplicated (quotes, backslashes, parentheses, operator
  characters, NUL, combining marks, right-to-left overrides, astral
  characters), a number grown to hundreds of digits, the text cut short or
  wrapped in parentheses many levels deep;
- *garbage*: any Unicode text a protobuf string can carry, runs of grammar
  fragments, deep nesting.

`check_query` is the property: the parser raises nothing but its own
QuerySyntaxError, whose position lies within the input; a parsed query
compiles to SQL whose placeholders match its parameters, each of which
MariaDB takes as it is (finite numbers in range, valid UTF-8), and which
formats back to itself. That MariaDB accepts the SQL is checked over gRPC
by the service tests and `python -m bench fuzz-query`.
"""

from __future__ import annotations

import dataclasses
import math
import random
import string
from collections.abc import Callable, Iterator

from hypothesis import strategies as st

from services.frontend.limits import Limits
from services.frontend.query import (
    KEYWORDS,
    Kind,
    Query,
    QuerySyntaxError,
    format_query,
    parse,
    to_sql,
)

KINDS: tuple[Kind, ...] = ("batches", "jobs")
OPERATORS = ("=", "!=", ">", ">=", "<", "<=", "=~", "!~")
BATCH_STATES = ("open", "running", "complete", "cancelled", "success", "failure", "canceled", "succeeded",
                "completed")
JOB_STATES = ("pending", "ready", "creating", "running", "success", "failed", "error", "cancelled", "done", "live",
              "canceled", "succeeded")
# Between terms: what str.isspace() says is a space, and some it does not.
SEPARATORS = (" ", " ", " ", "  ", "\t", "\n", "\r\n", "\x0b", "\x0c", "\x1c", "\x85", "\u00a0", "\u2003",
              "\u2028", "\u3000", "\u200b", "\ufeff")
# Characters a mutation puts in: the grammar's own, and Unicode that trips up code.
SPECIALS = tuple('"\\()=!<>~$%_|\';#*?, \t\n') + (
    "\x00", "\x7f", "é", "ß", "İ", "ﬃ", "\u0301", "\u200d", "\u202e", "\ufeff", "\u2028", "\U0001f600", "\U0001d7d8",
    "\uffff", "\U0010ffff", "１", "٣", "⁵", "Ⅻ", "＝", "＂")
FRAGMENTS = (*sorted(KEYWORDS), *OPERATORS, "name", "x", "1", "-1", "1.5", "1e999", "$", "5m", "250ms", "2026-01-02",
             "T03:04:05Z", "+01:00", '"', '\\"', "\\", "(", ")", " ", "\n", "%", "_", "|", "'", ";", "é", "\x00")

_IDENTIFIER = string.ascii_letters + string.digits + "_-.:/@+,*"
identifiers = st.text(_IDENTIFIER, min_size=1, max_size=12)
# What a protobuf string can hold: any Unicode scalar value (no surrogates).
unicode_text = st.text(st.characters(codec="utf-8"), max_size=24)


def quote(text: str) -> str:
    """`text` as a quoted string of the language."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# Quoting as people get it wrong: unterminated, a backslash at the end, quotes
# inside words, a quote right after a quoted string, empty strings.
odd_quoting = st.sampled_from(['"', '"abc', '"abc\\"', '"a"b', 'a"b"', '""', '"\\', '"\\\\"', '"a""b"', '"""',
                               '"a\\', "'a b'", '"a\n b"', '\\"a\\"'])


def _in_any_case(words: tuple[str, ...]) -> st.SearchStrategy[str]:
    return st.tuples(st.sampled_from(words), st.integers(min_value=0, max_value=3)).map(
        lambda wc: (wc[0], wc[0].upper(), wc[0].capitalize(), wc[0].swapcase())[wc[1]])


texts = st.one_of(identifiers, unicode_text.map(quote), unicode_text, odd_quoting)
"""A value or key: bare, quoted, raw Unicode (often not a valid token), or badly quoted."""

integers = st.one_of(
    st.integers(min_value=-1_000, max_value=1_000).map(str),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.integers(min_value=19, max_value=400).map(lambda n: "9" * n),
    st.sampled_from(["+5", "-0", "007", "1_000", "0x10", "1e3", "١٢", "９"]),
)
costs = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(min_value=0, max_value=1e6).map(lambda f: f"${f}"),
    st.sampled_from(["1e999", "-1e999", "1e308", "1e-999", "$", "$-3", ".5", "1.", "1e", "1e+", "$$1", "nan", "inf"]),
    st.integers(min_value=1, max_value=400).map(lambda n: "9" * n + ".5"),
)
durations = st.tuples(
    st.one_of(st.integers(min_value=0, max_value=10**6).map(str), st.decimals(min_value=0, max_value=10**9, places=3,
                                                                              allow_nan=False).map(str),
              st.integers(min_value=19, max_value=400).map(lambda n: "9" * n)),
    st.sampled_from(["", "ms", "s", "m", "h", "d", "y", "M", "S", " s"]),
).map("".join)
_ZONES = st.one_of(st.just(""), st.just("Z"), st.builds(
    "{}{:02d}:{:02d}".format, st.sampled_from("+-"), st.integers(min_value=0, max_value=30),
    st.integers(min_value=0, max_value=70)))
times = st.one_of(
    st.builds("{}{}".format, st.dates().map(lambda d: d.isoformat()), _ZONES),
    st.builds("{}T{}{}".format, st.dates().map(lambda d: d.isoformat()),
              st.times().map(lambda t: t.isoformat()), _ZONES),
    st.builds("{:04d}-{:02d}-{:02d}T{:02d}:{:02d}:{:02d}{}".format, st.integers(0, 9999), st.integers(0, 99),
              st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), st.integers(0, 99), _ZONES),
    st.sampled_from(["0001-01-01T00:00+23:59", "9999-12-31T23:59:59-23:59", "2026-02-30", "2026-01-02T24:00",
                     '"2026-01-02 03:04:05"', "yesterday", "2026-1-2", "20260102"]),
)


def _keyword_values(keyword: str, kind: Kind) -> st.SearchStrategy[str]:
    own = {
        "state": _in_any_case(BATCH_STATES if kind == "batches" else JOB_STATES),
        "batch_id": integers, "job_id": integers, "exit_code": integers, "job_group": integers,
        "cost": costs, "duration": durations, "start_time": times, "end_time": times,
    }.get(keyword, texts)
    return st.one_of(own, own, own, texts, integers)


_SPACES = st.sampled_from(["", "", " ", "\t", "\n"])


def _terms(kind: Kind) -> st.SearchStrategy[str]:
    keyword_terms = [st.tuples(st.just(k), _SPACES, st.sampled_from(OPERATORS), _SPACES, _keyword_values(k, kind))
                     for k in sorted(KEYWORDS)]
    attribute_terms = st.tuples(st.one_of(identifiers, unicode_text.map(quote)), _SPACES, st.sampled_from(OPERATORS),
                                _SPACES, texts)
    return st.one_of(identifiers, unicode_text.map(quote), odd_quoting,
                     st.one_of(keyword_terms).map("".join), st.one_of(keyword_terms).map("".join),
                     attribute_terms.map("".join))


TERMS = {kind: _terms(kind) for kind in KINDS}
"""One term on each kind: `keyword OP value` (values of the keyword's type and others),
`key OP value` on attributes, or a word; spaces around the operator or not."""


def _joined(parts_and_separators: tuple[list[str], list[str]]) -> str:
    parts, separators = parts_and_separators
    return separators[0] + "".join(part + separator for part, separator in zip(parts, separators[1:]))


def grammatical(kind: Kind) -> st.SearchStrategy[str]:
    """Terms separated by whitespace, with whitespace around them."""
    return st.lists(TERMS[kind], max_size=8).flatmap(lambda parts: st.tuples(
        st.just(parts), st.lists(st.sampled_from(SEPARATORS), min_size=len(parts) + 1,
                                 max_size=len(parts) + 1))).map(_joined)


GRAMMATICAL = {kind: grammatical(kind) for kind in KINDS}


Pick = Callable[[int, int], int]
"""`pick(lo, hi)`: a whole number from lo to hi inclusive (a hypothesis draw or random.randint)."""


def _grow_a_number(text: str, at: int, digits: int) -> str:
    """The first run of digits at or after `at` made `digits` long."""
    start = next((i for i in range(at, len(text)) if text[i].isdigit()), None)
    if start is None:
        return text + "9" * digits
    end = start
    while end < len(text) and text[end].isdigit():
        end += 1
    return text[:start] + "9" * digits + text[end:]


def mutate(text: str, pick: Pick) -> str:
    """`text` with one to four mutations, each chosen with `pick`."""
    for _ in range(pick(1, 4)):
        at, how = pick(0, len(text)), pick(0, 7)
        if how == 0:
            text = text[:at] + SPECIALS[pick(0, len(SPECIALS) - 1)] + text[at:]
        elif how == 1:
            text = text[:at] + text[at + pick(1, 8):]
        elif how == 2:
            text = text[:at] + SPECIALS[pick(0, len(SPECIALS) - 1)] + text[at + 1:]
        elif how == 3:
            text = text[:at] + text[at // 2:at] + text[at:]
        elif how == 4:
            text = text[:at]
        elif how == 5:
            depth = pick(1, 300)
            text = "(" * depth + text + ")" * pick(0, depth)
        elif how == 6:
            text = _grow_a_number(text, at, pick(19, 500))
        else:
            text = text[:at] + FRAGMENTS[pick(0, len(FRAGMENTS) - 1)] + text[at:]
    return text


@st.composite
def mutated(draw: st.DrawFn, kind: Kind) -> str:
    """A grammatical query with one to four mutations."""
    text = draw(GRAMMATICAL[kind])
    return mutate(text, lambda lo, hi: draw(st.integers(min_value=lo, max_value=hi)))


def mutants(text: str, seed: int, n: int) -> Iterator[str]:
    """`n` mutants of `text`, made by `mutate` with a generator seeded by `seed` (fast:
    what the long run uses to turn each hypothesis example into many inputs)."""
    rng = random.Random(seed)
    for _ in range(n):
        yield mutate(text, rng.randint)


garbage = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=64),
    st.lists(st.sampled_from(FRAGMENTS), max_size=24).map("".join),
    st.tuples(st.integers(min_value=1, max_value=2_000), unicode_text).map(lambda d: "(" * d[0] + d[1] + ")" * d[0]),
    st.lists(st.sampled_from(SPECIALS), max_size=40).map("".join),
)


def query_texts(kind: Kind) -> st.SearchStrategy[str]:
    """Queries on `kind`: grammatical, mutated and garbage, about a third each."""
    return QUERY_TEXTS[kind]


QUERY_TEXTS = {kind: st.one_of(GRAMMATICAL[kind], mutated(kind), garbage) for kind in KINDS}
kinds_and_texts = st.sampled_from(KINDS).flatmap(lambda kind: st.tuples(st.just(kind), QUERY_TEXTS[kind]))
"""(kind, text) pairs over both kinds."""


# ---------------------------------------------------------------- the property


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the parser and the compiler made of one text."""

    query: Query | None
    """The parsed query; None when refused."""
    refusal: QuerySyntaxError | None
    """The refusal; None when parsed."""
    sql: str = ""
    params: tuple[object, ...] = ()


INT64 = (-(2**63), 2**63 - 1)


def _check_parameter(value: object) -> None:
    """A value MariaDB takes as a parameter as it is: no inf, no NaN, no integer past BIGINT, no lone surrogate."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise AssertionError(f"parameter {value!r} of type {type(value).__name__}")
    if isinstance(value, str):
        value.encode("utf-8")  # strict: raises on a lone surrogate
    elif isinstance(value, int):
        assert INT64[0] <= value <= INT64[1], f"integer parameter {value} outside BIGINT"
    else:
        assert math.isfinite(value), f"float parameter {value!r}"


def check_query(text: str, kind: Kind, limits: Limits = Limits()) -> Checked:
    """Parse and compile `text` as the frontend does; raises AssertionError (or whatever the
    parser raised that is not a QuerySyntaxError) on an internal error."""
    try:
        query = parse(text, kind, limits.max_query_bytes, limits.max_query_terms)
    except QuerySyntaxError as refusal:
        assert isinstance(refusal.position, int) and 0 <= refusal.position <= len(text), (
            f"position {refusal.position} outside a text of {len(text)} characters")
        assert refusal.description.startswith(f"at character {refusal.position}: "), refusal.description
        return Checked(None, refusal)
    sql, params = to_sql(query)
    assert sql.count("%s") == len(params), "placeholders and parameters differ"
    assert "%" not in sql.replace("%s", ""), "a % in the SQL text that is not a placeholder"
    for value in params:
        _check_parameter(value)
    again = parse(format_query(query), kind, max_bytes=10**9, max_terms=10**9)
    assert again == query, f"formats as {format_query(query)!r}, which parses as {again}"
    return Checked(query, None, sql, tuple(params))
