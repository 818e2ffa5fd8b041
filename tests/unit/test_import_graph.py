"""Where code may reach: the frontend and the driver share only what lives
below both (services.policy, services.db, services.common), the policy
package stays pure (no I/O, nothing of corral's services but itself), and
the client package (`corral/`: client, CLI, generated code) imports nothing
of the server's (`services`), so that it can be installed alone.

Read from the sources' import statements, including imports inside
functions, so a late `import` cannot slip past."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "services"


def imports_of(package: str, root: Path = SERVICES) -> dict[str, set[str]]:
    """Every module each file of `root/<package>` imports, by file."""
    found: dict[str, set[str]] = {}
    for path in sorted((root / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
        found[str(path.relative_to(REPO))] = names
    return found


def offenders(package: str, forbidden: tuple[str, ...], root: Path = SERVICES) -> list[str]:
    return [f"{path} imports {name}" for path, names in imports_of(package, root).items() for name in sorted(names)
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


@pytest.mark.parametrize(("package", "forbidden"), [
    ("frontend", ("services.driver", "services.worker")),
    ("driver", ("services.frontend", "services.worker")),
    ("policy", ("services.driver", "services.frontend", "services.worker", "services.auth", "services.db",
                "services.common", "asyncio", "aiomysql", "pymysql", "grpc", "fsspec", "socket", "subprocess",
                "time", "random", "secrets")),
])
def test_no_forbidden_imports(package: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(package, forbidden) == []


def test_the_client_package_imports_nothing_of_the_server() -> None:
    assert len(imports_of("corral", REPO)) > 20  # the client, the CLI and the generated code are all read
    assert offenders("corral", ("services",), REPO) == []


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    """The parser finds imports at any depth, so the test above can fail."""
    source = "def f():\n    from services.driver.scheduler import Placement\n    import asyncio\n"
    names = {n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
             for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert names == {"services.driver.scheduler", "asyncio"}
