"""Where the boxes of a graph go: Graphviz's `dot`, run once per structure, its answer cached.

A graph here is structure only — node names, sizes, edges and each node's level — never the states
the picture colours, so a page that redraws a running batch every few seconds lays it out once:
`LayoutCache` keys its small LRU by a digest of the `dot` source, which is built from the structure
alone, and counts the times it ran `dot` (`runs`), which the tests read.

`dot` is bounded twice: its own iteration limits (`nslimit`, `mclimit`: network simplex and mincross
passes, scaled to the graph's size) and a wall-clock timeout, after which the process is killed. When
`dot` does not finish, is missing or fails, the graph is laid out here instead, by level: a row per
level (wrapped when wide), straight edges. The placement says so (`by`, `note`), the drawing shows the
note, and the fallback is cached like a real layout, so a slow graph costs the timeout once, not on
every redraw.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import subprocess
import threading
from collections.abc import Mapping, Sequence

from services.web.drawing.svg import num

POINTS_PER_INCH = 72.0
MARGIN_PT = 8.0
FALLBACK_ROW_NODES = 40
"""The fallback wraps a level wider than this into several rows."""
FALLBACK_GAP_PT = 18.0

Point = tuple[float, float]


@dataclasses.dataclass(frozen=True)
class Box:
    """A node to place: its name in the `dot` source, size, and level (the fallback's row)."""

    name: str
    """`[a-z0-9_]+`, so that it needs no quoting."""
    width_pt: float
    height_pt: float
    level: int


@dataclasses.dataclass(frozen=True)
class Graph:
    """The structure to lay out. Edges name boxes; edges to a name that is not a box are dropped."""

    boxes: tuple[Box, ...]
    edges: tuple[tuple[str, str], ...]

    def dot_source(self, *, nslimit: float, mclimit: float) -> str:
        lines = ["digraph g {",
                 f"graph [rankdir=TB, nodesep=0.25, ranksep=0.5, nslimit={nslimit:g}, nslimit1={nslimit:g}, "
                 f"mclimit={mclimit:g}, searchsize=30, splines=true, outputorder=edgesfirst];",
                 'node [shape=box, fixedsize=true, label=""];']
        names = {b.name for b in self.boxes}
        lines += [f"{b.name} [width={b.width_pt / POINTS_PER_INCH:.4f}, height={b.height_pt / POINTS_PER_INCH:.4f}];"
                  for b in self.boxes]
        lines += [f"{a} -> {b};" for a, b in self.edges if a in names and b in names]
        lines.append("}")
        return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where everything went, in points, y downwards, margins included."""

    width_pt: float
    height_pt: float
    centres: Mapping[str, Point]
    """Each box's centre."""
    edges: Mapping[tuple[str, str], tuple[Point, ...]]
    """Each edge's path: a cubic Bézier spline (1 + 3k points) from Graphviz, two points from the fallback."""
    by: str
    """'graphviz', or 'levels' for the fallback."""
    note: str = ""
    """Why the fallback was used; empty for Graphviz."""


def limits_for(n_boxes: int) -> tuple[float, float]:
    """`dot`'s iteration limits (nslimit, mclimit) for a graph of `n_boxes`: the defaults on small graphs,
    fewer passes as graphs grow, since mincross on thousands of nodes is where `dot` spends its time."""
    if n_boxes <= 300:
        return 10.0, 1.0
    if n_boxes <= 1000:
        return 2.0, 0.5
    return 1.0, 0.2


class LayoutCache:
    """Placements by structure: runs `dot` on a miss, keeps the last `capacity` placements. Thread-safe
    (a page may draw in a worker thread); two threads missing on one structure at once may both run `dot`."""

    def __init__(self, *, capacity: int = 32, timeout_s: float = 10.0, program: str = "dot") -> None:
        self.capacity = capacity
        self.timeout_s = timeout_s
        """The most `dot` may take before it is killed and the fallback used."""
        self.program = program
        self.runs = 0
        """Times `dot` was started (hits start nothing)."""
        self._placements: collections.OrderedDict[str, Placement] = collections.OrderedDict()
        self._lock = threading.Lock()

    def place(self, graph: Graph) -> Placement:
        nslimit, mclimit = limits_for(len(graph.boxes))
        source = graph.dot_source(nslimit=nslimit, mclimit=mclimit)
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            if key in self._placements:
                self._placements.move_to_end(key)
                return self._placements[key]
            self.runs += 1
        placement = self._run_dot(graph, source)
        with self._lock:
            self._placements[key] = placement
            self._placements.move_to_end(key)
            while len(self._placements) > self.capacity:
                self._placements.popitem(last=False)
        return placement

    def _run_dot(self, graph: Graph, source: str) -> Placement:
        try:
            done = subprocess.run([self.program, "-Tplain"], input=source, capture_output=True, text=True,
                                  timeout=self.timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return by_level(graph, f"Graphviz did not finish within {self.timeout_s:g} s; laid out by level")
        except OSError as e:
            return by_level(graph, f"Graphviz could not be run ({e.strerror or e}); laid out by level")
        if done.returncode != 0:
            reason = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[0]
            return by_level(graph, f"Graphviz failed ({reason[:200]}); laid out by level")
        return parse_plain(done.stdout)


def parse_plain(output: str) -> Placement:
    """`dot -Tplain`'s answer (inches, y upwards) as a placement in points, y downwards."""
    height_in = 0.0
    width_in = 0.0
    centres: dict[str, Point] = {}
    edges: dict[tuple[str, str], tuple[Point, ...]] = {}

    def point(x: str, y: str) -> Point:
        return (float(x) * POINTS_PER_INCH + MARGIN_PT, (height_in - float(y)) * POINTS_PER_INCH + MARGIN_PT)

    for line in output.splitlines():
        words = line.split()
        if not words:
            continue
        if words[0] == "graph":
            width_in, height_in = float(words[2]), float(words[3])
        elif words[0] == "node":
            centres[words[1]] = point(words[2], words[3])
        elif words[0] == "edge":
            n = int(words[3])
            coords = words[4:4 + 2 * n]
            edges[(words[1], words[2])] = tuple(point(coords[i], coords[i + 1]) for i in range(0, 2 * n, 2))
    return Placement(width_in * POINTS_PER_INCH + 2 * MARGIN_PT, height_in * POINTS_PER_INCH + 2 * MARGIN_PT,
                     centres, edges, "graphviz")


def by_level(graph: Graph, note: str) -> Placement:
    """The fallback: each level a row (wrapped every FALLBACK_ROW_NODES boxes), boxes in the graph's order,
    edges straight from the bottom of the parent to the top of the child."""
    levels: dict[int, list[Box]] = collections.defaultdict(list)
    for box in graph.boxes:
        levels[box.level].append(box)
    centres: dict[str, Point] = {}
    sizes = {b.name: b for b in graph.boxes}
    top = MARGIN_PT
    width = 0.0
    for level in sorted(levels):
        row_boxes = levels[level]
        for first in range(0, len(row_boxes), FALLBACK_ROW_NODES):
            row = row_boxes[first:first + FALLBACK_ROW_NODES]
            row_height = max(b.height_pt for b in row)
            left = MARGIN_PT
            for box in row:
                centres[box.name] = (left + box.width_pt / 2, top + row_height / 2)
                left += box.width_pt + FALLBACK_GAP_PT
            width = max(width, left - FALLBACK_GAP_PT + MARGIN_PT)
            top += row_height + 2 * FALLBACK_GAP_PT
    edges: dict[tuple[str, str], tuple[Point, ...]] = {}
    for a, b in graph.edges:
        if a in centres and b in centres:
            (ax, ay), (bx, by) = centres[a], centres[b]
            edges[(a, b)] = ((ax, ay + sizes[a].height_pt / 2), (bx, by - sizes[b].height_pt / 2))
    return Placement(max(width, 2 * MARGIN_PT), top - 2 * FALLBACK_GAP_PT + MARGIN_PT if centres else 2 * MARGIN_PT,
                     centres, edges, "levels", note)


def path_data(points: Sequence[Point]) -> str:
    """An SVG path's `d` for an edge: a cubic spline for 1 + 3k points, else a polyline."""
    if len(points) >= 4 and (len(points) - 1) % 3 == 0:
        head, rest = points[0], points[1:]
        return f"M{num(head[0])},{num(head[1])}C" + " ".join(f"{num(x)},{num(y)}" for x, y in rest)
    return "M" + "L".join(f"{num(x)},{num(y)}" for x, y in points)
