"""The query language of ListBatches and ListJobs: text → AST → SQL.

A query is terms separated by whitespace, all of which must hold:

    key=value  key!=value     an attribute equals (or no attribute equals) value
    key=~text  key!~text      an attribute's value contains (or none contains) text
    word                      some attribute's key or value contains word
    state=S  state!=S         batches: open, running, complete, cancelled,
                              success (complete, every job succeeded),
                              failure or failed (some job failed or errored);
                              jobs: pending, ready, creating, running, success,
                              failed (or failure), error, cancelled, done (final), live
                              (ready, creating or running)
    user=U  billing_project=P (and !=)
    batch_id OP N   job_id OP N (jobs)   exit_code OP N (jobs)
    job_group=N  job_group!=N (jobs: in group N's subtree, or not)
    instance=NAME  instance!=NAME (jobs: where the latest attempt ran)
    cost OP 1.5               USD so far
    duration OP 90|30s|5m|2h|1d|250ms   (a bare number is seconds)
    start_time OP 2026-01-02[T03:04[:05[.123]]][Z|+01:00]   (no zone = UTC)
    end_time OP ...

with OP one of = != > >= < <=, spaces around it optional. A word or value
with spaces, quotes, parentheses or operator characters is written in double
quotes, with backslash escaping the next character (`"a \\"b\\" = c"`).
Parentheses do not group (every term must hold), so an unquoted one is an
error rather than a part of a word. Keywords are lower case; a quoted key
(`"state"=x`) is always an attribute, and an unquoted key that is a slip of
a keyword (`stat`, `states`, `State`: `near_keyword`) is refused where it
is, naming the keyword. Text compares as the columns'
collation does (utf8mb4_bin here: exact, case-sensitive); state names are
case-insensitive.

A query is at most `max_bytes` bytes of UTF-8 and `max_terms` terms
(services.frontend.limits: each term is a subquery of the statement, and
a query of 60,000 words once took MariaDB to 21 GB); over either it is
refused with QueryTooLarge before any SQL is made. Parsing is linear in
the text's length.

Batches: `start_time` is the creation time, `end_time` the completion time,
`duration` from creation to completion (or to now). Jobs: times, duration
and instance are those of the latest attempt (`jobs.attempt_id`), the
duration of a running attempt runs to now. A missing number or time (no
attempt yet, no exit code, not complete) matches no comparison, not even
`!=`; a negated text term (`key!=v`, `instance!=x`) matches rows without one.

`to_sql` gives a boolean SQL expression over the alias `b` (batches) or `j`
(jobs) with every value a `%s` parameter (aiomysql's paramstyle, so the text
holds no other `%`). Subqueries use their own aliases (attr, bgc, bcs, bc,
jb, jg, la, ajr, r), which shadow nothing the caller needs but `b` or `j`.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from collections.abc import Callable
from typing import Literal

Kind = Literal["batches", "jobs"]
KINDS: tuple[Kind, ...] = ("batches", "jobs")
COMPARISONS = ("=", "!=", ">", ">=", "<", "<=")
EQUALITY = ("=", "!=")
ATTRIBUTE_OPS = ("=", "!=", "=~", "!~")
_OPERATORS = ("!=", "!~", "=~", ">=", "<=", "=", ">", "<")  # longest first
_SQL_OP = {"=": "=", "!=": "<>", ">": ">", ">=": ">=", "<": "<", "<=": "<="}


MAX_BYTES = 4096
"""Default longest query (the frontend's setting: Limits.max_query_bytes)."""
MAX_TERMS = 32
"""Default most terms (the frontend's setting: Limits.max_query_terms)."""


class QuerySyntaxError(ValueError):
    """A query that cannot be parsed: `message` says why (fit for a
    google.rpc.BadRequest field violation on `query`), `position` is the
    0-based offset of the offending character."""

    def __init__(self, message: str, position: int):
        super().__init__(f"{message} (at character {position})")
        self.message = message
        self.position = position

    @property
    def description(self) -> str:
        """The field violation's description: where, and what is wrong."""
        return f"at character {self.position}: {self.message}"


class QueryTooLarge(QuerySyntaxError):
    """A query over a limit (bytes or terms); the message names the limit."""


@dataclasses.dataclass(frozen=True)
class AttributeTerm:
    """`key OP value` on the attributes (labels)."""

    key: str
    op: str
    """One of ATTRIBUTE_OPS: =, != (exact), =~, !~ (contains)."""
    value: str


@dataclasses.dataclass(frozen=True)
class WordTerm:
    """A bare word: some attribute key or value contains it."""

    word: str


@dataclasses.dataclass(frozen=True)
class KeywordTerm:
    """`keyword OP value` with the value already converted: a lower-case
    state, a name, an int id or code, a float USD cost, or milliseconds
    (durations, and times since the epoch in UTC)."""

    keyword: str
    op: str
    value: str | int | float


Term = AttributeTerm | WordTerm | KeywordTerm


@dataclasses.dataclass(frozen=True)
class Query:
    """A parsed query: every term must hold."""

    kind: Kind
    terms: tuple[Term, ...] = ()


# ---------------------------------------------------------------- values

_INT = re.compile(r"[+-]?\d+")
_FLOAT = re.compile(r"\$?[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?(?:Z|[+-]\d{2}:\d{2})?")
_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)
_INT64 = 2**63 - 1


def _parse_int(text: str) -> int:
    if not _INT.fullmatch(text) or abs(int(text)) > _INT64:
        raise ValueError(f"expected an integer, got {text!r}")
    return int(text)


def _parse_cost(text: str) -> float:
    if not _FLOAT.fullmatch(text):
        raise ValueError(f"expected a cost in USD such as 1.5, got {text!r}")
    cost = float(text.lstrip("$"))
    if not math.isfinite(cost):  # 1e999 is inf, which no SQL literal spells
        raise ValueError(f"cost {text!r} is out of range")
    return cost


def _parse_duration(text: str) -> int:
    match = _DURATION.fullmatch(text)
    if not match:
        raise ValueError(f"expected a duration such as 90, 30s, 5m, 2h, 1d or 250ms, got {text!r}")
    number, unit = match.groups()
    ms = float(number) * _UNIT_MS[unit or "s"]  # inf for 400 digits: round() would raise
    if not ms <= _INT64:
        raise ValueError(f"duration {text!r} is too long")
    return round(ms)


def _format_duration(ms: object) -> str:
    assert isinstance(ms, int)
    for unit in ("d", "h", "m", "s"):
        if ms % _UNIT_MS[unit] == 0:
            return f"{ms // _UNIT_MS[unit]}{unit}"
    return f"{ms}ms"


def _parse_time(text: str) -> int:
    if not _TIME.fullmatch(text):
        raise ValueError(f"expected a time such as 2026-01-02 or 2026-01-02T03:04:05Z, got {text!r}")
    try:
        moment = datetime.datetime.fromisoformat(text)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.UTC)  # UTC unless told otherwise
        # In UTC it must still be a date (0001-01-01T00:00+01:00 is not), or it
        # could not be written back.
        return (moment.astimezone(datetime.UTC) - _EPOCH) // _MS
    except (ValueError, OverflowError) as e:
        raise ValueError(f"not a valid time: {text!r} ({e})") from None


def _format_time(ms: object) -> str:
    assert isinstance(ms, int)
    moment = _EPOCH + ms * _MS
    text = f"{moment.year:04d}-" + moment.strftime("%m-%dT%H:%M:%S")  # %Y does not pad year 33
    return text + (f".{moment.microsecond // 1000:03d}Z" if moment.microsecond else "Z")


_BATCH_STATES = ("open", "running", "complete", "cancelled", "success", "failure")
_JOB_STATE_SETS = {
    "pending": ("Pending",), "ready": ("Ready",), "creating": ("Creating",), "running": ("Running",),
    "success": ("Success",), "failed": ("Failed",), "error": ("Error",), "cancelled": ("Cancelled",),
    "done": ("Success", "Failed", "Error", "Cancelled"), "live": ("Ready", "Creating", "Running"),
}
_STATE_ALIASES = {"canceled": "cancelled", "succeeded": "success", "completed": "complete"}
_KIND_ALIASES: dict[Kind, dict[str, str]] = {
    # Batches say `failure` and jobs `failed` for the same thing: each takes the other's word too.
    "batches": {"failed": "failure", "error": "failure", "errored": "failure"},
    "jobs": {"failure": "failed", "errored": "error"},
}


def _state_parser(kind: Kind) -> Callable[[str], str]:
    known = _BATCH_STATES if kind == "batches" else tuple(_JOB_STATE_SETS)
    aliases = {**_STATE_ALIASES, **_KIND_ALIASES[kind]}

    def parse(text: str) -> str:
        state = aliases.get(text.lower(), text.lower())
        if state not in known:
            raise ValueError(f"unknown {'batch' if kind == 'batches' else 'job'} state {text!r}; "
                             f"one of {', '.join(known)}")
        return state

    return parse


# ---------------------------------------------------------------- keywords
#
# Each keyword: the operators it takes, how its value is read and written,
# and its SQL per kind as a template where {op} is the SQL operator and %s
# the value. A kind missing from `sql` does not have the keyword.

# UNIX_TIMESTAMP() without an argument is the epoch itself: no session time
# zone is involved, as it would be converting NOW() back. Seconds suffice.
_NOW_MS = "(UNIX_TIMESTAMP() * 1000)"
_LATEST = "FROM attempts la WHERE la.batch_id = j.batch_id AND la.job_id = j.job_id AND la.attempt_id = j.attempt_id"
_BATCH_COUNTS = "FROM job_groups_n_jobs_in_complete_states bcs WHERE bcs.batch_id = b.batch_id AND bcs.job_group_id = 0"


@dataclasses.dataclass(frozen=True)
class _Keyword:
    ops: tuple[str, ...]
    parse: Callable[[str], str | int | float]
    sql: dict[str, str]
    format: Callable[[object], str] = str


_KEYWORDS: dict[str, _Keyword] = {
    "user": _Keyword(EQUALITY, str, {
        "batches": "b.user {op} %s",
        "jobs": "EXISTS (SELECT 1 FROM batches jb WHERE jb.batch_id = j.batch_id AND jb.user {op} %s)"}),
    "billing_project": _Keyword(EQUALITY, str, {
        "batches": "b.billing_project {op} %s",
        "jobs": "EXISTS (SELECT 1 FROM batches jb WHERE jb.batch_id = j.batch_id AND jb.billing_project {op} %s)"}),
    "batch_id": _Keyword(COMPARISONS, _parse_int, {"batches": "b.batch_id {op} %s", "jobs": "j.batch_id {op} %s"}),
    "job_id": _Keyword(COMPARISONS, _parse_int, {"jobs": "j.job_id {op} %s"}),
    "exit_code": _Keyword(COMPARISONS, _parse_int, {"jobs": "j.exit_code {op} %s"}),
    "job_group": _Keyword(EQUALITY, _parse_int, {"jobs": (
        "EXISTS (SELECT 1 FROM job_group_self_and_ancestors jg WHERE jg.batch_id = j.batch_id"
        " AND jg.job_group_id = j.job_group_id AND jg.ancestor_id = %s)")}),
    "instance": _Keyword(EQUALITY, str, {"jobs": f"EXISTS (SELECT 1 {_LATEST} AND la.instance_name = %s)"}),
    "cost": _Keyword(COMPARISONS, _parse_cost, {
        "batches": "COALESCE((SELECT bc.cost_usd FROM batch_cost bc WHERE bc.batch_id = b.batch_id), 0) {op} %s",
        "jobs": ("(SELECT COALESCE(SUM(ajr.`usage` * r.rate_usd), 0) FROM aggregated_job_resources ajr"
                 " JOIN resources r ON r.resource_id = ajr.resource_id"
                 " WHERE ajr.batch_id = j.batch_id AND ajr.job_id = j.job_id) {op} %s")}, repr),
    "duration": _Keyword(COMPARISONS, _parse_duration, {
        "batches": f"(COALESCE(b.time_completed_ms, {_NOW_MS}) - b.time_created_ms) {{op}} %s",
        "jobs": f"(SELECT COALESCE(la.end_time_ms, {_NOW_MS}) - la.start_time_ms {_LATEST}) {{op}} %s"},
        _format_duration),
    "start_time": _Keyword(COMPARISONS, _parse_time, {
        "batches": "b.time_created_ms {op} %s", "jobs": f"(SELECT la.start_time_ms {_LATEST}) {{op}} %s"},
        _format_time),
    "end_time": _Keyword(COMPARISONS, _parse_time, {
        "batches": "b.time_completed_ms {op} %s", "jobs": f"(SELECT la.end_time_ms {_LATEST}) {{op}} %s"},
        _format_time),
}
# Negating an existence test, not comparing inside it: `instance!=x` and
# `job_group!=3` also match jobs with no attempt or in no such subtree.
_NEGATE_EXISTS = {"instance", "job_group"}
KEYWORDS = frozenset(_KEYWORDS) | {"state"}


def _batch_state_sql(state: str) -> tuple[str, list[object]]:
    if state in ("open", "running", "complete"):
        return "b.state = %s", [state]
    if state == "cancelled":  # group 0 cancelled = the batch
        return ("EXISTS (SELECT 1 FROM job_groups_cancelled bgc"
                " WHERE bgc.batch_id = b.batch_id AND bgc.job_group_id = 0)"), []
    if state == "success":
        return f"b.state = %s AND b.n_jobs = (SELECT COALESCE(SUM(bcs.n_succeeded), 0) {_BATCH_COUNTS})", ["complete"]
    return f"(SELECT COALESCE(SUM(bcs.n_failed + bcs.n_errored), 0) {_BATCH_COUNTS}) > 0", []


# ---------------------------------------------------------------- parsing


@dataclasses.dataclass(frozen=True)
class _Token:
    text: str
    start: int
    op: bool = False
    quoted: bool = False


def _operator_at(text: str, i: int) -> str | None:
    return next((op for op in _OPERATORS if text.startswith(op, i)), None)


def _tokens(text: str) -> list[_Token]:
    tokens, i, n = [], 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
        elif text[i] == '"':
            start, i, chars = i, i + 1, []
            while i < n and text[i] != '"':
                if text[i] == "\\":
                    i += 1
                    if i == n:
                        break
                chars.append(text[i])
                i += 1
            if i >= n:
                raise QuerySyntaxError("unterminated quote", start)
            i += 1
            if i < n and not text[i].isspace() and _operator_at(text, i) is None:
                raise QuerySyntaxError("expected a space or an operator after a quoted string", i)
            tokens.append(_Token("".join(chars), start, quoted=True))
        elif op := _operator_at(text, i):
            tokens.append(_Token(op, i, op=True))
            i += len(op)
        else:
            start = i
            while i < n and not text[i].isspace() and _operator_at(text, i) is None:
                if text[i] == '"':
                    raise QuerySyntaxError("a quote inside a word; quote the whole word", i)
                if text[i] in "()":
                    raise QuerySyntaxError(
                        "parentheses do not group terms (every term must hold); quote a word that has them", i)
                i += 1
            tokens.append(_Token(text[start:i], start))
    return tokens


def parse(text: str, kind: Kind, max_bytes: int = MAX_BYTES, max_terms: int = MAX_TERMS) -> Query:
    """Parse `text` as a query on `kind`; raises QuerySyntaxError (QueryTooLarge
    for a query over `max_bytes` bytes or `max_terms` terms)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    # More characters than max_bytes is more bytes: a huge text is refused
    # without encoding it.
    if len(text) > max_bytes or len(text.encode("utf-8", "surrogatepass")) > max_bytes:
        # The first character that does not fit.
        fits = len(text[:max_bytes].encode("utf-8", "surrogatepass")[:max_bytes].decode("utf-8", "ignore"))
        raise QueryTooLarge(f"the query is longer than {max_bytes} bytes (max_query_bytes)", fits)
    tokens, terms, i = _tokens(text), [], 0
    while i < len(tokens):
        key = tokens[i]
        if len(terms) == max_terms:
            raise QueryTooLarge(f"the query has more than {max_terms} terms (max_query_terms)", key.start)
        if key.op:
            raise QuerySyntaxError(
                f"{key.text} needs a key or keyword before it (quote values that contain operator characters)",
                key.start)
        if i + 1 < len(tokens) and tokens[i + 1].op:
            op = tokens[i + 1]
            if i + 2 >= len(tokens) or tokens[i + 2].op:
                at = tokens[i + 2].start if i + 2 < len(tokens) else op.start + len(op.text)
                raise QuerySyntaxError(f"a value must follow {op.text} (quote a value with operator characters)", at)
            terms.append(_term(kind, key, op, tokens[i + 2]))
            i += 3
        else:
            if not key.text:
                raise QuerySyntaxError("empty search word", key.start)
            terms.append(WordTerm(key.text))
            i += 1
    return Query(kind, tuple(terms))


def _term(kind: Kind, key: _Token, op: _Token, value: _Token) -> Term:
    if not key.quoted and key.text in KEYWORDS:
        keyword = _KEYWORDS.get(key.text)
        if keyword is not None and kind not in keyword.sql:
            raise QuerySyntaxError(f"{key.text} is not a keyword for {kind} (quote it to mean an attribute)", key.start)
        ops = EQUALITY if keyword is None else keyword.ops
        if op.text not in ops:
            raise QuerySyntaxError(f"{key.text} takes {', '.join(ops)}, not {op.text}", op.start)
        parse_value = _state_parser(kind) if keyword is None else keyword.parse
        try:
            return KeywordTerm(key.text, op.text, parse_value(value.text))
        except ValueError as e:
            raise QuerySyntaxError(str(e), value.start) from None
    if not key.quoted and (near := near_keyword(key.text, kind)) is not None:
        raise QuerySyntaxError(f"unknown key {key.text!r}; did you mean {near}? (an attribute of that name is "
                               f"written quoted: \"{key.text}\"{op.text}...)", key.start)
    if op.text not in ATTRIBUTE_OPS:
        raise QuerySyntaxError(f"unknown keyword {key.text!r}; attributes take =, !=, =~ or !~", key.start)
    if not key.text:
        raise QuerySyntaxError("empty attribute key", key.start)
    return AttributeTerm(key.text, op.text, value.text)


_SLIPS = {"status": "state", "project": "billing_project", "exit": "exit_code", "exitcode": "exit_code",
          "group": "job_group"}
"""Words people write for a keyword (other batch systems' or its plain name), beyond the slips below."""


def near_keyword(key: str, kind: Kind) -> str | None:
    """The keyword of `kind` an unquoted key that is none stands for, or None. Such a key would be an
    attribute that no batch has, and the query would silently match nothing (`stat=running`): it is
    refused, and an attribute of that name is written quoted. A slip is the keyword in other case (`State`),
    a beginning of it (`stat`, `dur`), it with a letter or two more (`states`, `users`) or a word of _SLIPS;
    a key merely near a keyword (`stage`, `host`) is a fine attribute name."""
    keywords = [k for k in KEYWORDS if k == "state" or kind in _KEYWORDS[k].sql]
    lowered = key.lower()
    if _SLIPS.get(lowered) in keywords:
        return _SLIPS[lowered]
    for keyword in sorted(keywords):
        if lowered == keyword or (len(lowered) >= 3 and keyword.startswith(lowered)) or (
                lowered.startswith(keyword) and len(lowered) - len(keyword) <= 2):
            return keyword
    return None


# ---------------------------------------------------------------- formatting

_SAFE = re.compile(r"[A-Za-z0-9_.:/@+,*-]+")


def _quote(text: str, force: bool = False) -> str:
    if _SAFE.fullmatch(text) and not force:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def format_query(query: Query) -> str:
    """The text of `query`, such that parse(format_query(q), q.kind) == q."""
    parts = []
    for term in query.terms:
        if isinstance(term, WordTerm):
            parts.append(_quote(term.word))
        elif isinstance(term, AttributeTerm):
            force = term.key in KEYWORDS or near_keyword(term.key, query.kind) is not None
            parts.append(f"{_quote(term.key, force=force)}{term.op}{_quote(term.value)}")
        else:
            keyword = _KEYWORDS.get(term.keyword)
            text = keyword.format(term.value) if keyword else str(term.value)
            parts.append(f"{term.keyword}{term.op}{_quote(text)}")
    return " ".join(parts)


# ---------------------------------------------------------------- SQL


def _like(text: str) -> str:
    """A LIKE pattern for "contains text", escaped with '|' (not backslash,
    whose meaning in literals depends on the server's sql_mode)."""
    return "%" + text.replace("|", "||").replace("%", "|%").replace("_", "|_") + "%"


def _term_sql(kind: Kind, term: Term) -> tuple[str, list[object]]:
    owner = ("batch_attributes attr WHERE attr.batch_id = b.batch_id" if kind == "batches"
             else "job_attributes attr WHERE attr.batch_id = j.batch_id AND attr.job_id = j.job_id")
    if isinstance(term, WordTerm):
        pattern = _like(term.word)
        return (f"EXISTS (SELECT 1 FROM {owner}"
                " AND (attr.`key` LIKE %s ESCAPE '|' OR attr.`value` LIKE %s ESCAPE '|'))"), [pattern, pattern]
    if isinstance(term, AttributeTerm):
        contains = term.op in ("=~", "!~")
        test = "LIKE %s ESCAPE '|'" if contains else "= %s"
        exists = f"EXISTS (SELECT 1 FROM {owner} AND attr.`key` = %s AND attr.`value` {test})"
        # key!=v: no attribute `key` equal to v, which includes having none.
        negation = "NOT " if term.op.startswith("!") else ""
        return negation + exists, [term.key, _like(term.value) if contains else term.value]
    if term.keyword == "state":
        assert isinstance(term.value, str)
        if kind == "batches":
            sql, params = _batch_state_sql(term.value)
        else:
            states = _JOB_STATE_SETS[term.value]
            sql, params = f"j.state IN ({', '.join(['%s'] * len(states))})", list(states)
        return (f"NOT ({sql})" if term.op == "!=" else sql), params
    template = _KEYWORDS[term.keyword].sql[kind]
    if term.keyword in _NEGATE_EXISTS:
        return ("NOT " if term.op == "!=" else "") + template, [term.value]
    return template.format(op=_SQL_OP[term.op]), [term.value]


def to_sql(query: Query) -> tuple[str, list[object]]:
    """A SQL boolean expression for a WHERE clause over `b` (batches) or `j`
    (jobs), and its parameters; "TRUE" for the empty query."""
    if not query.terms:
        return "TRUE", []
    parts, params = [], []
    for term in query.terms:
        sql, term_params = _term_sql(query.kind, term)
        parts.append(f"({sql})")
        params += term_params
    return " AND ".join(parts), params
