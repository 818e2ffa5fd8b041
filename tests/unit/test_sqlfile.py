"""`split_statements` splits SQL files the way the mysql client does: on the
current delimiter, never inside quotes or comments, honouring DELIMITER lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.db.migrations import SQL_DIR
from services.db.sqlfile import SqlFileError, split_statements

# ---------------------------------------------------------------- examples


def test_splits_on_semicolons_and_drops_empty_statements() -> None:
    assert split_statements("SELECT 1;\n\n  ;SELECT 2 ;\n;") == ["SELECT 1", "SELECT 2"]


def test_last_statement_needs_no_delimiter() -> None:
    assert split_statements("SELECT 1;\nSELECT 2\n") == ["SELECT 1", "SELECT 2"]


@pytest.mark.parametrize(
    "literal",
    [
        "'a;b'",
        '"a;b"',
        "`a;b`",
        "'it''s; fine'",
        "'it\\'s; fine'",
        '"say ""hi""; now"',
        "'back\\\\'",
        "`back\\`",
        "'-- not a comment;'",
        "'/* not a comment; */'",
        "'# not a comment;'",
        "'\nDELIMITER $$\n'",
    ],
)
def test_delimiters_inside_quotes_do_not_split(literal: str) -> None:
    assert split_statements(f"SELECT {literal};SELECT 2") == [f"SELECT {literal}", "SELECT 2"]


def test_comments_are_dropped_with_their_delimiters() -> None:
    text = "-- a; comment\nSELECT 1 # another; one\n, 2 /* and; a\nblock */ ;\n/* only a comment; */"
    assert split_statements(text) == ["SELECT 1 \n, 2"]


def test_double_dash_without_space_is_not_a_comment() -> None:
    assert split_statements("SELECT 1--1;") == ["SELECT 1--1"]


def test_delimiter_block_keeps_semicolons_of_a_body() -> None:
    text = (
        "DROP PROCEDURE IF EXISTS p;\n"
        "DELIMITER $$\n"
        "CREATE PROCEDURE p()\nBEGIN\n  SELECT 1;\n  SELECT '$$';\nEND $$\n"
        "delimiter ;\n"
        "CALL p();\n"
    )
    assert split_statements(text) == [
        "DROP PROCEDURE IF EXISTS p",
        "CREATE PROCEDURE p()\nBEGIN\n  SELECT 1;\n  SELECT '$$';\nEND",
        "CALL p()",
    ]


@pytest.mark.parametrize(
    "text",
    ["SELECT 'abc", 'SELECT "abc', "SELECT `abc", "SELECT 'abc\\'", "SELECT 1 /* never closed", "DELIMITER\n"],
)
def test_malformed_text_is_refused(text: str) -> None:
    with pytest.raises(SqlFileError):
        split_statements(text)


@pytest.mark.parametrize(
    ("text", "statements"),
    [
        # A block comment separates the tokens around it.
        ("SELECT 'a' AS v/* c */UNION SELECT 'b'", ["SELECT 'a' AS v UNION SELECT 'b'"]),
        # The client accepts any blank after DELIMITER and ignores what follows the delimiter.
        ("DELIMITER\t$$\nSELECT 2$$\n", ["SELECT 2"]),
        ("DELIMITER $$ -- why\nSELECT 3$$\n", ["SELECT 3"]),
        # The client reads DELIMITER only at the start of a statement, not of any line.
        ("SELECT 1,\ndelimiter FROM t;\nSELECT 9;", ["SELECT 1,\ndelimiter FROM t", "SELECT 9"]),
    ],
    ids=["block-comment-glues-tokens", "delimiter-tab", "delimiter-trailing-comment", "delimiter-mid-statement"],
)
def test_edge_cases_behave_like_the_mysql_client(text: str, statements: list[str]) -> None:
    assert split_statements(text) == statements


# ---------------------------------------------------------------- property
#
# A script is built from statements of pieces joined by spaces (so no two
# pieces fuse into a comment or a delimiter): words, quoted strings full of
# delimiters, quotes and comment markers, and comments. Splitting must give
# back each statement's pieces without its comments; whitespace is compared
# only as token boundaries, so a comment may leave a space or a newline.

_WORDS = st.sampled_from(["SELECT", "x", "t1", "42", "3.5", "(", ")", ",", "=", "+", "-", "*", "<>", "AND", "END", "\n"])
_KEYWORDS = st.sampled_from(["SELECT", "INSERT", "UPDATE", "CREATE", "CALL", "SET"])
# Text with every character the splitter treats specially, and the words it looks for.
_TRICKY = st.lists(
    st.one_of(
        st.sampled_from([";", ";;", "$$", "//", "'", '"', "`", "\\", "\n", "--", "-- ", "#", "/*", "*/", "DELIMITER ", "\nDELIMITER $$\n"]),
        st.text(alphabet="abc xyz", max_size=4),
    ),
    max_size=6,
).map("".join)
_TOKEN = re.compile(r"""'(?:[^'\\]|\\.|'')*'|"(?:[^"\\]|\\.|"")*"|`(?:[^`]|``)*`|\S+""", re.S)


def _tokens(statement: str) -> list[str]:
    """Quoted strings whole, other text split on whitespace."""
    return _TOKEN.findall(statement)


@st.composite
def _quoted(draw: st.DrawFn) -> str:
    """A string literal or quoted identifier."""
    content = draw(_TRICKY)
    quote = draw(st.sampled_from(["'", '"', "`"]))
    if quote == "`":
        # Backslash is not an escape inside identifiers; only doubling is.
        return "`" + content.replace("`", "``") + "`"
    escaped_quote = draw(st.sampled_from([quote + quote, "\\" + quote]))
    return quote + content.replace("\\", "\\\\").replace(quote, escaped_quote) + quote


@st.composite
def _comment(draw: st.DrawFn) -> str:
    content = draw(_TRICKY)
    kind = draw(st.sampled_from(["-- ", "--\t", "--", "# ", "#", "/* "]))
    if kind == "/* ":
        # The space after `/*` keeps clear of MySQL's `/*!` executable comments.
        return "/* " + content.replace("*/", "* /") + " */"
    if kind == "--":
        return "--\n"  # `--` starts a comment only before whitespace
    return kind + content.replace("\n", " ") + "\n"


@st.composite
def _statement(draw: st.DrawFn, bare_semicolons: bool) -> tuple[str, list[str]]:
    """(as written, its tokens) for one statement that starts with a keyword."""
    words = st.one_of(_WORDS, st.just(";")) if bare_semicolons else _WORDS
    code = st.one_of(words, _quoted()).map(lambda text: (text, True))
    comment = _comment().map(lambda text: (text, False))
    leading = draw(st.lists(comment, max_size=1))
    middle = draw(st.lists(st.one_of(code, comment), max_size=8))
    # End on a word or a comment, never a bare `;` that could fuse with the delimiter.
    last = draw(st.one_of(_WORDS.map(lambda text: (text, True)), comment))
    pieces = [*leading, (draw(_KEYWORDS), True), *middle, last]
    written = " ".join(text for text, _ in pieces)
    return written, [text for text, is_code in pieces if is_code and text != "\n"]


@st.composite
def _block(draw: st.DrawFn) -> tuple[str, list[list[str]]]:
    """Statements ended by `;`, or a DELIMITER block of statements with `;` inside."""
    delimiter = draw(st.sampled_from([";", "$$", "//", ";;"]))
    statements = draw(st.lists(_statement(bare_semicolons=delimiter != ";"), min_size=1, max_size=4))
    body = "".join(f"{written}{delimiter}\n" for written, _ in statements)
    if delimiter != ";":
        directive = draw(st.sampled_from(["DELIMITER", "delimiter", "Delimiter"]))
        body = f"{directive} {delimiter}\n{body}{directive} ;\n"
    return body, [tokens for _, tokens in statements]


@settings(deadline=None, max_examples=300)
@given(st.lists(_block(), min_size=1, max_size=4))
def test_split_recovers_the_statements_of_a_script(blocks: list[tuple[str, list[list[str]]]]) -> None:
    script = "".join(text for text, _ in blocks)
    expected = [tokens for _, statements in blocks for tokens in statements]
    assert [_tokens(statement) for statement in split_statements(script)] == expected


def test_tokens_keep_quoted_strings_whole() -> None:
    assert _tokens("SELECT 'a b''c\\' d',\n`x y` \"z\"") == ["SELECT", "'a b''c\\' d'", ",", "`x y`", '"z"']


# ---------------------------------------------------------------- real files

_SQL_FILES = sorted(SQL_DIR.rglob("*.sql"))
_STATEMENT_KEYWORDS = {"CREATE", "DROP", "ALTER", "INSERT", "REPLACE", "UPDATE", "DELETE", "SET", "SELECT", "CALL"}


def test_the_repository_has_sql_files() -> None:
    assert len(_SQL_FILES) > 3


@pytest.mark.parametrize("path", _SQL_FILES, ids=lambda p: str(p.relative_to(SQL_DIR)))
def test_every_statement_of_a_real_file_starts_with_a_keyword(path: Path) -> None:
    statements = split_statements(path.read_text())
    assert statements
    for statement in statements:
        first_word = re.match(r"\w+", statement)
        assert first_word and first_word.group(0).upper() in _STATEMENT_KEYWORDS, statement[:80]


_ROUTINE_FILES = [p for p in _SQL_FILES if p.parent.name in ("procedures", "triggers")]


@pytest.mark.parametrize("path", _ROUTINE_FILES, ids=lambda p: str(p.relative_to(SQL_DIR)))
def test_routine_file_drops_then_creates_the_routine_it_is_named_after(path: Path) -> None:
    # Re-applying a changed file must be idempotent: DROP ... IF EXISTS, then CREATE, of the same kind
    # (sql/procedures/ holds the stored functions too).
    kinds = {"procedures": ("PROCEDURE", "FUNCTION"), "triggers": ("TRIGGER",)}[path.parent.name]
    drop, create = split_statements(path.read_text())
    kind = drop.split()[1] if drop.startswith("DROP ") else ""
    assert kind in kinds, drop[:80]
    assert drop == f"DROP {kind} IF EXISTS {path.stem}"
    assert re.match(rf"CREATE {kind} {path.stem}\b", create), create[:80]
