"""Where code may reach: the frontend and the driver share only what lives
below both (services.policy, services.db, services.common), the policy
package stays pure (no I/O, nothing of corral's services but itself), the
client package (`corral/`: client, CLI, generated code) imports nothing
of the server's (`services`), so that it can be installed alone, no two
packages import each other (however many steps apart), and every part of
the server is a package (no loose module at the top of services/).

Read from the sources' import statements, including imports inside
functions, so a late `import` cannot slip past; nothing is imported."""

from __future__ import annotations

import ast
import itertools
import tomllib
from collections.abc import Iterable, Mapping
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


# The graph between packages: each subpackage of services/ (services.common, services.db, services.up, ...) and the
# client package `corral` is a node; a module of one importing a module of another is an edge.


def module_of(path: Path) -> str:
    """`services/db/database.py` -> `services.db.database`; a package's `__init__.py` is the package."""
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for each import of the file (or of `source`, as if it were the file) at any depth,
    relative ones made absolute; `from X import a` counts as both X and X.a (a may be a module: `from
    services import up`)."""
    module = module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names if alias.name != "*"]
    return found


def package_of(module: str) -> str | None:
    """The node a module belongs to: `corral`, `services.NAME` (a subpackage, or a loose module at the top of
    services/), or None for anything else (the standard library, third parties, `services` itself)."""
    parts = module.split(".")
    if parts[0] == "corral":
        return "corral"
    if parts[0] == "services" and len(parts) > 1:
        return f"services.{parts[1]}"
    return None


def package_graph() -> dict[str, dict[str, list[str]]]:
    """Package -> package it imports -> the imports that make the edge (`path:line name`)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for root in (SERVICES, REPO / "corral"):
        for path in sorted(root.rglob("*.py")):
            source = package_of(module_of(path))
            if source is None:  # services/__init__.py, were there one: the namespace, no package of its own
                continue
            edges = graph.setdefault(source, {})
            for line, name in imported_names(path):
                target = package_of(name)
                where = f"{path.relative_to(REPO)}:{line}"
                if target is not None and target != source and not any(
                        seen.startswith(where + " ") for seen in edges.get(target, ())):  # a statement once
                    edges.setdefault(target, []).append(f"{where} imports {name}")
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of the graph as [a, b, ..., a], or None if it has none (depth first, in name order)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node):], node]
        if node in done:
            return None
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            if (cycle := visit(successor)) is not None:
                return cycle
        path.pop()
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := visit(node)) is not None), None)


KNOWN_CYCLES: list[list[str]] = []
"""Package cycles known and not yet broken, each as `find_cycle` reports it (none: keep it so)."""


def test_no_cycle_between_packages() -> None:
    """Each package sits above the ones it imports: services.common lowest, then services.db, ...; a cycle
    means neither can be understood, tested or installed without the other."""
    graph = package_graph()
    assert {"corral", "services.common", "services.db", "services.driver", "services.frontend",
            "services.up"} <= graph.keys()
    edges = {source: set(targets) for source, targets in graph.items()}
    for cycle in KNOWN_CYCLES:
        for source, target in itertools.pairwise(cycle):
            edges[source].discard(target)
    cycle = find_cycle(edges)
    assert cycle is None, "packages import each other: " + " -> ".join(cycle) + "\n" + "\n".join(
        f"  {line}" for source, target in itertools.pairwise(cycle) for line in graph[source][target])


def test_the_cycle_check_sees_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "d": {"a", "c"}}) is None


def test_relative_and_from_imports_are_resolved() -> None:
    """`from . import x`, `from ..db import y` and `from services import up` all name the module they reach."""
    path = SERVICES / "up" / "example.py"  # never written: only its name places the source
    source = "def f():\n    from . import ports\n    from ..db.database import Database\nfrom services import registry\n"
    names = {name for _, name in imported_names(path, source)}
    assert {"services.up.ports", "services.db.database", "services.registry"} <= names
    assert {package_of(name) for name in names} - {None} == {"services.up", "services.db", "services.registry"}


def test_no_loose_modules_at_the_top_of_services() -> None:
    """Every part of the server is a package of its own (services/NAME/), `corral up` and `corral db` included."""
    assert sorted(path.name for path in SERVICES.glob("*.py") if path.name != "__init__.py") == []


def test_the_servers_commands_join_the_cli_by_entry_point() -> None:
    """`corral up` and `corral db` reach the CLI as `corral.commands` entry points, not imports (the client
    package imports nothing of the server's): each names a module that exists and defines add_commands."""
    commands = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["corral.commands"]
    assert commands == {"db": "services.db.cli:add_commands", "up": "services.up.cli:add_commands"}
    for target in commands.values():
        module, function = target.split(":")
        path = REPO / (module.replace(".", "/") + ".py")
        defined = {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}
        assert function in defined, target
