"""The DAG picture (services/web/drawing/dag.py) and its layout cache (services/web/drawing/layout.py):
every job is drawn or counted, the markup is safe and well-formed, thresholds pick the picture, and
`dot` runs once per structure, bounded, with a fallback that says so. These tests run the real `dot`
(Graphviz, installed by scripts/setup.sh)."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.web.drawing.dag import MAX_AGGREGATES, MAX_GROUPS, STATES, DagNode, draw_dag, levels_of
from services.web.drawing.layout import Box, Graph, LayoutCache, by_level
from tests.examples import examples
from tests.unit.web.svg_checks import SVG, as_shown, hrefs, parsed, texts

NASTY = ('<script>alert("x")</script>', "a & b", "it's \"quoted\"", "]]>", "\x00\x1f ctl", "&amp;")


BY_LEVEL = LayoutCache(program="/nonexistent/dot")
"""The fallback layout, for the properties of the markup: they do not depend on where the boxes go, and
`dot` at every example would cost the suite a minute. test_dot_draws_every_job checks them with `dot`."""


def link(job_id: int) -> str:
    return f"/batches/7/jobs/{job_id}?from=dag&x=<'\">"


@st.composite
def dags(draw: st.DrawFn, most: int = 40) -> list[DagNode]:
    """Jobs with distinct ids; parents mostly earlier jobs, sometimes an id not in the input or a later one."""
    ids = sorted(draw(st.sets(st.integers(1, 10_000), max_size=most)))
    nodes = []
    for i, job_id in enumerate(ids):
        earlier = st.sampled_from(ids[:i]) if i else st.nothing()
        parents = draw(st.lists(earlier | st.integers(1, 20_000), max_size=4))
        nodes.append(DagNode(job_id, draw(st.text(max_size=30) | st.sampled_from(NASTY)),
                             draw(st.sampled_from(STATES) | st.text(max_size=8)), draw(st.integers(-1, 30)),
                             tuple(parents)))
    return nodes


def job_boxes(root) -> list[int]:
    return [int(g.get("data-job-id")) for g in root.iter(f"{SVG}g") if g.get("data-job-id")]


def aggregate_counts(root) -> list[int]:
    return [int(g.get("data-jobs")) for g in root.iter(f"{SVG}g") if g.get("data-jobs")]


def check_jobs_drawn(nodes: list[DagNode], layouts: LayoutCache) -> None:
    made: list[str] = []

    def href(job_id: int) -> str:
        made.append(link(job_id))
        return made[-1]

    dag = draw_dag(nodes, href=href, layouts=layouts)
    root = parsed(dag.svg)
    assert sorted(job_boxes(root)) == sorted(n.job_id for n in nodes)
    assert hrefs(root) == made
    assert set(made) == {link(n.job_id) for n in nodes}
    shown = "\n".join(texts(root))
    for node in nodes:
        assert as_shown(node.name) in shown
    assert dag.summary.startswith(f"{len(nodes):,} job" if nodes else "No jobs")


@settings(max_examples=examples(200), deadline=None)
@given(dags())
def test_every_job_is_drawn_once_and_links_where_told(nodes: list[DagNode]) -> None:
    check_jobs_drawn(nodes, BY_LEVEL)


@settings(max_examples=examples(20), deadline=None)
@given(dags(most=15))
def test_dot_draws_every_job(nodes: list[DagNode]) -> None:
    check_jobs_drawn(nodes, LayoutCache())


@settings(max_examples=examples(200), deadline=None)
@given(dags(), st.integers(0, 10))
def test_the_summary_counts_every_job(nodes: list[DagNode], max_nodes: int) -> None:
    dag = draw_dag(nodes, href=link, max_nodes=max_nodes, layouts=BY_LEVEL)
    root = parsed(dag.svg)
    if len(nodes) > max_nodes:
        assert sum(aggregate_counts(root)) == len(nodes)
        assert job_boxes(root) == [] and hrefs(root) == []
        assert "drawn as" in dag.summary
    else:
        assert aggregate_counts(root) == []


def test_names_are_escaped() -> None:
    nodes = [DagNode(1, '<script>alert("x")</script>', "failed", 0, ()),
             DagNode(2, "a & b \"c\" 'd'", "<b>", 0, (1,))]
    dag = draw_dag(nodes, href=lambda j: f'/jobs/{j}"><script>')
    assert "<script" not in dag.svg
    root = parsed(dag.svg)
    assert hrefs(root) == ['/jobs/1"><script>', '/jobs/2"><script>']
    tips = [t for t in texts(root) if t.startswith("job ")]
    assert tips == ['job 1: <script>alert("x")</script> (failed, job group 0)',
                    "job 2: a & b \"c\" 'd' (<b>, job group 0)"]
    # An unknown state is drawn as 'other', never as a class of its own.
    assert {g.get("class") for g in root.iter(f"{SVG}g") if g.get("data-job-id")} == \
        {"job state-failed", "job state-other"}


def test_the_same_jobs_give_the_same_bytes() -> None:
    nodes = [DagNode(i, f"step {i}", STATES[i % len(STATES)], i % 3, (i - 1,) if i > 1 else ()) for i in range(1, 30)]
    first = draw_dag(nodes, href=link, layouts=LayoutCache())
    assert draw_dag(list(reversed(nodes)), href=link, layouts=LayoutCache()) == first
    assert draw_dag(nodes, href=link, max_nodes=5, layouts=LayoutCache()) == \
        draw_dag(nodes, href=link, max_nodes=5, layouts=LayoutCache())


def layered(levels: int, groups: int, per_cell: int) -> list[DagNode]:
    """`levels` × `groups` cells of `per_cell` jobs; each job's parent is a job of the level above."""
    nodes: list[DagNode] = []
    above: list[int] = []
    for level in range(levels):
        row = []
        for group in range(groups):
            for k in range(per_cell):
                job_id = len(nodes) + 1
                parents = (above[(group * per_cell + k) % len(above)],) if above else ()
                nodes.append(DagNode(job_id, f"j{job_id}", STATES[job_id % len(STATES)], group, parents))
                row.append(job_id)
        above = row
    return nodes


def test_thresholds_pick_the_picture() -> None:
    nodes = layered(3, 2, 2)  # 12 jobs
    assert draw_dag(nodes, href=link, max_nodes=12).summary == "12 jobs in 3 levels; each job drawn."
    assert draw_dag(nodes, href=link, max_nodes=11).summary == \
        "12 jobs in 3 levels; drawn as 6 groups of jobs by job group and level."


def test_ten_thousand_jobs() -> None:
    nodes = layered(12, 3, 278)[:10_000]
    dag = draw_dag(nodes, href=link)
    assert dag.summary == "10,000 jobs in 12 levels; drawn as 36 groups of jobs by job group and level."
    root = parsed(dag.svg)
    assert sum(aggregate_counts(root)) == 10_000
    assert len(dag.svg) < 100_000


def test_deep_dags_take_levels_in_bands() -> None:
    chain = [DagNode(i, "c", "running", 0, (i - 1,)) for i in range(1, 2 * MAX_AGGREGATES + 2)]
    dag = draw_dag(chain, href=link, max_nodes=10)
    assert dag.summary == ("401 jobs in 401 levels; drawn as 101 groups of jobs by job group and level "
                           "(levels in bands of 4).")
    root = parsed(dag.svg)
    assert len(aggregate_counts(root)) <= MAX_AGGREGATES
    assert sum(aggregate_counts(root)) == len(chain)


def test_many_job_groups_share_a_box() -> None:
    nodes = [DagNode(i, "x", "ready", i % (MAX_GROUPS + 6), ()) for i in range(1, 301)]
    dag = draw_dag(nodes, href=link, max_nodes=10)
    assert dag.summary.endswith("; the 7 smallest job groups drawn as 'other groups'.")
    root = parsed(dag.svg)
    assert len(aggregate_counts(root)) == MAX_GROUPS
    assert sum(aggregate_counts(root)) == 300
    assert any(t.startswith("other groups, level 0: ") for t in texts(root))


def test_a_missing_or_later_parent_is_ignored() -> None:
    nodes = [DagNode(1, "a", "succeeded", 0, (99,)), DagNode(2, "b", "running", 0, (1, 3, 2)),
             DagNode(3, "c", "pending", 0, (1, 1))]
    assert levels_of(nodes) == {1: 0, 2: 1, 3: 1}
    root = parsed(draw_dag(nodes, href=link).svg)
    assert sorted(job_boxes(root)) == [1, 2, 3]
    assert len(list(root.iter(f"{SVG}path"))) == 2  # 1 -> 2 and 1 -> 3, once each


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        draw_dag([DagNode(1, "a", "ready", 0, ()), DagNode(1, "b", "ready", 0, ())], href=link)


def test_no_jobs() -> None:
    dag = draw_dag([], href=link)
    assert dag.summary == "No jobs."
    parsed(dag.svg)


def boxes_at(root) -> dict[int, tuple[str, str]]:
    """Each job box's corner."""
    return {int(g.get("data-job-id")): (g.find(f"{SVG}rect").get("x"), g.find(f"{SVG}rect").get("y"))
            for g in root.iter(f"{SVG}g") if g.get("data-job-id")}


def test_layout_runs_once_per_structure() -> None:
    layouts = LayoutCache()
    nodes = layered(3, 2, 2)
    first = draw_dag(nodes, href=link, layouts=layouts)
    assert layouts.runs == 1
    # New states, same structure: no layout, the same positions, other classes.
    later = [DagNode(n.job_id, n.name, "succeeded", n.group_id, n.parents) for n in nodes]
    again = draw_dag(later, href=link, layouts=layouts)
    assert layouts.runs == 1
    assert again.svg != first.svg
    assert boxes_at(parsed(again.svg)) == boxes_at(parsed(first.svg))
    # A new dependency is a new structure; so is the summary of the same jobs.
    extra = [*nodes[:-1], DagNode(nodes[-1].job_id, "x", "ready", 0, (1,))]
    draw_dag(extra, href=link, layouts=layouts)
    assert layouts.runs == 2
    draw_dag(nodes, href=link, max_nodes=3, layouts=layouts)
    draw_dag(later, href=link, max_nodes=3, layouts=layouts)
    assert layouts.runs == 3


def test_the_cache_keeps_the_most_recent() -> None:
    layouts = LayoutCache(capacity=1)
    a, b = layered(2, 1, 2), layered(3, 1, 2)
    for nodes in (a, a, b, a):
        draw_dag(nodes, href=link, layouts=layouts)
    assert layouts.runs == 3


def test_a_slow_dot_falls_back_to_levels_and_says_so() -> None:
    layouts = LayoutCache(timeout_s=0.001)  # no process starts in a millisecond
    nodes = layered(4, 3, 25)
    dag = draw_dag(nodes, href=link, layouts=layouts)
    note = "Graphviz did not finish within 0.001 s; laid out by level"
    assert dag.summary == f"300 jobs in 4 levels; each job drawn ({note})."
    root = parsed(dag.svg)
    assert note in texts(root)
    assert sorted(job_boxes(root)) == [n.job_id for n in nodes]
    # The fallback is cached too: the timeout is paid once per structure.
    draw_dag(nodes, href=link, layouts=layouts)
    assert layouts.runs == 1


@pytest.mark.parametrize(("program", "note"), [
    ("/nonexistent/dot", "Graphviz could not be run (No such file or directory); laid out by level"),
    ("false", "Graphviz failed (exit status 1); laid out by level"),
])
def test_a_missing_or_failing_dot_falls_back(program: str, note: str) -> None:
    dag = draw_dag(layered(2, 2, 2), href=link, layouts=LayoutCache(program=program))
    assert dag.summary == f"8 jobs in 2 levels; each job drawn ({note})."


@settings(max_examples=examples(200))
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(20, 200), st.integers(20, 80)), max_size=120))
def test_the_fallback_overlaps_nothing(shapes: list[tuple[int, int, int]]) -> None:
    boxes = tuple(Box(f"b{i}", w, h, level) for i, (level, w, h) in enumerate(shapes))
    placement = by_level(Graph(boxes, ()), "note")
    rects = []
    for box in boxes:
        x, y = placement.centres[box.name]
        rects.append((x - box.width_pt / 2, y - box.height_pt / 2, x + box.width_pt / 2, y + box.height_pt / 2))
        assert rects[-1][0] >= 0 and rects[-1][1] >= 0
        assert rects[-1][2] <= placement.width_pt and rects[-1][3] <= placement.height_pt
    for (i, a), (j, b) in ((p, q) for p in enumerate(rects) for q in enumerate(rects) if p[0] < q[0]):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (i, j)
    # Rows go down by level.
    by_levels = collections.defaultdict(list)
    for box, rect in zip(boxes, rects):
        by_levels[box.level].append(rect)
    ordered = [by_levels[k] for k in sorted(by_levels)]
    for upper, lower in zip(ordered, ordered[1:]):
        assert max(r[3] for r in upper) <= min(r[1] for r in lower)
