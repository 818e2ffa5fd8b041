"""The driver reaches the database only through its store (services/driver/store/).

Every SQL statement and procedure call of the driver is a named method of
`DriverStore`; the loops and servicers call those and hold no pool. Read
from the sources with `ast`, so that SQL written anywhere else in
`services/driver/` fails here:

- a string (or the literal start of an f-string) that begins with a SQL
  statement's keyword;
- a call of a database helper that takes SQL or a procedure's name
  (`execute`, `executemany`, `callproc`, `fetchall`, `fetchone`, `call`,
  `retrying`), or of the planner's snapshot reads, which take a pool;
- an import of the pool (`Database`), of the procedure layer under the store
  (`JobStore`), of the snapshot reads or of a MySQL driver. The wiring
  (`app.py`) opens the pool and hands it to the store, so it alone may name
  `Database`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "services" / "driver"
STORE = DRIVER / "store"
WIRING = DRIVER / "app.py"

_SQL_START = re.compile(r"^\s*\(?\s*(SELECT|INSERT|UPDATE|DELETE|CALL|REPLACE|WITH|SET|START\s+TRANSACTION)\s+\S")
_SQL_HELPERS = frozenset({"execute", "executemany", "callproc", "fetchall", "fetchone", "call", "retrying"})
_FORBIDDEN_MODULES = ("aiomysql", "pymysql", "services.db.plan_snapshot")
_FORBIDDEN_NAMES = {"services.db.database": {"Database"}, "services.db.store": {"JobStore"}}


def _string_start(node: ast.AST) -> str | None:
    """The literal text a string node starts with (an f-string: up to its first placeholder)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value + ("{…}" if len(node.values) > 1 else "")  # f"UPDATE {table} …" starts a statement
    return None


def violations(source: str, filename: str, may_name_database: bool = False) -> list[str]:
    """What in `source` reaches the database other than through the driver's store."""
    found = []
    tree = ast.parse(source, filename)
    # An f-string's parts after its first placeholder are not where a statement starts.
    inner = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', '?')}"
        text = None if id(node) in inner else _string_start(node)
        if text is not None and _SQL_START.match(text):
            found.append(f"{where}: SQL {text.strip().splitlines()[0][:60]!r}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _SQL_HELPERS:
            found.append(f"{where}: calls .{node.func.attr}()")
        elif isinstance(node, ast.Import):
            found += [f"{where}: imports {a.name}" for a in node.names
                      if any(a.name == m or a.name.startswith(m + ".") for m in _FORBIDDEN_MODULES)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any(node.module == m or node.module.startswith(m + ".") for m in _FORBIDDEN_MODULES):
                found.append(f"{where}: imports {node.module}")
            names = _FORBIDDEN_NAMES.get(node.module, set()) - ({"Database"} if may_name_database else set())
            found += [f"{where}: imports {node.module}.{a.name}" for a in node.names if a.name in names]
    return found


def test_only_the_store_holds_sql() -> None:
    modules = [p for p in sorted(DRIVER.rglob("*.py")) if STORE not in p.parents]
    assert len(modules) > 30  # the loops, servicers, providers and pricing are all read
    found = [v for path in modules
             for v in violations(path.read_text(), str(path.relative_to(REPO)), may_name_database=path == WIRING)]
    assert found == []


def test_the_store_holds_the_driver_sql() -> None:
    """The store is where the SQL went (so the test above is not passing on an empty driver)."""
    store_sql = [v for path in sorted(STORE.rglob("*.py"))
                 for v in violations(path.read_text(), str(path.relative_to(REPO)))]
    assert len(store_sql) > 20


def test_the_check_sees_sql_written_elsewhere() -> None:
    """Each kind of offence is found, so the boundary test can fail."""
    source = '''
from services.db.database import Database, NotFoundError
from services.db.plan_snapshot import read_demand
import pymysql
QUERY = """
SELECT name FROM instances"""
async def f(db, store, table):
    await db.fetchall(f"UPDATE {table} SET x = 1")
    await db.call("schedule_jobs", 1)
    await store.cancel_ready_jobs(1, 2, 3)  # a store's method: fine
    return "Select a region"  # prose: fine
'''
    found = violations(source, "m.py")
    assert sorted(v.split(": ", 1)[1] for v in found) == sorted([
        "imports services.db.database.Database", "imports services.db.plan_snapshot", "imports pymysql",
        "SQL 'SELECT name FROM instances'", "calls .fetchall()", "SQL 'UPDATE {…}'", "calls .call()",
    ])
    assert violations("from services.db.database import Database\n", "app.py", may_name_database=True) == []
