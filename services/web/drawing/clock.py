"""Times for people, in UTC: instants, durations and the ticks of a time axis."""

from __future__ import annotations

import datetime
import math

DAY_S, YEAR_S = 86_400, 365 * 86_400
TICK_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, DAY_S,
                2 * DAY_S, 7 * DAY_S, 30 * DAY_S, 90 * DAY_S, YEAR_S, 5 * YEAR_S, 10 * YEAR_S, 100 * YEAR_S)
"""Round units of time a time axis steps by: seconds, minutes, hours, days, a week, 30 and 90 days, years."""


def utc(seconds: float, pattern: str = "%Y-%m-%d %H:%M:%S") -> str:
    """An epoch instant in UTC, formatted with strftime's `pattern`."""
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(pattern)


def clock(seconds: float) -> str:
    """An epoch instant as 'HH:MM:SS' UTC: a time axis's default labels."""
    return utc(seconds, "%H:%M:%S")


def duration(seconds: float) -> str:
    """'45 s', '3 min 4 s', '2 h 5 min', '1 d 3 h'."""
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def time_ticks(low: float, high: float, most: int = 8) -> tuple[int, list[int]]:
    """The tick step (seconds, one of TICK_STEPS_S) and the ticks within [low, high], at whole multiples of
    the step since the epoch, so minutes fall on minutes and days on UTC midnights."""
    span = max(high - low, 1.0)
    step = next((s for s in TICK_STEPS_S if span / s <= most), TICK_STEPS_S[-1])
    first = math.ceil(low / step) * step
    return step, list(range(first, math.floor(high) + 1, step))


def tick_pattern(step_s: int) -> str:
    """The strftime pattern for ticks `step_s` apart: seconds shown only when they matter."""
    if step_s < 60:
        return "%H:%M:%S"
    if step_s < DAY_S:
        return "%H:%M"
    return "%d %b" if step_s < 30 * DAY_S else "%b %Y" if step_s < YEAR_S else "%Y"
