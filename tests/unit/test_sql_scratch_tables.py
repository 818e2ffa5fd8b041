"""Scratch (temporary) tables in the stored procedures.

Every CREATE TEMPORARY TABLE follows a DROP TEMPORARY TABLE IF EXISTS of
the same table, never IF NOT EXISTS: a table left by an older definition
is never reused.

The hot procedures make theirs once per connection: a version, the hash of
their CREATE statements, is kept in a session variable, and while it
matches, a call empties the tables instead of making them again. Dropping a
temporary table makes the connection load and parse every routine it calls
again on its next call (a fifth of the database's CPU in a run of simulated
workers), so the drop is what this avoids. They are emptied with TRUNCATE,
and only with no transaction open, since TRUNCATE commits implicitly even
for a temporary table; a MEMORY table may be emptied with DELETE. An InnoDB
table is never emptied with DELETE: InnoDB does not purge the rows deleted
from a temporary table, so a table emptied that way and reused on a pooled
connection makes every scan of it slower with each call that connection
has served (measured: a 50-row table cost 1.2 ms per insert-and-scan cycle
after 100 calls and 3.9 ms after 600).
"""

from __future__ import annotations

import hashlib
import re

import pytest

from services.db.migrations import SQL_DIR

ROUTINES = sorted((SQL_DIR / "procedures").glob("*.sql")) + sorted((SQL_DIR / "triggers").glob("*.sql"))

CREATE = re.compile(r"CREATE\s+TEMPORARY\s+TABLE\s+(IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)


def _code(path) -> str:
    """The file without its `--` comments, which talk about these statements."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


@pytest.mark.parametrize("path", ROUTINES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_temporary_table_is_dropped_right_before_it_is_created(path) -> None:
    code = _code(path)
    for match in CREATE.finditer(code):
        name = match.group(2)
        assert not match.group(1), f"{path.name}: {name} is created IF NOT EXISTS, to be reused"
        before = code[:match.start()].rstrip()
        assert re.search(rf"DROP\s+TEMPORARY\s+TABLE\s+IF\s+EXISTS\s+{name}\s*;$", before, re.IGNORECASE), (
            f"{path.name}: CREATE TEMPORARY TABLE {name} is not preceded by DROP TEMPORARY TABLE IF EXISTS {name}")


def test_the_check_finds_temporary_tables() -> None:
    """The pattern above is not vacuous: the hot procedures do create some."""
    names = {m.group(2) for path in ROUTINES for m in CREATE.finditer(_code(path))}
    assert {"tmp_job_completions", "tmp_job_changes", "tmp_children", "tmp_job_starts"} <= names


GUARD = re.compile(r"IF\s+(@@in_transaction\s*=\s*0\s+AND\s+)?@(corral_scratch_\w+)\s*<=>\s*'(\w+)'\s+THEN"
                   r"(?P<empty>.*?)\bELSE\b(?P<make>.*?)\bEND\s+IF\s*;", re.IGNORECASE | re.DOTALL)


def _version(make: str) -> str:
    """The hash a guarded block's version must be: of its CREATE statements, whitespace folded."""
    statements = re.findall(r"CREATE\s+TEMPORARY\s+TABLE\b.*?;", make, re.IGNORECASE | re.DOTALL)
    return hashlib.sha256("\n".join(" ".join(s.split()) for s in statements).encode()).hexdigest()[:12]


GUARDED = [path for path in ROUTINES if GUARD.search(_code(path))]


def test_the_hot_procedures_keep_their_scratch_tables() -> None:
    names = {path.stem for path in GUARDED}
    assert {"create_completion_tables", "create_change_tables", "mark_jobs_started", "schedule_jobs",
            "publish_batch_events", "read_ready_heads"} <= names


@pytest.mark.parametrize("path", GUARDED, ids=lambda p: p.stem)
def test_a_kept_table_is_made_again_when_its_definition_changes(path) -> None:
    """The version is the hash of the CREATE statements, set only once they all succeeded: a connection
    holding tables of another definition makes them again."""
    for match in GUARD.finditer(_code(path)):
        variable, version, make = match.group(2), match.group(3), match.group("make")
        assert version == _version(make), f"{path.name}: @{variable}'s version is not {_version(make)}"
        assert re.match(rf"\s*SET\s+@{variable}\s*=\s*NULL\s*;", make, re.IGNORECASE), (
            f"{path.name}: @{variable} is not cleared before the tables are made")
        assert re.search(rf"SET\s+@{variable}\s*=\s*'{version}'\s*;\s*$", make, re.IGNORECASE), (
            f"{path.name}: @{variable} is not set last")


@pytest.mark.parametrize("path", GUARDED, ids=lambda p: p.stem)
def test_a_kept_table_is_emptied_without_committing_and_without_leaving_rows(path) -> None:
    """TRUNCATE only with no transaction open; DELETE only of a MEMORY table; every table made is emptied."""
    for match in GUARD.finditer(_code(path)):
        empty, make = match.group("empty"), match.group("make")
        made = {m.group(2): m.end() for m in CREATE.finditer(make)}
        engines = {name: re.match(r"[^;]*?\)\s*ENGINE\s*=\s*(\w+)", make[end:], re.DOTALL) for name, end in made.items()}
        truncated = set(re.findall(r"TRUNCATE\s+TABLE\s+(\w+)\s*;", empty, re.IGNORECASE))
        deleted = set(re.findall(r"DELETE\s+FROM\s+(\w+)\s*;", empty, re.IGNORECASE))
        assert truncated | deleted == set(made), f"{path.name}: emptied {truncated | deleted}, made {set(made)}"
        if truncated:
            assert match.group(1), f"{path.name}: TRUNCATE without checking that no transaction is open"
        for name in deleted:
            engine = engines[name]
            assert engine and engine.group(1).upper() == "MEMORY", f"{path.name}: {name} is emptied with DELETE"


def test_a_kept_table_is_dropped_nowhere_else() -> None:
    """A table dropped behind the version's back would be missing on the connection's next call."""
    kept = {m.group(2): path for path in GUARDED for g in GUARD.finditer(_code(path))
            for m in CREATE.finditer(g.group("make"))}
    for path in ROUTINES:
        code = _code(path)
        outside = GUARD.sub("", code) if path in GUARDED else code
        for name in re.findall(r"DROP\s+TEMPORARY\s+TABLE\s+(?:IF\s+EXISTS\s+)?(\w+)", outside, re.IGNORECASE):
            assert name not in kept, f"{path.name} drops {name}, which {kept[name].name} keeps"
        assert not re.search(r"TRUNCATE", outside, re.IGNORECASE), f"{path.name}: TRUNCATE outside a guarded block"
