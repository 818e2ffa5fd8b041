"""The attempts-by-worker timeline (services/web/drawing/timeline.py) and its clock
(services/web/drawing/clock.py): every attempt is drawn or counted, rows and merging keep to their
limits and say so, the markup is safe, and the axis reads in round UTC times."""

from __future__ import annotations

import calendar

from hypothesis import given, settings
from hypothesis import strategies as st

from services.web.drawing.clock import duration, time_ticks, utc
from services.web.drawing.timeline import Bar, draw_timeline
from tests.examples import examples
from tests.unit.web.svg_checks import SVG, as_shown, hrefs, parsed, texts

T0 = float(calendar.timegm((2026, 11, 29, 10, 0, 7)))
OUTCOMES = st.sampled_from(("running", "succeeded", "failed", "error", "cancelled", "preempted", "worker_lost"))


def link(job_id: int) -> str:
    return f"/jobs/{job_id}?a=1&b='2'"


@st.composite
def attempt_bars(draw: st.DrawFn, most: int = 60) -> list[Bar]:
    workers = draw(st.lists(st.text(max_size=12) | st.sampled_from(("<w&1>", '"w2"')), min_size=1, max_size=8,
                            unique=True))
    bars = []
    for job_id in range(1, draw(st.integers(0, most)) + 1):
        start = T0 + draw(st.floats(0, 86_400 * 3))
        end = draw(st.none() | st.floats(0, 7200).map(lambda d, s=start: s + d))
        bars.append(Bar(job_id, draw(st.integers(1, 3)), draw(st.sampled_from(workers)), start, end,
                        draw(OUTCOMES | st.text(max_size=6))))
    return bars


def attempts(root) -> list:
    return [r for r in root.iter(f"{SVG}rect") if "attempt" in r.get("class", "").split()]


def merged_counts(root) -> list[int]:
    return [int(g.get("data-attempts")) for g in root.iter(f"{SVG}g") if g.get("data-attempts")]


def rows(root) -> list[str]:
    return [t.find(f"{SVG}title").text or "" for t in root.iter(f"{SVG}text") if t.get("class") == "worker"]


@settings(max_examples=examples(200), deadline=None)
@given(attempt_bars(), st.integers(1, 5), st.integers(0, 80), st.floats(0, 86_400 * 4))
def test_every_attempt_is_drawn_or_counted(bars: list[Bar], max_rows: int, max_bars: int, later: float) -> None:
    made: list[str] = []

    def href(job_id: int) -> str:
        made.append(link(job_id))
        return made[-1]

    timeline = draw_timeline(bars, now=T0 + later, href=href, max_rows=max_rows, max_bars=max_bars)
    root = parsed(timeline.svg)
    assert hrefs(root) == made
    workers = {b.worker for b in bars}
    assert len(rows(root)) == min(len(workers), max_rows)
    if len(bars) > max_bars:
        assert sum(merged_counts(root)) == len(bars) and attempts(root) == []
        assert "merged into segments" in timeline.summary
    else:
        assert len(attempts(root)) == len(bars) and merged_counts(root) == []
        tips = [r.find(f"{SVG}title").text for r in attempts(root)]
        assert sorted(t.split(":")[0] for t in tips) == sorted(f"job {b.job_id}, attempt {b.attempt}" for b in bars)
    if len(workers) > max_rows:
        assert rows(root)[-1] == f"other workers ({len(workers) - max_rows + 1:,})"
        assert "'other workers'" in timeline.summary
    else:
        assert {as_shown(w) for w in workers} == set(rows(root))


def test_rows_come_in_order_of_first_start_and_overlaps_get_lanes() -> None:
    bars = [Bar(1, 1, "late", T0 + 100, T0 + 200, "succeeded"),
            Bar(2, 1, "early", T0, T0 + 300, "failed"),
            Bar(3, 2, "early", T0 + 10, None, "running"),
            Bar(4, 1, "early", T0 + 301, T0 + 400, "preempted")]
    timeline = draw_timeline(bars, now=T0 + 500, href=link)
    root = parsed(timeline.svg)
    assert rows(root) == ["early", "late"]
    lanes = {r.find(f"{SVG}title").text.split(":")[0]: float(r.get("y")) for r in attempts(root)}
    # Job 3 overlaps job 2, so takes the second lane; job 4 starts after job 2 ends and reuses the first.
    assert lanes["job 2, attempt 1"] == lanes["job 4, attempt 1"] < lanes["job 3, attempt 2"]
    titles = [r.find(f"{SVG}title").text for r in attempts(root)]
    assert "job 3, attempt 2: 8 min 10 s so far, running" in titles
    assert "job 2, attempt 1: 5 min 0 s, failed" in titles
    assert timeline.summary == "4 attempts on 2 workers, 2026-11-29 10:00 to 2026-11-29 10:08 UTC; 1 still running."


def test_beyond_the_limits_rows_merge_and_the_summary_says_so() -> None:
    bars = [Bar(i, 1, f"w{i % 7}", T0 + i, T0 + i + 30, "succeeded" if i % 3 else "failed") for i in range(1, 101)]
    timeline = draw_timeline(bars, now=T0 + 200, href=link, max_rows=3, max_bars=50)
    root = parsed(timeline.svg)
    assert rows(root) == ["w1", "w2", "other workers (5)"]
    assert sum(merged_counts(root)) == 100
    assert hrefs(root) == []
    assert timeline.summary == (
        "100 attempts on 7 workers, 2026-11-29 10:00 to 2026-11-29 10:02 UTC; the 5 workers that started last "
        "drawn as one row, 'other workers'; more than 50 attempts, so each row's attempts are merged into "
        f"segments of 6 s ({len(merged_counts(root))} segments).")
    tips = [t for t in texts(root) if " started " in t]
    assert tips[0] == "1 attempt started 10:00:08–10:00:14: 1 succeeded"
    assert "4 attempts started 10:01:38–10:01:44: 3 succeeded, 1 failed" in tips  # the 'other workers' row


def test_ten_thousand_attempts_stay_small() -> None:
    bars = [Bar(i, 1, f"worker-{i % 300}", T0 + i * 0.7, T0 + i * 0.7 + 120, "succeeded") for i in range(10_000)]
    timeline = draw_timeline(bars, now=T0 + 8000, href=link)
    root = parsed(timeline.svg)
    assert len(rows(root)) == 200
    assert sum(merged_counts(root)) == 10_000
    assert len(timeline.svg) < 2_000_000


def test_the_same_attempts_give_the_same_bytes() -> None:
    bars = [Bar(i, 1, f"w{i % 3}", T0 + i * 7, None if i % 4 == 0 else T0 + i * 9, "succeeded") for i in range(1, 40)]
    assert draw_timeline(bars, now=T0 + 999, href=link) == draw_timeline(list(reversed(bars)), now=T0 + 999, href=link)


def test_no_attempts() -> None:
    timeline = draw_timeline([], now=T0, href=link)
    assert timeline.summary == "No attempts yet."
    parsed(timeline.svg)


def test_axis_ticks_are_round_utc_times() -> None:
    assert time_ticks(T0, T0 + 3600) == (600, [int(T0) - 7 + 600 * k for k in range(1, 7)])
    assert time_ticks(T0, T0 + 40) == (5, [int(T0) - 2 + 5 * k for k in range(1, 9)])
    step, ticks = time_ticks(T0, T0 + 5 * 86_400)
    assert step == 86_400 and [utc(t, "%H:%M") for t in ticks] == ["00:00"] * 5
    root = parsed(draw_timeline([Bar(1, 1, "w", T0, T0 + 3600, "succeeded")], now=T0 + 3600, href=link).svg)
    axis = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "axis")
    assert [t.text for t in axis.iter(f"{SVG}text")] == \
        ["UTC", "2026-11-29", "10:10", "10:20", "10:30", "10:40", "10:50", "11:00"]


@settings(max_examples=examples(200))
@given(st.lists(st.floats(0, 1e9), min_size=2, max_size=2).map(sorted))
def test_ticks_fall_within_and_are_few(span: list[float]) -> None:
    low, high = T0 + span[0], T0 + span[1]
    step, ticks = time_ticks(low, high)
    assert all(low <= t <= high and t % step == 0 for t in ticks)
    assert len(ticks) <= 9


def test_durations_read_as_people_say_them() -> None:
    assert [duration(s) for s in (0, 44.6, 184, 7500, 97_200)] == ["0 s", "45 s", "3 min 4 s", "2 h 5 min", "1 d 3 h"]
