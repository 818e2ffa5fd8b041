"""Split a SQL file into statements the way the `mysql`/`mariadb` client does.

Our SQL files use the client's `DELIMITER` directive around procedure and
trigger bodies, so the same file loads with `mariadb < file.sql` and with the
migration runner. Only what our files need is understood: `--` and `#` line
comments, `/* */` block comments, quoted strings and identifiers, and
`DELIMITER x` lines.
"""

from __future__ import annotations


class SqlFileError(ValueError):
    """A SQL file could not be split (unterminated string or comment)."""


def split_statements(text: str) -> list[str]:
    """Return the statements of `text`, without delimiters or empty ones."""
    statements: list[str] = []
    delimiter = ";"
    current: list[str] = []
    i = 0
    n = len(text)
    at_line_start = True
    while i < n:
        if at_line_start and not "".join(current).strip():
            # Like the client, DELIMITER is read only where a statement
            # starts; the new delimiter is its first word.
            line_end = text.find("\n", i)
            line_end = n if line_end == -1 else line_end
            parts = text[i:line_end].split()
            if parts and parts[0].upper() == "DELIMITER":
                if len(parts) < 2:
                    raise SqlFileError(f"bad DELIMITER line: {text[i:line_end]!r}")
                current.clear()
                delimiter = parts[1]
                i = line_end + 1
                continue
        ch = text[i]
        at_line_start = False
        if ch == "\n":
            at_line_start = True
            current.append(ch)
            i += 1
        elif text.startswith("--", i) and (i + 2 >= n or text[i + 2] in " \t\r\n"):
            i = _skip_to_line_end(text, i)
        elif ch == "#":
            i = _skip_to_line_end(text, i)
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                raise SqlFileError("unterminated /* comment")
            current.append(" ")  # a comment separates tokens
            i = end + 2
        elif ch in ("'", '"', "`"):
            end = _string_end(text, i)
            current.append(text[i:end])
            i = end
        elif text.startswith(delimiter, i):
            _flush(current, statements)
            i += len(delimiter)
        else:
            current.append(ch)
            i += 1
    _flush(current, statements)
    return statements


def _flush(current: list[str], statements: list[str]) -> None:
    statement = "".join(current).strip()
    current.clear()
    if statement:
        statements.append(statement)


def _skip_to_line_end(text: str, i: int) -> int:
    end = text.find("\n", i)
    return len(text) if end == -1 else end


def _string_end(text: str, start: int) -> int:
    quote = text[start]
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "`":
            i += 2
            continue
        if ch == quote:
            if i + 1 < len(text) and text[i + 1] == quote:
                i += 2
                continue
            return i + 1
        i += 1
    raise SqlFileError(f"unterminated {quote} string")
