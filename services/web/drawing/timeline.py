"""A Gantt-like chart of a batch's attempts, a row per worker, as SVG markup.

Rows are workers in the order they started their first attempt. Within a row, attempts that overlap
(a worker runs several jobs at once) go to separate lanes, at most MAX_LANES; beyond, an attempt shares
the lane that frees first. Each bar is coloured by its outcome's class, links to its job and has a
<title> (job, attempt, duration, outcome); an attempt still running is drawn to `now`.

Readable at 10,000 attempts: beyond `max_bars`, each row's attempts are merged into segments, one per
stretch of time (the axis cut into as many columns as keep rows × columns within `max_bars`, but at
least MIN_COLUMNS and at most MAX_COLUMNS), each
counting the attempts that started in it with a stripe per outcome; beyond `max_rows` workers, the
workers that started last share one row, "other workers". The summary says which of these happened.
Times are shown in UTC.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from services.web.drawing.clock import DAY_S, duration, tick_pattern, time_ticks, utc
from services.web.drawing.svg import attr, count, document, num, plural, shorten, text

OUTCOMES = ("running", "succeeded", "failed", "error", "cancelled", "preempted", "worker_lost")
"""The outcomes with a colour of their own, in the order a merged segment stacks them; others are 'other'."""
MAX_LANES = 16
LANE_PT = 9.0
MERGED_ROW_PT = 18.0
ROW_GAP_PT = 4.0
LABEL_PT = 150.0
PLOT_PT = 900.0
AXIS_PT = 34.0
LEGEND_PT = 22.0
MIN_BAR_PT = 1.0
MIN_COLUMNS, MAX_COLUMNS = 20, 400


@dataclasses.dataclass(frozen=True)
class Bar:
    """One attempt."""

    job_id: int
    attempt: int
    worker: str
    start: float
    """Epoch seconds."""
    end: float | None
    """Epoch seconds; None while it runs."""
    outcome: str


@dataclasses.dataclass(frozen=True)
class Timeline:
    """A drawing and a sentence for people that says what it shows."""

    svg: str
    summary: str


def outcome_class(outcome: str) -> str:
    return f"outcome-{outcome if outcome in OUTCOMES else 'other'}"


@dataclasses.dataclass
class _Row:
    name: str
    bars: list[Bar]


def _rows(bars: Sequence[Bar], max_rows: int) -> tuple[list[_Row], int]:
    """Rows by first start; returns them and how many workers the 'other workers' row holds (0: none)."""
    by_worker: dict[str, list[Bar]] = collections.defaultdict(list)
    for bar in bars:
        by_worker[bar.worker].append(bar)
    workers = sorted(by_worker, key=lambda w: (min(b.start for b in by_worker[w]), w))
    if len(workers) <= max_rows:
        return [_Row(w, by_worker[w]) for w in workers], 0
    kept, rest = workers[: max(max_rows - 1, 0)], workers[max(max_rows - 1, 0):]
    other = _Row(f"other workers ({count(len(rest))})", [b for w in rest for b in by_worker[w]])
    return [*(_Row(w, by_worker[w]) for w in kept), other], len(rest)


def _lanes(bars: list[Bar], now: float) -> list[tuple[Bar, int]]:
    """Each bar with its lane: the first lane free at its start, a new one up to MAX_LANES, else the lane
    that frees first."""
    ends: list[float] = []
    placed = []
    for bar in sorted(bars, key=lambda b: (b.start, b.job_id, b.attempt)):
        end = _end(bar, now)
        lane = next((i for i, e in enumerate(ends) if e <= bar.start), None)
        if lane is None:
            if len(ends) < MAX_LANES:
                ends.append(end)
                lane = len(ends) - 1
            else:
                lane = min(range(len(ends)), key=lambda i: (ends[i], i))
        ends[lane] = max(ends[lane], end)
        placed.append((bar, lane))
    return placed


def _end(bar: Bar, now: float) -> float:
    return max(now if bar.end is None else bar.end, bar.start)


def draw_timeline(bars: Sequence[Bar], *, now: float, href: Callable[[int], str], max_rows: int = 200,
                  max_bars: int = 5000) -> Timeline:
    """The attempts of `bars` by worker, over time. `href(job_id)` is each bar's link."""
    if not bars:
        svg = document(kind="timeline", width=240, height=40, title="Attempts by worker",
                       desc="No attempts yet.", body=['<text x="8" y="24" class="note">No attempts yet.</text>'])
        return Timeline(svg, "No attempts yet.")
    low = min(b.start for b in bars)
    high = max(max(_end(b, now) for b in bars), low + 1.0)
    rows, others = _rows(bars, max_rows)
    merged = len(bars) > max_bars
    columns = min(max(max_bars // len(rows), MIN_COLUMNS), MAX_COLUMNS)

    def x_of(t: float) -> float:
        return LABEL_PT + (t - low) / (high - low) * PLOT_PT

    outcomes = collections.Counter(b.outcome if b.outcome in OUTCOMES else "other" for b in bars)
    top = LEGEND_PT + AXIS_PT
    body = [*_legend(outcomes), *_axis(low, high, top, x_of)]
    rows_body: list[str] = []
    y = top
    segments = 0
    for index, row in enumerate(rows):
        if merged:
            height = MERGED_ROW_PT
            drawn, n = _merged_row(row, low, high, columns, y, x_of)
            segments += n
        else:
            placed = _lanes(row.bars, now)
            height = (max(lane for _, lane in placed) + 1) * LANE_PT
            drawn = [_bar(bar, lane, y, now, x_of, href) for bar, lane in placed]
        band = f'<rect x="0" y="{num(y - ROW_GAP_PT / 2)}" width="{num(LABEL_PT + PLOT_PT)}" ' \
               f'height="{num(height + ROW_GAP_PT)}" class="row-band"/>' if index % 2 else ""
        rows_body += [f'<g class="row">{band}<text x="4" y="{num(y + min(height, 12.0) - 2)}" class="worker">'
                      f"{text(shorten(row.name, 24))}<title>{text(row.name)}</title></text>", *drawn, "</g>"]
        y += height + ROW_GAP_PT
    body += rows_body
    if low <= now <= high:
        body.append(f'<g class="now"><line x1="{num(x_of(now))}" y1="{num(top)}" x2="{num(x_of(now))}" '
                    f'y2="{num(y)}"/><title>now, {text(utc(now))} UTC</title></g>')

    running = sum(1 for b in bars if b.end is None)
    summary = (f"{plural(len(bars), 'attempt')} on {plural(len({b.worker for b in bars}), 'worker')}, "
               f"{utc(low, '%Y-%m-%d %H:%M')} to {utc(high, '%Y-%m-%d %H:%M')} UTC")
    if running:
        summary += f"; {count(running)} still running"
    if others:
        summary += f"; the {plural(others, 'worker')} that started last drawn as one row, 'other workers'"
    if merged:
        summary += (f"; more than {count(max_bars)} attempts, so each row's attempts are merged into segments "
                    f"of {duration((high - low) / columns)} ({plural(segments, 'segment')})")
    svg = document(kind="timeline", width=LABEL_PT + PLOT_PT + 8, height=y + 4, title="Attempts by worker",
                   desc=summary + ". A row per worker, time across in UTC; bars link to their jobs.", body=body)
    return Timeline(svg, summary + ".")


def _legend(outcomes: collections.Counter[str]) -> list[str]:
    out = ['<g class="legend">']
    x = 4.0
    for outcome in [*OUTCOMES, "other"]:
        if outcomes[outcome]:
            label = f"{outcome.replace('_', ' ')} {count(outcomes[outcome])}"
            out.append(f'<rect x="{num(x)}" y="4" width="12" height="12" class="swatch {outcome_class(outcome)}"/>'
                       f'<text x="{num(x + 16)}" y="14">{text(label)}</text>')
            x += 24 + 7 * len(label)
    out.append("</g>")
    return out


def _axis(low: float, high: float, top: float, x_of: Callable[[float], float]) -> list[str]:
    step, ticks = time_ticks(low, high)
    pattern = tick_pattern(step)
    dated = step < DAY_S
    out = ['<g class="axis">',
           f'<line x1="{num(LABEL_PT)}" y1="{num(top - 4)}" x2="{num(LABEL_PT + PLOT_PT)}" y2="{num(top - 4)}"/>',
           f'<text x="4" y="{num(top - 8)}">UTC</text>']
    day = ""
    for tick in ticks:
        x = x_of(tick)
        label = utc(tick, pattern)
        if dated and utc(tick, "%Y-%m-%d") != day:
            day = utc(tick, "%Y-%m-%d")
            out.append(f'<text x="{num(x)}" y="{num(top - 22)}" text-anchor="middle">{day}</text>')
        out.append(f'<line x1="{num(x)}" y1="{num(top - 8)}" x2="{num(x)}" y2="{num(top - 4)}"/>'
                   f'<text x="{num(x)}" y="{num(top - 10)}" text-anchor="middle">{label}</text>')
    out.append("</g>")
    return out


def _bar(bar: Bar, lane: int, top: float, now: float, x_of: Callable[[float], float],
         href: Callable[[int], str]) -> str:
    end = _end(bar, now)
    x = x_of(bar.start)
    width = max(x_of(end) - x, MIN_BAR_PT)
    until = " so far" if bar.end is None else ""
    tip = f"job {bar.job_id}, attempt {bar.attempt}: {duration(end - bar.start)}{until}, {bar.outcome}"
    return (f'<a href="{attr(href(bar.job_id))}"><rect x="{num(x)}" y="{num(top + lane * LANE_PT + 1)}" '
            f'width="{num(width)}" height="{num(LANE_PT - 2)}" class="attempt {outcome_class(bar.outcome)}">'
            f"<title>{text(tip)}</title></rect></a>")


def _merged_row(row: _Row, low: float, high: float, columns: int, top: float,
                x_of: Callable[[float], float]) -> tuple[list[str], int]:
    """A segment per column of the axis in which attempts started, a stripe per outcome; and how many."""
    width_s = (high - low) / columns
    by_column: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for bar in row.bars:
        column = min(int((bar.start - low) / width_s), columns - 1)
        by_column[column][bar.outcome if bar.outcome in OUTCOMES else "other"] += 1
    out = []
    for column in sorted(by_column):
        outcomes = by_column[column]
        total = sum(outcomes.values())
        start = low + column * width_s
        x, width = x_of(start), x_of(start + width_s) - x_of(start)
        tip = (f"{plural(total, 'attempt')} started {utc(start, '%H:%M:%S')}–{utc(start + width_s, '%H:%M:%S')}: "
               + ", ".join(f"{count(outcomes[o])} {o}" for o in [*OUTCOMES, "other"] if outcomes[o]))
        out.append(f'<g class="merged-segment" data-attempts="{total}"><title>{text(tip)}</title>')
        y = top
        for outcome in [o for o in [*OUTCOMES, "other"] if outcomes[o]]:
            height = MERGED_ROW_PT * outcomes[outcome] / total
            out.append(f'<rect x="{num(x)}" y="{num(y)}" width="{num(width)}" height="{num(height)}" '
                       f'class="merged {outcome_class(outcome)}"/>')
            y += height
        out.append("</g>")
    return out, len(by_column)
