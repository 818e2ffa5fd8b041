"""The services and the client never call `asyncio.wait_for`: on Python 3.11 it swallows a
cancellation that arrives as what it waits for completes (CPython gh-86296). A cancelled job's
container ran on that way, and a server's stop() waited forever for its health watch
(tests/service/test_server_stop.py). `async with asyncio.timeout(...)` does not."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def wait_for_calls(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "wait_for"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio"):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_no_service_or_client_code_calls_asyncio_wait_for() -> None:
    assert wait_for_calls(REPO / "services") + wait_for_calls(REPO / "corral") == []


def test_the_check_finds_a_call(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import asyncio\nasync def f(x):\n    return await asyncio.wait_for(x, 1)\n")
    assert wait_for_calls(tmp_path) == [f"{tmp_path.name}/m.py:3"]
