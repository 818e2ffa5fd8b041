"""Expand, then contract: a migration that removes a name comes a release after the code stopped using it.

During an upgrade the previous release's processes still run while the new
release's migrations are applied (`corral up` stops them first, but on
Kubernetes the pods are replaced one at a time), so the schema a migration
leaves must still serve the previous release's code. Adding is always
safe; removing is safe only once no running code names what goes. The
check: for every migration that drops or renames a table, a view or a
column, the release before the migration (the parent of the commit that
added it) must not name it anywhere in its code (`services/`, `corral/`,
the procedures and triggers). A change that stops using a column and drops
it in the same release fails; the same drop one release later passes.

Other changes that narrow the schema (an ENUM losing a value, a column made
NOT NULL or shorter) are not parsed here; docs/operations.md lists them for
review.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

from services.db.sqlfile import split_statements

CODE_PATHS = ("services", "corral", "sql/procedures", "sql/triggers")
"""Where the code that names tables and columns lives."""

_NAME = r"`?(\w+)`?"
_DROP_TABLE = re.compile(rf"^\s*DROP\s+(?:TEMPORARY\s+)?(TABLE|VIEW)\s+(?:IF\s+EXISTS\s+)?((?:{_NAME}\s*,\s*)*{_NAME})",
                         re.IGNORECASE)
_RENAME_TABLE = re.compile(rf"^\s*RENAME\s+TABLE\s+{_NAME}\s+TO\b", re.IGNORECASE)
_ALTER = re.compile(rf"^\s*ALTER\s+(?:ONLINE\s+|IGNORE\s+)*TABLE\s+{_NAME}\s+(.*)$", re.IGNORECASE | re.DOTALL)
_ALTER_DROPS = re.compile(
    rf"(?:^|,)\s*(?:DROP\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?(?!INDEX\b|KEY\b|FOREIGN\b|PRIMARY\b|CONSTRAINT\b|"
    rf"CHECK\b|PARTITION\b){_NAME}|CHANGE\s+(?:COLUMN\s+)?(?:IF\s+EXISTS\s+)?{_NAME}\s+{_NAME}|"
    rf"RENAME\s+COLUMN\s+{_NAME}\s+TO|RENAME\s+(?!COLUMN\b|INDEX\b|KEY\b)(?:TO\s+|AS\s+)?{_NAME}())",
    re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class Removal:
    """A name a migration takes away."""

    kind: str
    """'table', 'view' or 'column'."""
    name: str
    table: str = ""
    """The column's table."""


def removals(sql: str) -> list[Removal]:
    """What the statements of `sql` drop or rename (a column changed under the same name is not a removal)."""
    found: list[Removal] = []
    for statement in split_statements(sql):
        text = re.sub(r"--[^\n]*|/\*.*?\*/", " ", statement, flags=re.DOTALL).strip()
        if match := _DROP_TABLE.match(text):
            names = [n.strip(" `") for n in match.group(2).split(",")]
            found += [Removal(match.group(1).lower(), name) for name in names]
        elif match := _RENAME_TABLE.match(text):
            found.append(Removal("table", match.group(1)))
        elif match := _ALTER.match(text):
            table = match.group(1)
            for drop, old, new, renamed_column, renamed_table, _ in _ALTER_DROPS.findall(match.group(2)):
                if drop:
                    found.append(Removal("column", drop, table))
                elif old and old.lower() != new.lower():
                    found.append(Removal("column", old, table))
                elif renamed_column:
                    found.append(Removal("column", renamed_column, table))
                elif renamed_table:
                    found.append(Removal("table", table))
    return found


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def names_in_code(repo: Path, rev: str, name: str) -> list[str]:
    """Files of `rev`'s code that name `name` as a word."""
    done = subprocess.run(["git", "grep", "-l", "-w", "-i", "-F", name, rev, "--", *CODE_PATHS], cwd=repo,
                          capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"git grep failed: {done.stderr.strip()}")
    return [line.partition(":")[2] for line in done.stdout.splitlines()]


def violations(repo: Path, migrations: str = "sql/migrations") -> list[str]:
    """Each migration's removal of a name the release before it still used, said in a line."""
    problems = []
    for path in sorted((repo / migrations).glob("*.sql")):
        found = removals(path.read_text())
        if not found:
            continue
        relative = path.relative_to(repo).as_posix()
        added = _git(repo, "log", "--diff-filter=A", "--format=%H", "--", relative).split()
        if not added:  # not committed yet: the release before it is what is committed now
            before = "HEAD"
        else:
            parents = _git(repo, "log", "-1", "--format=%P", added[-1]).split()
            if not parents:
                continue  # the first commit: nothing ran before it
            before = parents[0]
        for removal in found:
            if users := names_in_code(repo, before, removal.name):
                what = f"{removal.kind} {removal.table + '.' if removal.table else ''}{removal.name}"
                problems.append(f"{path.name} removes {what}, which the release before it still names "
                                f"({', '.join(users[:3])}): stop using it in one release, remove it in a later one")
    return problems
