"""Expand, then contract (services/db/migration_rules.py): what a migration removes, read from its SQL, and
the check that a removal comes a release after the code stopped naming it, on a git repository of the
test's own and on this one."""

from __future__ import annotations

import subprocess
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from services.db.migration_rules import Removal, removals, violations

REPO = Path(__file__).resolve().parents[2]

names = st.from_regex(r"[a-z][a-z0-9_]{0,20}", fullmatch=True).filter(
    lambda n: n.upper() not in {"COLUMN", "INDEX", "KEY", "IF", "TO", "AS", "FOREIGN", "PRIMARY", "CONSTRAINT",
                                "CHECK", "PARTITION", "TABLE", "VIEW", "TEMPORARY"})


def test_each_kind_of_removal_is_read_and_nothing_else() -> None:
    assert removals("DROP TABLE IF EXISTS a, `b`;") == [Removal("table", "a"), Removal("table", "b")]
    assert removals("DROP VIEW v;") == [Removal("view", "v")]
    assert removals("RENAME TABLE x TO y;") == [Removal("table", "x")]
    assert removals("ALTER TABLE t RENAME TO u;") == [Removal("table", "t")]
    assert removals("ALTER TABLE t DROP COLUMN c, ADD COLUMN d INT;") == [Removal("column", "c", "t")]
    assert removals("ALTER TABLE t DROP FOREIGN KEY f, DROP IF EXISTS g;") == [Removal("column", "g", "t")]
    assert removals("ALTER TABLE t CHANGE a b INT;") == [Removal("column", "a", "t")]
    assert removals("ALTER TABLE t RENAME COLUMN a TO b;") == [Removal("column", "a", "t")]
    for harmless in ("CREATE TABLE t (a INT);", "ALTER TABLE t ADD COLUMN drop_count INT;",
                     "ALTER TABLE t DROP INDEX i, DROP PRIMARY KEY;", "ALTER TABLE t CHANGE COLUMN a a BIGINT;",
                     "ALTER TABLE t RENAME INDEX i TO j;", "ALTER TABLE t ADD COLUMN x INT; -- DROP TABLE t",
                     "/* DROP TABLE t; */ SELECT 1;", "INSERT INTO t VALUES ('DROP TABLE u');"):
        assert removals(harmless) == [], harmless


@given(st.lists(st.tuples(names, st.lists(names, min_size=1, max_size=4), st.lists(names, max_size=3)),
                min_size=1, max_size=5))
def test_every_dropped_column_is_found_among_added_ones(alters: list[tuple[str, list[str], list[str]]]) -> None:
    sql = "\n".join(f"ALTER TABLE `{table}` " + ", ".join(
        [f"ADD COLUMN `{a}` INT NOT NULL DEFAULT 0" for a in added] + [f"DROP COLUMN `{d}`" for d in dropped]) + ";"
        for table, added, dropped in alters)
    assert removals(sql) == [Removal("column", d, table) for table, _, dropped in alters for d in dropped]


def _commit(repo: Path, files: dict[str, str | None], message: str) -> None:
    for name, text in files.items():
        path = repo / name
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    subprocess.run(["git", "add", "-A"], cwd=repo, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-qm", message],
                   cwd=repo, check=True)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    _commit(repo, {"sql/migrations/0001_schema.sql": "CREATE TABLE jobs (id INT, legacy_flag INT);",
                   "services/store.py": "QUERY = 'SELECT id, legacy_flag FROM jobs'\n"}, "the first release")
    return repo


DROP = {"sql/migrations/0002_drop_legacy.sql": "ALTER TABLE jobs DROP COLUMN legacy_flag;"}


def test_a_drop_in_the_release_that_stops_using_the_column_fails(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    _commit(repo, {"services/store.py": "QUERY = 'SELECT id FROM jobs'\n", **DROP}, "stop using it and drop it")
    [problem] = violations(repo)
    assert problem.startswith("0002_drop_legacy.sql removes column jobs.legacy_flag, which the release before it "
                              "still names (services/store.py)")


def test_the_same_drop_a_release_later_passes(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    _commit(repo, {"services/store.py": "QUERY = 'SELECT id FROM jobs'\n"}, "stop using it")
    assert violations(repo) == []
    _commit(repo, DROP, "then drop it")
    assert violations(repo) == []


def test_a_drop_not_committed_yet_is_checked_against_what_is(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    (repo / "sql/migrations/0002_drop_legacy.sql").write_text(DROP["sql/migrations/0002_drop_legacy.sql"])
    assert len(violations(repo)) == 1


def test_this_repositorys_migrations_only_expand_or_contract_a_release_late() -> None:
    assert violations(REPO) == []
