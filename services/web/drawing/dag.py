"""The picture of a batch's DAG, as SVG markup.

Up to `max_nodes` jobs, each job is a box (its id, a short name, its state as a word and as a colour
class) and each dependency an edge from parent to child, parents above children. Beyond, a job at a
time would be unreadable and `dot` too slow, so the picture is a summary: one box per (job group,
level) — a job's level is 0 without parents, else one more than its deepest parent's — holding its
count and a bar of its states, and one edge per pair of boxes, labelled with the number of job edges
it stands for. Should that still be more than MAX_AGGREGATES boxes, levels are taken in bands (0–1,
2–3, … doubling the band until it fits), and beyond MAX_GROUPS job groups the smallest are one
"other groups" box per level.

Positions come from services/web/drawing/layout.py (Graphviz, cached by structure: ids, parents and
groups, never states), so redrawing a running batch costs no layout. Parents are jobs with smaller ids
(so a DAG has no cycles); a parent id that is not smaller than its child's, or not in the input, is
ignored.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

from services.web.drawing.layout import Box, Graph, LayoutCache, Placement, path_data
from services.web.drawing.svg import attr, count, document, num, plural, shorten, text

STATES = ("pending", "ready", "creating", "running", "succeeded", "failed", "error", "cancelled")
"""JobState's names, lowercased, in the order a state bar lists them."""
MAX_AGGREGATES = 200
"""The most boxes of the summary picture."""
MAX_GROUPS = 24
"""The most job groups the summary shows apart; the rest are 'other groups'."""
JOB_BOX = (132.0, 40.0)
AGGREGATE_BOX = (176.0, 58.0)
STATE_BAR = (160.0, 10.0)
MIN_SEGMENT_PT = 2.0
"""A state present in a box gets at least this much of its bar, so one failed job among 10,000 shows."""
LEGEND_HEIGHT_PT = 24.0
LABEL_CHARS = 19
"""A job box's first line, its id and name, is cut to this many characters."""
LAYOUTS = LayoutCache()
"""The process's layouts, shared by every drawing that is not given its own."""


@dataclasses.dataclass(frozen=True)
class DagNode:
    """A job as the DAG shows it."""

    job_id: int
    name: str
    state: str
    """One of STATES; anything else is drawn as 'other'."""
    group_id: int
    parents: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Dag:
    """A drawing and a sentence for people that says what it shows."""

    svg: str
    summary: str


def state_class(state: str) -> str:
    return f"state-{state}" if state in STATES else "state-other"


def levels_of(nodes: Sequence[DagNode]) -> dict[int, int]:
    """Each job's level: 0 without (known, smaller-id) parents, else 1 + its deepest parent's."""
    level: dict[int, int] = {}
    for node in sorted(nodes, key=lambda n: n.job_id):
        known = [level[p] for p in node.parents if p < node.job_id and p in level]
        level[node.job_id] = 1 + max(known) if known else 0
    return level


def parent_edges(nodes: Sequence[DagNode]) -> list[tuple[int, int]]:
    """(parent, child) for every dependency the drawing keeps, each once, in id order."""
    ids = {n.job_id for n in nodes}
    return [(p, node.job_id) for node in sorted(nodes, key=lambda n: n.job_id)
            for p in sorted(set(node.parents)) if p < node.job_id and p in ids]


def draw_dag(nodes: Sequence[DagNode], *, href: Callable[[int], str], max_nodes: int = 2000,
             layouts: LayoutCache = LAYOUTS) -> Dag:
    """The DAG of `nodes`: a box per job up to `max_nodes` jobs, beyond that the summary by job group and
    level. `href(job_id)` is each job box's link."""
    ids = [n.job_id for n in nodes]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate job ids")
    if not nodes:
        svg = document(kind="dag", width=240, height=40, title="The batch's jobs", desc="The batch has no jobs.",
                       body=['<text x="8" y="24" class="note">No jobs.</text>'])
        return Dag(svg, "No jobs.")
    level = levels_of(nodes)
    n_levels = max(level.values()) + 1
    jobs = f"{plural(len(nodes), 'job')} in {plural(n_levels, 'level')}"
    if len(nodes) <= max_nodes:
        return _jobs(nodes, level, jobs, href, layouts)
    return _summary(nodes, level, jobs, layouts)


def _dot_number(n: int) -> str:
    """`n` as part of a `dot` node name, which may not hold a minus sign."""
    return str(n) if n >= 0 else f"m{-n}"


def _job_box(job_id: int) -> str:
    return f"j{_dot_number(job_id)}"


def _legend(state_counts: Mapping[str, int]) -> tuple[list[str], float]:
    """A swatch, the state's name and its count for each state present (colour is never the only cue); and
    the legend's width."""
    out = ['<g class="legend">']
    x = 8.0
    for state in [*STATES, "other"]:
        n = state_counts.get(state, 0)
        if not n:
            continue
        label = f"{state} {count(n)}"
        out.append(f'<rect x="{num(x)}" y="6" width="12" height="12" class="swatch {state_class(state)}"/>'
                   f'<text x="{num(x + 16)}" y="16">{text(label)}</text>')
        x += 24 + 7 * len(label)
    out.append("</g>")
    return out, x


def _note(placement: Placement, y: float) -> str:
    return f'<text x="8" y="{num(y)}" class="note">{text(placement.note)}</text>' if placement.note else ""


def _frame(placement: Placement) -> tuple[float, float]:
    """The offset (below the legend and the note) and the drawing's height."""
    top = LEGEND_HEIGHT_PT + (18.0 if placement.note else 0.0)
    return top, top + placement.height_pt


def _edge_paths(placement: Placement, top: float, edges: Iterable[tuple[str, str]],
                width_of: Callable[[tuple[str, str]], float] | None = None) -> list[str]:
    out = [f'<g class="edges" transform="translate(0,{num(top)})">']
    for edge in edges:
        points = placement.edges.get(edge)
        if points:
            stroke = f' stroke-width="{num(width_of(edge))}"' if width_of else ""
            out.append(f'<path d="{path_data(points)}"{stroke}/>')
    out.append("</g>")
    return out


def _jobs(nodes: Sequence[DagNode], level: Mapping[int, int], jobs: str, href: Callable[[int], str],
          layouts: LayoutCache) -> Dag:
    ordered = sorted(nodes, key=lambda n: n.job_id)
    edges = [(_job_box(p), _job_box(c)) for p, c in parent_edges(nodes)]
    width_pt, height_pt = JOB_BOX
    boxes = tuple(Box(_job_box(n.job_id), width_pt, height_pt, level[n.job_id]) for n in ordered)
    placement = layouts.place(Graph(boxes, tuple(edges)))
    legend, legend_width = _legend(collections.Counter("other" if n.state not in STATES else n.state for n in nodes))
    top, height = _frame(placement)
    body = [*legend, _note(placement, LEGEND_HEIGHT_PT + 12), *_edge_paths(placement, top, edges),
            f'<g class="nodes" transform="translate(0,{num(top)})">']
    for node in ordered:
        cx, cy = placement.centres[_job_box(node.job_id)]
        x, y = cx - width_pt / 2, cy - height_pt / 2
        state = node.state if node.state in STATES else "other"
        tip = f"job {node.job_id}: {node.name} ({node.state}, job group {node.group_id})"
        body.append(
            f'<a href="{attr(href(node.job_id))}"><g class="job {state_class(node.state)}" '
            f'data-job-id="{node.job_id}"><title>{text(tip)}</title>'
            f'<rect x="{num(x)}" y="{num(y)}" width="{num(width_pt)}" height="{num(height_pt)}" rx="4"/>'
            f'<text x="{num(x + 6)}" y="{num(y + 16)}" class="label">'
            f'{text(shorten(f"#{node.job_id} {node.name}", LABEL_CHARS))}</text>'
            f'<text x="{num(x + 6)}" y="{num(y + 32)}" class="state-name">{text(state)}</text></g></a>')
    body.append("</g>")
    summary = f"{jobs}; each job drawn" + (f" ({placement.note})" if placement.note else "")
    svg = document(kind="dag", width=max(placement.width_pt, legend_width), height=height,
                   title="The batch's jobs and their dependencies",
                   desc=f"{summary}. Parents above their children; each box links to its job.", body=body)
    return Dag(svg, summary + ".")


@dataclasses.dataclass
class _Aggregate:
    group: int | None
    """None for 'other groups'."""
    first_level: int
    last_level: int
    states: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def name(self) -> str:
        group = "o" if self.group is None else _dot_number(self.group)
        return f"g{group}_l{self.first_level}"


def _band(keys: Sequence[tuple[int | None, int]]) -> int:
    """The smallest band of levels (1, 2, 4, …) that keeps the (group, band) boxes within MAX_AGGREGATES."""
    band = 1
    while len({(g, lv // band) for g, lv in keys}) > MAX_AGGREGATES:
        band *= 2
    return band


def _summary(nodes: Sequence[DagNode], level: Mapping[int, int], jobs: str, layouts: LayoutCache) -> Dag:
    sizes = collections.Counter(n.group_id for n in nodes)
    shown = sorted(sorted(sizes, key=lambda g: (-sizes[g], g))[: MAX_GROUPS - 1 if len(sizes) > MAX_GROUPS else None])
    shown_set = set(shown)
    group_of = {n.job_id: (n.group_id if n.group_id in shown_set else None) for n in nodes}
    band = _band([(group_of[n.job_id], level[n.job_id]) for n in nodes])
    n_levels = max(level.values()) + 1

    aggregates: dict[tuple[int | None, int], _Aggregate] = {}
    for node in nodes:
        key = (group_of[node.job_id], level[node.job_id] // band)
        if key not in aggregates:
            first = key[1] * band
            aggregates[key] = _Aggregate(key[0], first, min(first + band, n_levels) - 1)
        aggregates[key].states["other" if node.state not in STATES else node.state] += 1
    key_counts = collections.Counter(
        ((group_of[parent], level[parent] // band), (group_of[child], level[child] // band))
        for parent, child in parent_edges(nodes))
    edge_counts = collections.Counter({(aggregates[a].name, aggregates[b].name): n
                                       for (a, b), n in key_counts.items() if a != b})

    # Boxes by level, then group, "other groups" last: the order `dot` and the fallback start from.
    ordered = sorted(aggregates.values(), key=lambda a: (a.first_level, a.group is None, a.group or 0))
    edges = sorted(edge_counts)
    width_pt, height_pt = AGGREGATE_BOX
    graph = Graph(tuple(Box(a.name, width_pt, height_pt, a.first_level // band) for a in ordered), tuple(edges))
    placement = layouts.place(graph)
    states = collections.Counter[str]()
    for a in ordered:
        states.update(a.states)
    legend, legend_width = _legend(states)
    top, height = _frame(placement)
    body = [*legend, _note(placement, LEGEND_HEIGHT_PT + 12),
            *_edge_paths(placement, top, edges, lambda e: 1 + len(str(edge_counts[e])) * 0.75),
            f'<g class="edge-counts" transform="translate(0,{num(top)})">']
    for edge in edges:
        points = placement.edges.get(edge)
        if points:
            mx, my = points[len(points) // 2]
            body.append(f'<text x="{num(mx + 3)}" y="{num(my)}">{count(edge_counts[edge])}</text>')
    body += ["</g>", f'<g class="nodes" transform="translate(0,{num(top)})">']
    for a in ordered:
        body += _aggregate_box(a, placement.centres[a.name])
    body.append("</g>")

    groups = len({a.group for a in ordered if a.group is not None})
    how = f"drawn as {plural(len(ordered), 'group')} of jobs by job group and level"
    if band > 1:
        how += f" (levels in bands of {band})"
    if len(sizes) > len(shown):
        how += f"; the {plural(len(sizes) - len(shown), 'smallest job group')} drawn as 'other groups'"
    summary = f"{jobs}; {how}" + (f" ({placement.note})" if placement.note else "")
    svg = document(kind="dag", width=max(placement.width_pt, legend_width), height=height,
                   title=f"The batch's jobs by job group and level ({plural(groups, 'job group')} shown)",
                   desc=f"{summary}. Each box counts the jobs of one job group at one level, with a bar of their "
                        "states; each edge counts the dependencies between two boxes.", body=body)
    return Dag(svg, summary + ".")


def _aggregate_box(a: _Aggregate, centre: tuple[float, float]) -> list[str]:
    width_pt, height_pt = AGGREGATE_BOX
    x, y = centre[0] - width_pt / 2, centre[1] - height_pt / 2
    total = sum(a.states.values())
    group = "other groups" if a.group is None else f"group {a.group}"
    levels = f"level {a.first_level}" if a.first_level == a.last_level else f"levels {a.first_level}–{a.last_level}"
    failed = a.states["failed"] + a.states["error"]
    line = plural(total, "job") + (f" · {count(failed)} failed" if failed else "")
    tip = f"{group}, {levels}: " + ", ".join(f"{count(a.states[s])} {s}" for s in [*STATES, "other"] if a.states[s])
    out = [f'<g class="aggregate" data-jobs="{total}"><title>{text(tip)}</title>'
           f'<rect x="{num(x)}" y="{num(y)}" width="{num(width_pt)}" height="{num(height_pt)}" rx="4" class="box"/>'
           f'<text x="{num(x + 8)}" y="{num(y + 15)}" class="label">{text(f"{group} · {levels}")}</text>'
           f'<text x="{num(x + 8)}" y="{num(y + 31)}">{text(line)}</text>']
    bar_w, bar_h = STATE_BAR
    present = [s for s in [*STATES, "other"] if a.states[s]]
    spare = bar_w - MIN_SEGMENT_PT * len(present)
    left = x + 8
    for state in present:
        w = MIN_SEGMENT_PT + spare * a.states[state] / total
        out.append(f'<rect x="{num(left)}" y="{num(y + height_pt - bar_h - 8)}" width="{num(w)}" '
                   f'height="{num(bar_h)}" class="segment {state_class(state)}">'
                   f"<title>{text(f'{count(a.states[state])} {state}')}</title></rect>")
        left += w
    out.append("</g>")
    return out
