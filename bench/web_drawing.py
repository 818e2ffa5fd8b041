"""web-drawing: what the web UI's drawings cost (services/web/drawing/), Graphviz's layout first of all.

The DAG is a realistic pipeline: a setup job fans out to samples, each a chain of four steps (align,
call, filter, annotate), every 50 samples (a cohort, a job group of its own) fan in to a gather, each
gather fans out to two reports, and a final job fans in from every gather; setup and final are in the
root group. Sizes: 500 and 2,000 jobs (a box per job,
the default `max_nodes` is 2,000), then 10,000 and 100,000 jobs (the summary by job group and level).

Per size: `first` is the first drawing, layout included (a fresh `LayoutCache`, so `dot` runs);
`dot_cpu` the CPU time of `dot` itself (the children's rusage: on a busy machine wall time is
mostly waiting); `redraw` a drawing after every job's state changed, which the cache serves without
`dot`. `dot` is given 120 s here, not the UI's 10 s, so that its own time is measured;
`within_default_timeout` in the JSON says whether the UI would have used it. `timeline` is the
attempts-by-worker chart of 10,000 attempts on 300 workers (merged into segments).

Needs no database (the runner's server is unused) and `dot` on the PATH (scripts/setup.sh installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time
from typing import Any

from bench.common import BenchContext
from services.web.drawing.dag import STATES, DagNode, draw_dag
from services.web.drawing.layout import LayoutCache
from services.web.drawing.timeline import Bar, draw_timeline

NAME = "web-drawing"
HELP = "the web UI's DAG (Graphviz layout, cached redraw), its summary and the timeline"

SIZES = (500, 2000, 10_000, 100_000)
SMOKE_SIZES = (50, 300)
SMOKE_MAX_NODES = 100
"""In a smoke run the second size is drawn as the summary."""
TIMELINE_ATTEMPTS, SMOKE_TIMELINE_ATTEMPTS = 10_000, 200
STEPS = ("align", "call", "filter", "annotate")
SAMPLES_PER_GATHER = 50
UI_TIMEOUT_S = LayoutCache().timeout_s


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options of its own."""


def figure_names(smoke: bool = False) -> list[str]:
    """The names of every figure a run prints, in order."""
    sizes = SMOKE_SIZES if smoke else SIZES
    return [*(f"{NAME}.dag{n}.{part}" for n in sizes for part in ("first", "dot_cpu", "redraw")),
            f"{NAME}.timeline{SMOKE_TIMELINE_ATTEMPTS if smoke else TIMELINE_ATTEMPTS}.draw"]


def pipeline(n_jobs: int, seed: int = 1) -> list[DagNode]:
    """The realistic DAG of about `n_jobs` jobs (exactly, but for the last sample's chain being cut short)."""
    rng = random.Random(seed)
    nodes = [DagNode(1, "setup", "succeeded", 0, ())]
    gathers: list[int] = []
    lasts: list[int] = []

    def add(name: str, parents: tuple[int, ...], group: int | None = None) -> int:
        job_id = len(nodes) + 1
        cohort = len(gathers) + 1
        nodes.append(DagNode(job_id, name, rng.choice(STATES), cohort if group is None else group, parents))
        return job_id

    while len(nodes) < n_jobs - 1:
        previous = 1
        for name in STEPS:
            if len(nodes) >= n_jobs - 1:
                break
            previous = add(f"{name} sample {len(lasts) + 1}", (previous,))
        lasts.append(previous)
        if len(lasts) == SAMPLES_PER_GATHER and len(nodes) < n_jobs - 3:
            gather = add("gather", tuple(lasts))
            add("report html", (gather,))
            add("report tsv", (gather,))
            gathers.append(gather)
            lasts = []
    add("final", tuple(gathers + lasts), group=0)
    return nodes


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure_dag(n_jobs: int, max_nodes: int) -> dict[str, Any]:
    nodes = pipeline(n_jobs)
    layouts = LayoutCache(timeout_s=120.0)
    cpu, started = children_cpu_s(), time.perf_counter()
    dag = draw_dag(nodes, href=lambda job_id: f"/jobs/{job_id}", max_nodes=max_nodes, layouts=layouts)
    first_s, dot_cpu_s = time.perf_counter() - started, children_cpu_s() - cpu
    if "Graphviz" in dag.summary:
        raise RuntimeError(f"dot did not lay out {n_jobs} jobs: {dag.summary}")
    changed = [DagNode(n.job_id, n.name, STATES[(STATES.index(n.state) + 1) % len(STATES)], n.group_id, n.parents)
               for n in nodes]
    started = time.perf_counter()
    draw_dag(changed, href=lambda job_id: f"/jobs/{job_id}", max_nodes=max_nodes, layouts=layouts)
    redraw_s = time.perf_counter() - started
    if layouts.runs != 1:
        raise RuntimeError(f"the redraw ran dot again ({layouts.runs} runs)")
    return {"n_jobs": len(nodes), "summary": dag.summary, "first_s": first_s, "dot_cpu_s": dot_cpu_s,
            "redraw_s": redraw_s, "svg_bytes": len(dag.svg), "within_default_timeout": first_s < UI_TIMEOUT_S}


def measure_timeline(n_attempts: int) -> dict[str, Any]:
    rng = random.Random(2)
    now = 1_800_000_000.0
    bars = []
    for i in range(n_attempts):
        start = now - 6 * 3600 + rng.random() * 6 * 3600
        end = None if rng.random() < 0.05 else start + rng.expovariate(1 / 600)
        outcome = "running" if end is None else rng.choice(("succeeded",) * 8 + ("failed", "preempted"))
        bars.append(Bar(i + 1, 1, f"worker-{rng.randrange(300)}", start, end, outcome))
    started = time.perf_counter()
    timeline = draw_timeline(bars, now=now, href=lambda job_id: f"/jobs/{job_id}")
    return {"n_attempts": n_attempts, "summary": timeline.summary, "draw_s": time.perf_counter() - started,
            "svg_bytes": len(timeline.svg)}


async def run(ctx: BenchContext, args: argparse.Namespace) -> dict[str, Any]:
    sizes = SMOKE_SIZES if ctx.smoke else SIZES
    max_nodes = SMOKE_MAX_NODES if ctx.smoke else 2000
    names = iter(figure_names(ctx.smoke))
    dags = []
    for n_jobs in sizes:
        measured = await asyncio.to_thread(measure_dag, n_jobs, max_nodes)
        dags.append(measured)
        ctx.figures.add(next(names), round(measured["first_s"], 3), "s")
        ctx.figures.add(next(names), round(measured["dot_cpu_s"], 3), "s")
        ctx.figures.add(next(names), round(measured["redraw_s"] * 1000, 1), "ms")
    timeline = await asyncio.to_thread(measure_timeline, SMOKE_TIMELINE_ATTEMPTS if ctx.smoke else TIMELINE_ATTEMPTS)
    ctx.figures.add(next(names), round(timeline["draw_s"] * 1000, 1), "ms")
    return {"dags": dags, "timeline": timeline, "max_nodes": max_nodes, "ui_timeout_s": UI_TIMEOUT_S,
            "smoke": ctx.smoke}
