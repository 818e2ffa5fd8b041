"""Small charts as SVG markup: lines over time (a job's CPU and memory) and bars (spend per day, per user).

Each chart has axes with round ticks, a legend in words, role="img" with a <title> and a <desc> that
sums the data up; `line_table` and `bar_table` give the same data as rows, which the page renders as a
visually hidden table for screen readers. Series are told apart by colour class and dash pattern.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

from services.web.drawing.clock import clock, time_ticks
from services.web.drawing.svg import document, nice_ticks, num, plural, shorten, text

WIDTH_PT, HEIGHT_PT = 640.0, 240.0
LEFT_PT, RIGHT_PT, TOP_PT, BOTTOM_PT = 70.0, 16.0, 28.0, 34.0
LEGEND_ROW_PT = 16.0
SERIES_CLASSES = 8
"""drawing.css has series-0 … series-7; further series reuse them."""
BAR_ROW_PT, BAR_LABEL_PT = 20.0, 150.0


class Series(NamedTuple):
    """One line: its name and its (x, y) points, x ascending."""

    name: str
    points: Sequence[tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class Table:
    """A chart's data as text: a caption, the column names and the rows, every cell formatted."""

    caption: str
    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


def _no_data(kind: str, title: str) -> str:
    return document(kind=kind, width=WIDTH_PT, height=48, title=title, desc="No data.",
                    body=[f'<text x="8" y="18" class="label">{text(title)}</text>',
                          '<text x="8" y="38" class="note">No data.</text>'])


def line_chart(series: Sequence[Series], *, title: str, y_label: str, y_format: Callable[[float], str],
               x_format: Callable[[float], str] = clock, x_is_time: bool = True) -> str:
    """Lines of `series`. x is epoch seconds, ticked at round times (UTC) and labelled by `x_format`, unless
    `x_is_time` is False (then round numbers)."""
    points = [p for s in series for p in s.points]
    if not points:
        return _no_data("line-chart", title)
    x_low, x_high = min(x for x, _ in points), max(x for x, _ in points)
    if x_high == x_low:
        x_high = x_low + 1.0
    y_ticks = nice_ticks(min(0.0, min(y for _, y in points)), max(y for _, y in points))
    y_low, y_high = y_ticks[0], y_ticks[-1]
    x_ticks: Sequence[float] = (time_ticks(x_low, x_high, 6)[1] if x_is_time
                                else [t for t in nice_ticks(x_low, x_high) if x_low <= t <= x_high])
    plot_w = WIDTH_PT - LEFT_PT - RIGHT_PT
    plot_h = HEIGHT_PT - TOP_PT - BOTTOM_PT

    def px(x: float) -> str:
        return num(LEFT_PT + (x - x_low) / (x_high - x_low) * plot_w)

    def py(y: float) -> str:
        return num(TOP_PT + plot_h - (y - y_low) / (y_high - y_low) * plot_h)

    def at(x: float, y: float) -> str:
        return f"{px(x)},{py(y)}"

    bottom = TOP_PT + plot_h
    body = [f'<text x="{num(LEFT_PT)}" y="16" class="label">{text(title)}</text>', '<g class="grid">']
    body += [f'<line x1="{num(LEFT_PT)}" x2="{num(LEFT_PT + plot_w)}" y1="{py(t)}" y2="{py(t)}"/>' for t in y_ticks]
    body += ["</g>", '<g class="axis">',
             f'<path d="M{num(LEFT_PT)},{num(TOP_PT)}V{num(bottom)}H{num(LEFT_PT + plot_w)}" fill="none"/>']
    body += [f'<text x="{num(LEFT_PT - 6)}" y="{py(t)}" dy="4" text-anchor="end">{text(y_format(t))}</text>'
             for t in y_ticks]
    for t in x_ticks:
        x = px(t)
        body.append(f'<line x1="{x}" x2="{x}" y1="{num(bottom)}" y2="{num(bottom + 4)}"/>'
                    f'<text x="{x}" y="{num(bottom + 16)}" text-anchor="middle">{text(x_format(t))}</text>')
    label_y = TOP_PT + plot_h / 2
    body += [f'<text x="14" y="{num(label_y)}" transform="rotate(-90 14 {num(label_y)})" '
             f'text-anchor="middle">{text(y_label)}</text>', "</g>"]
    for i, s in enumerate(series):
        cls = f"series series-{i % SERIES_CLASSES}"
        if len(s.points) == 1:
            (x, y), = s.points
            body.append(f'<circle cx="{px(x)}" cy="{py(y)}" r="2.5" class="{cls}">'
                        f"<title>{text(s.name)}</title></circle>")
        elif s.points:
            body.append(f'<path d="M{"L".join(at(x, y) for x, y in s.points)}" class="{cls}">'
                        f"<title>{text(s.name)}</title></path>")
    legend_top = HEIGHT_PT
    body.append('<g class="legend">')
    for i, s in enumerate(series):
        y = legend_top + i * LEGEND_ROW_PT + 8
        body.append(f'<line x1="{num(LEFT_PT)}" x2="{num(LEFT_PT + 28)}" y1="{num(y)}" y2="{num(y)}" '
                    f'class="series series-{i % SERIES_CLASSES}"/>'
                    f'<text x="{num(LEFT_PT + 34)}" y="{num(y + 4)}">{text(s.name)}</text>')
    body.append("</g>")
    desc = "; ".join(_line_desc(s, y_format) for s in series)
    return document(kind="line-chart", width=WIDTH_PT, height=legend_top + len(series) * LEGEND_ROW_PT + 8,
                    title=title, desc=f"{y_label} over time. {desc}.", body=body)


def _line_desc(s: Series, y_format: Callable[[float], str]) -> str:
    if not s.points:
        return f"{s.name}: no points"
    ys = [y for _, y in s.points]
    return (f"{s.name}: {plural(len(ys), 'point')}, from {y_format(min(ys))} to {y_format(max(ys))}, "
            f"last {y_format(ys[-1])}")


def line_table(series: Sequence[Series], *, title: str, y_label: str, y_format: Callable[[float], str],
               x_format: Callable[[float], str] = clock) -> Table:
    """The data of `line_chart(series, ...)` as rows: series, x, y."""
    rows = tuple((s.name, x_format(x), y_format(y)) for s in series for x, y in s.points)
    return Table(title, ("series", "time" if x_format is clock else "x", y_label), rows)


def bar_chart(bars: Sequence[tuple[str, float]], *, title: str, y_format: Callable[[float], str]) -> str:
    """Horizontal bars, one row per (label, value) in the given order, each with its value written at its end
    (labels may be long: user names, days)."""
    if not bars:
        return _no_data("bar-chart", title)
    ticks = nice_ticks(min(0.0, min(v for _, v in bars)), max(0.0, max(v for _, v in bars)), 5)
    low, high = ticks[0], ticks[-1]
    plot_w = WIDTH_PT - BAR_LABEL_PT - RIGHT_PT - 60

    def x_of(v: float) -> float:
        return BAR_LABEL_PT + (v - low) / (high - low) * plot_w

    top = TOP_PT
    bottom = top + len(bars) * BAR_ROW_PT
    body = [f'<text x="8" y="16" class="label">{text(title)}</text>', '<g class="grid">']
    body += [f'<line x1="{num(x_of(t))}" x2="{num(x_of(t))}" y1="{num(top)}" y2="{num(bottom)}"/>' for t in ticks]
    body += ["</g>", '<g class="axis">',
             f'<path d="M{num(x_of(0))},{num(top)}V{num(bottom)}" fill="none"/>']
    body += [f'<text x="{num(x_of(t))}" y="{num(bottom + 14)}" text-anchor="middle">{text(y_format(t))}</text>'
             for t in ticks]
    body.append("</g>")
    for i, (label, value) in enumerate(bars):
        y = top + i * BAR_ROW_PT
        left, right = sorted((x_of(0), x_of(value)))
        body.append(f'<g class="bar-row"><title>{text(f"{label}: {y_format(value)}")}</title>'
                    f'<text x="{num(BAR_LABEL_PT - 6)}" y="{num(y + 14)}" text-anchor="end">'
                    f"{text(shorten(label, 22))}</text>"
                    f'<rect x="{num(left)}" y="{num(y + 3)}" width="{num(max(right - left, 0.5))}" '
                    f'height="{num(BAR_ROW_PT - 6)}" class="bar"/>'
                    f'<text x="{num(right + 4)}" y="{num(y + 14)}">{text(y_format(value))}</text></g>')
    total = sum(v for _, v in bars)
    largest = max(bars, key=lambda b: b[1])
    desc = (f"{plural(len(bars), 'bar')}, {y_format(total)} in all; the largest {largest[0]}, "
            f"{y_format(largest[1])}.")
    return document(kind="bar-chart", width=WIDTH_PT, height=bottom + 24, title=title, desc=desc, body=body)


def bar_table(bars: Sequence[tuple[str, float]], *, title: str, y_format: Callable[[float], str],
              label_name: str = "", value_name: str = "value") -> Table:
    """The data of `bar_chart(bars, ...)` as rows: label, value."""
    return Table(title, (label_name, value_name), tuple((label, y_format(value)) for label, value in bars))

