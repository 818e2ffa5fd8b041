"""The map stays true: docs/architecture.md names every package, names no path that is not there, and
stays short; and every link to a heading of the docs finds its heading.

- A package is a folder with an `__init__.py` under `services/` or `corral/`. The map names it as its
  path in backticks with a trailing slash (`services/driver/`). A folder that holds nothing but
  subpackages (`corral/batch/`, which only holds `v1/`) is named through them.
- A path in backticks that starts with a folder of the repository (`services/...`, `corral/...`,
  `sql/...`, ...) must exist, on the map and on every page of docs/ and the README, so a moved or
  renamed module is caught where the docs still name it.
- A relative link with an anchor (`engine.md#lock-order`, `#networks`) must name a page that exists and
  a heading on it, by GitHub's rule for heading ids.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "architecture.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MAP_MAX_LINES = 170
"""The hard limit; the map aims at about 150 lines. Longer explanations go to a topic page."""
PACKAGE_ROOTS = ("services", "corral")
CHECKED_ROOTS = ("services", "corral", "sql", "tests", "protos", "envoy", "helm", "scripts", "faults")
"""Folders whose paths, when the docs name them in backticks, must exist (not bench/: its results/ folder
is made by a run)."""
PENDING: frozenset[str] = frozenset()
"""Paths the map names ahead of the changes that make them. Absent, they are not an error; once they exist, `test_pending_paths_are_still_pending` asks for their removal
from here, so that from then on they are checked like any other."""

_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.M)
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^)\s]+)\)")
_HTML_ID = re.compile(r"<a\s[^>]*(?:name|id)=\"([^\"]+)\"", re.I)


def _without_code_blocks(text: str) -> str:
    """The text with fenced blocks blanked (their lines kept), so nothing inside them counts."""
    return _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def packages(root: Path = REPO) -> list[str]:
    """Every package under services/ and corral/, as 'services/driver/', sorted."""
    found = []
    for top in PACKAGE_ROOTS:
        for init in sorted((root / top).rglob("__init__.py")):
            if "__pycache__" not in init.parts and not any(p.startswith(".") for p in init.relative_to(root).parts):
                found.append(init.parent.relative_to(root).as_posix() + "/")
    return found


def named_paths(text: str, roots: tuple[str, ...] = CHECKED_ROOTS) -> set[str]:
    """Every path in backticks that starts with one of `roots`, as written (globs and placeholders left out)."""
    names = set()
    for span in _CODE_SPAN.findall(text):
        for word in span.split():
            word = word.split(":", 1)[0].rstrip(".,;)")  # `file.py:name`, `test.py::test`: the file
            if word.split("/", 1)[0] in roots and "/" in word and not re.search(r"[*?{}<>]|\bNAME\b", word):
                names.add(word)
    return names


def unnamed_packages(map_text: str, root: Path = REPO) -> list[str]:
    """The packages the map does not name."""
    named = named_paths(map_text, PACKAGE_ROOTS)
    all_packages = packages(root)

    def is_named(package: str) -> bool:
        if package in named:
            return True
        holds = [p for p in (root / package).iterdir() if p.name not in ("__init__.py", "__pycache__")]
        subpackages = [p for p in holds if (p / "__init__.py").exists()]
        return bool(holds) and holds == subpackages and all(
            is_named(s.relative_to(root).as_posix() + "/") for s in subpackages)

    return [p for p in all_packages if not is_named(p)]


def missing_paths(text: str, root: Path = REPO, pending: frozenset[str] = PENDING) -> list[str]:
    """The paths `text` names that do not exist (pending ones and what is under them excepted)."""
    return sorted(p for p in named_paths(text) if not (root / p).exists()
                  and not any(p == q or p.startswith(q) for q in pending))


def slug(heading: str) -> str:
    """A heading's id as GitHub makes it: the text as shown, lower case, without punctuation but
    hyphens and underscores, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links and images: their text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The ids of a page's headings (a repeated one gets -1, -2, ...), and its explicit HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    body = _without_code_blocks(text)
    for match in _HEADING.finditer(body):
        base = slug(match.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found | set(_HTML_ID.findall(body))


def broken_anchors(page: Path, root: Path = REPO) -> list[str]:
    """Each relative link of `page` with an anchor whose page or heading is not there."""
    broken = []
    text = page.read_text()
    body = _without_code_blocks(text)
    for match in _LINK.finditer(body):
        target = match.group(1)
        if "#" not in target or re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue
        file, anchor = target.split("#", 1)
        linked = (page.parent / file).resolve() if file else page
        line = body.count("\n", 0, match.start()) + 1
        where = f"{page.relative_to(root)}:{line}: {target}"
        if not linked.exists():
            broken.append(f"{where}: no page {file}")
        elif linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            broken.append(f"{where}: no heading #{anchor} on {linked.relative_to(root)}")
    return broken


def test_the_map_names_every_package() -> None:
    missing = unnamed_packages(MAP.read_text())
    assert missing == [], f"docs/architecture.md does not name these packages (add a line each): {missing}"


def test_the_map_names_only_paths_that_exist() -> None:
    assert missing_paths(MAP.read_text()) == []


def test_the_map_is_short() -> None:
    n_lines = len(MAP.read_text().splitlines())
    assert n_lines <= MAP_MAX_LINES, f"the map has {n_lines} lines: move the explanation to a topic page"


def test_pending_paths_are_still_pending() -> None:
    arrived = sorted(p for p in PENDING if (REPO / p).exists())
    assert arrived == [], f"{arrived} exist now: remove them from PENDING, so that they are checked"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_the_docs_name_only_paths_that_exist(page: Path) -> None:
    assert missing_paths(page.read_text()) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_link_to_a_heading_finds_it(page: Path) -> None:
    assert broken_anchors(page) == []


def test_slugs_are_githubs() -> None:
    assert slug("The gateways (`--gateway`)") == "the-gateways---gateway"
    assert slug("Prices: the price file and the clouds' catalogues") == (
        "prices-the-price-file-and-the-clouds-catalogues")
    assert slug("On Kubernetes: `helm/corral`") == "on-kubernetes-helmcorral"
    assert slug("Keys, accounts and files: each process holds only what it needs") == (
        "keys-accounts-and-files-each-process-holds-only-what-it-needs")
    assert slug("Images: where a job's image may come from") == "images-where-a-jobs-image-may-come-from"
    assert slug("See [the map](architecture.md) & *more*") == "see-the-map--more"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n### A\n") == {"a", "a-1", "a-2"}


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """Each check finds what it is there to find, on a small made-up repository."""
    for package in ("services/alpha", "services/beta/inner", "corral/gen/v1"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "services/beta/__init__.py").write_text("")
    (tmp_path / "services/beta/module.py").write_text("")
    (tmp_path / "corral/__init__.py").write_text("")
    (tmp_path / "corral/gen/__init__.py").write_text("")
    the_map = "| `services/alpha/` | a |\n| `corral/` | the client |\n| `corral/gen/v1/` | generated |\n"
    # services/beta/ holds a module, so naming its subpackage does not name it; corral/gen/ only holds v1/.
    assert unnamed_packages(the_map + "`services/beta/inner/`", tmp_path) == ["services/beta/"]
    assert unnamed_packages(the_map + "`services/beta/` `services/beta/inner/`", tmp_path) == []
    named = "`services/alpha/` `services/gone.py`, `services/up/cli.py` `corral up` `services/alpha/:x`"
    assert missing_paths(named, tmp_path, frozenset({"services/up/"})) == ["services/gone.py"]
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# A page\n\n## Its part\n\n[ok](b.md#b-part) [bad](b.md#no-such) [self](#its-part)\n"
                               "[lost](#nowhere) [none](c.md#x) [web](https://example.com/#x)\n"
                               "```\n[in code](b.md#in-code)\n```\n")
    (docs / "b.md").write_text("# B\n\n## B part\n")
    assert broken_anchors(docs / "a.md", tmp_path) == [
        "docs/a.md:5: b.md#no-such: no heading #no-such on docs/b.md",
        "docs/a.md:6: #nowhere: no heading #nowhere on docs/a.md",
        "docs/a.md:6: c.md#x: no page c.md",
    ]
