"""The small charts (services/web/drawing/charts.py): safe, accessible markup, round ticks, a legend,
and the same data as a table; and the drawing package's boundary (the standard library and itself)."""

from __future__ import annotations

import ast
import calendar
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from services.web.drawing.charts import Series, bar_chart, bar_table, line_chart, line_table
from services.web.drawing.svg import nice_ticks, standalone
from tests.examples import examples
from tests.unit.web.svg_checks import SVG, as_shown, parsed, texts

REPO = Path(__file__).resolve().parents[3]
T0 = float(calendar.timegm((2026, 11, 29, 10, 0, 0)))
NAMES = st.text(max_size=20) | st.sampled_from(('<script>x</script>', 'a & "b"', "it's"))
VALUES = st.floats(-1e9, 1e9, allow_nan=False)


def cores(v: float) -> str:
    return f"{v:g} cores"


def dollars(v: float) -> str:
    return f"${v:,.2f}"


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(NAMES, st.lists(st.tuples(st.floats(0, 1e6), VALUES), max_size=30)), max_size=10))
def test_line_charts_are_safe_and_complete(raw: list[tuple[str, list[tuple[float, float]]]]) -> None:
    series = [Series(name, [(T0 + x, y) for x, y in sorted(points)]) for name, points in raw]
    svg = line_chart(series, title="CPU <of> job & 7", y_label="cores", y_format=cores)
    root = parsed(svg)
    assert root.find(f"{SVG}title").text == "CPU <of> job & 7"
    if any(s.points for s in series):
        legend = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
        assert [t.text or "" for t in legend.iter(f"{SVG}text")] == [as_shown(s.name) for s in series]
        assert len([e for e in root.iter() if "series" in (e.get("class") or "").split()]) == \
            len(series) + sum(1 for s in series if s.points)
    table = line_table(series, title="CPU", y_label="cores", y_format=cores)
    assert len(table.rows) == sum(len(s.points) for s in series)
    assert line_chart(series, title="CPU <of> job & 7", y_label="cores", y_format=cores) == svg


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(NAMES, VALUES), max_size=30))
def test_bar_charts_are_safe_and_complete(bars: list[tuple[str, float]]) -> None:
    svg = bar_chart(bars, title="Spend per user", y_format=dollars)
    root = parsed(svg)
    rows = [g for g in root.iter(f"{SVG}g") if g.get("class") == "bar-row"]
    assert [g.find(f"{SVG}title").text for g in rows] == [as_shown(f"{label}: {dollars(v)}") for label, v in bars]
    assert len(list(root.iter(f"{SVG}rect"))) == len(bars)
    assert bar_table(bars, title="Spend per user", y_format=dollars, label_name="user").rows == \
        tuple((label, dollars(v)) for label, v in bars)


def test_a_line_chart_reads_as_text_too() -> None:
    series = [Series("CPU used", [(T0, 0.5), (T0 + 60, 1.75), (T0 + 120, 1.0)]), Series("limit", [(T0, 2.0)])]
    svg = line_chart(series, title="CPU of job 12", y_label="cores", y_format=cores)
    root = parsed(svg)
    assert root.find(f"{SVG}desc").text == (
        "cores over time. CPU used: 3 points, from 0.5 cores to 1.75 cores, last 1 cores; "
        "limit: 1 point, from 2 cores to 2 cores, last 2 cores.")
    axis = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "axis")
    labels = [t.text for t in axis.iter(f"{SVG}text")]
    assert labels[:5] == ["0 cores", "0.5 cores", "1 cores", "1.5 cores", "2 cores"]
    assert labels[5:-1] == ["10:00:00", "10:00:30", "10:01:00", "10:01:30", "10:02:00"]
    assert labels[-1] == "cores"
    assert line_table(series, title="CPU of job 12", y_label="cores", y_format=cores).rows[:2] == (
        ("CPU used", "10:00:00", "0.5 cores"), ("CPU used", "10:01:00", "1.75 cores"))


def test_a_bar_chart_sums_up_in_its_description() -> None:
    svg = bar_chart([("2026-11-27", 3.5), ("2026-11-28", 12.0), ("2026-11-29", 0.0)], title="Spend per day",
                    y_format=dollars)
    root = parsed(svg)
    assert root.find(f"{SVG}desc").text == "3 bars, $15.50 in all; the largest 2026-11-28, $12.00."
    assert "$12.00" in texts(root)


def test_no_data() -> None:
    for svg in (line_chart([], title="t", y_label="y", y_format=str), line_chart([Series("a", [])], title="t",
                y_label="y", y_format=str), bar_chart([], title="t", y_format=str)):
        assert "No data." in texts(parsed(svg))


@settings(max_examples=examples(500))
@given(VALUES, VALUES, st.integers(1, 10))
def test_nice_ticks_cover_the_range_in_round_steps(a: float, b: float, most: int) -> None:
    low, high = sorted((a, b))
    ticks = nice_ticks(low, high, most)
    assert ticks[0] <= low and ticks[-1] >= high
    steps = {round(y - x, 6) for x, y in zip(ticks, ticks[1:])}
    assert len(steps) == 1
    assert len(ticks) <= most + 3


def test_the_drawing_package_imports_only_the_standard_library_and_itself() -> None:
    found = set()
    for path in sorted((REPO / "services" / "web" / "drawing").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
    assert len(found) > 5
    outside = {m for m in found if m.split(".")[0] not in sys.stdlib_module_names
               and not m.startswith("services.web.drawing")}
    assert outside == set()


def test_a_standalone_drawing_links_its_stylesheet() -> None:
    svg = bar_chart([("a", 1.0)], title="t", y_format=str)
    document = standalone(svg, '/static/drawing.css?v="1"&x')
    assert document.startswith('<?xml version="1.0" encoding="UTF-8"?>\n'
                               '<?xml-stylesheet type="text/css" href="/static/drawing.css?v=&quot;1&quot;&amp;x"?>\n')
    assert parsed(document.encode()).get("role") == "img"
