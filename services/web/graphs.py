"""A batch's DAG and its timeline of attempts, as SVG: the jobs read page by page (ListJobs with their
parents, or with their attempts), drawn by services.web.drawing, and kept per batch until its next event.

They are served apart from the batch's page (which links them and shows them when they arrive), so the page
itself never waits for a batch's every job. Whoever asks must be able to read the batch (GetBatch with their
token) before a kept drawing is given to them.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

from aiohttp import web

from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_pb2
from corral.batch.v1 import job_service_pb2 as jpb
from services.web import views
from services.web.app import BACKEND, TEMPLATES, path_id, session_of
from services.web.backend import Backend, UserCalls
from services.web.drawing import dag, timeline
from services.web.drawing.svg import standalone

MAX_DRAWN_JOBS = 2000
"""Up to this many jobs the DAG draws each; beyond, groups of jobs (by job group and level)."""
MAX_READ_JOBS = 200_000
"""The most jobs read for one drawing; a larger batch's drawing covers its first ones, and says so."""
PAGE = 1000
KEPT = 16
"""Drawings kept in memory (the most recent)."""

Drawn = tuple[str, str]
"""A drawing's SVG and its summary for people."""


class Drawings:
    """Drawings kept by (batch, its last event, kind): a batch that has not changed is not read again."""

    def __init__(self) -> None:
        self._kept: collections.OrderedDict[tuple[int, int, str], Drawn] = collections.OrderedDict()

    def get(self, key: tuple[int, int, str]) -> Drawn | None:
        found = self._kept.get(key)
        if found is not None:
            self._kept.move_to_end(key)
        return found

    def put(self, key: tuple[int, int, str], drawn: Drawn) -> None:
        self._kept[key] = drawn
        while len(self._kept) > KEPT:
            self._kept.popitem(last=False)


DRAWINGS = web.AppKey("drawings", Drawings)


async def read_jobs(calls: UserCalls, backend: Backend, batch_id: int, *, parents: bool,
                    attempts: bool) -> tuple[list[job_pb2.Job], bool]:
    """The batch's jobs by id (at most MAX_READ_JOBS), and whether there were more."""
    jobs: list[job_pb2.Job] = []
    token = ""
    while True:
        answer = await calls.call(backend.jobs.ListJobs, jpb.ListJobsRequest(
            batch_id=batch_id, page_size=PAGE, page_token=token, with_parents=parents, with_attempts=attempts))
        jobs.extend(answer.jobs)
        token = answer.next_page_token
        if not token:
            return jobs, False
        if len(jobs) >= MAX_READ_JOBS:
            return jobs, True


def job_href(batch_id: int) -> Callable[[int], str]:
    return lambda job_id: f"/batches/{batch_id}/jobs/{job_id}"


async def draw_dag(calls: UserCalls, backend: Backend, batch_id: int) -> Drawn:
    jobs, more = await read_jobs(calls, backend, batch_id, parents=True, attempts=False)
    nodes = [dag.DagNode(job.job_id, job.attributes.get("name", ""), views.job_state(job.state), job.job_group_id,
                         tuple(job.parent_job_ids)) for job in jobs]
    # Graphviz runs as a child process: in a thread, so that the event loop serves other pages meanwhile.
    drawn = await asyncio.to_thread(dag.draw_dag, nodes, href=job_href(batch_id), max_nodes=MAX_DRAWN_JOBS)
    summary = drawn.summary + (f" Only the first {len(jobs):,} jobs are drawn." if more else "")
    return drawn.svg, summary


def attempt_outcome(job: job_pb2.Job, attempt: job_pb2.Attempt) -> str:
    """What became of an attempt, for the timeline: running, or its end reason (a clean exit by the job's
    exit code)."""
    if views.seconds_of(attempt.ended_at) is None:
        return "running"
    reason = views.end_reason(attempt.end_reason).replace(" ", "_")
    if reason == "exited":
        return "succeeded" if attempt.HasField("exit_code") and attempt.exit_code == 0 else "failed"
    return reason or "error"


async def draw_timeline(calls: UserCalls, backend: Backend, batch_id: int) -> Drawn:
    jobs, more = await read_jobs(calls, backend, batch_id, parents=False, attempts=True)
    bars = []
    for job in jobs:
        for number, attempt in enumerate(job.attempts, start=1):
            start = views.seconds_of(attempt.started_at)
            if start is None:
                continue
            bars.append(timeline.Bar(job.job_id, number, attempt.instance_name or "(no worker)", start,
                                     views.seconds_of(attempt.ended_at), attempt_outcome(job, attempt)))
    drawn = await asyncio.to_thread(timeline.draw_timeline, bars, now=time.time(), href=job_href(batch_id))
    summary = drawn.summary + (f" Only the first {len(jobs):,} jobs are drawn." if more else "")
    return drawn.svg, summary


KINDS = {"dag": draw_dag, "timeline": draw_timeline}


async def drawing(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = path_id(request, "batch_id")
    kind = request.match_info["kind"]
    if kind not in KINDS:
        raise web.HTTPNotFound()
    # Checks that this user may read the batch (NotFound otherwise), and says whether it changed.
    batch = (await session.calls.call(backend.batches.GetBatch, bpb.GetBatchRequest(batch_id=batch_id))).batch
    key = (batch_id, batch.last_event_id, kind)
    drawn = request.app[DRAWINGS].get(key)
    if drawn is None:
        drawn = await KINDS[kind](session.calls, backend, batch_id)
        request.app[DRAWINGS].put(key, drawn)
    svg, summary = drawn
    # A document of its own (opened by a link, or fetched into the page): it links the drawings' stylesheet.
    stylesheet = request.app[TEMPLATES].globals["asset"]("drawing.css")  # type: ignore[operator]
    return web.Response(text=standalone(svg, stylesheet), content_type="image/svg+xml", charset="utf-8",
                        headers={"X-Corral-Summary": summary.encode("ascii", "replace").decode()})


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/batches/{batch_id}/{kind:dag|timeline}.svg", drawing)
