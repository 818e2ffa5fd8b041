"""The batch list (the CLI's query language in a search box, keyset pages, links that can be shared) and a
batch's page: its counts (live, services.web.live), its job groups as a tree, its jobs as a filtered table,
its DAG and its timeline (drawn apart, services.web.graphs), and the cancel and re-run buttons, each behind a
confirmation page."""

from __future__ import annotations

import re
import uuid

from aiohttp import web

from corral.batch.v1 import batch_pb2, job_group_pb2, job_pb2
from corral.batch.v1 import batch_service_pb2 as bpb
from corral.batch.v1 import job_group_service_pb2 as gpb
from corral.batch.v1 import job_service_pb2 as jpb
from corral.errors import InvalidArgument
from services.web import graphs, views
from services.web.app import BACKEND, path_id, render, session_of

BATCHES_PER_PAGE = 50
JOBS_PER_PAGE = 50
GROUPS_SHOWN = 200
"""Job groups drawn in a batch's tree (a batch with more says how many are left out)."""
MAX_QUERY_CHARS = 4096
"""A search box's text beyond this is not sent (the frontend's own limit is in bytes and terms)."""
MAX_TOKEN_CHARS = 1024
"""A page token beyond this is not sent (the frontend's are a few dozen characters; it refuses a bad one)."""
_POSITION = re.compile(r"at character (\d+): (.*)", re.S)
DONE_MESSAGES = {"cancelled": "The batch was cancelled: its jobs that had not finished are stopping.",
                 "rerun": "The failed jobs run again, as new jobs of this batch.",
                 "nothing-to-rerun": "No job of this batch failed: there was nothing to run again."}
"""What a page says after an action it redirected from (?done=KEY): fixed words, never the request's."""


def batch_id_of(request: web.Request) -> int:
    return path_id(request, "batch_id")


def query_error(error: InvalidArgument, query: str) -> dict[str, object] | None:
    """A refused query's message and where it went wrong (before, at and after that character), for the
    search box to show inline; None if the refusal is not the query's."""
    for violation in error.field_violations:
        if violation.field == "query":
            found = _POSITION.match(violation.description)
            if found is None:
                return {"message": violation.description, "before": query, "at": "", "after": ""}
            position = min(int(found.group(1)), len(query))
            return {"message": found.group(2), "before": query[:position], "at": query[position:position + 1],
                    "after": query[position + 1:], "position": position}
    return None


async def batch_list(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    query = request.query.get("q", "")[:MAX_QUERY_CHARS]
    page = request.query.get("page", "")[:MAX_TOKEN_CHARS]
    error = None
    found: list[batch_pb2.Batch] = []
    next_page = ""
    try:
        answer = await session.calls.call(backend.batches.ListBatches, bpb.ListBatchesRequest(
            query=query, page_size=BATCHES_PER_PAGE, page_token=page))
        found, next_page = list(answer.batches), answer.next_page_token
    except InvalidArgument as e:
        error = query_error(e, query)
        if error is None:
            raise
    return render(request, "batches.html", title="Batches", query=query, error=error, page=page,
                  next_page=next_page, batches=[_batch_row(b) for b in found])


def _batch_row(batch: batch_pb2.Batch) -> dict[str, object]:
    return {"id": batch.batch_id, "name": batch.attributes.get("name", ""), "user": batch.user,
            "project": batch.billing_project, "state": views.batch_state(batch), "counts": views.counts(batch.counts),
            "cost": views.usd(batch.cost_micro_usd), "created": views.when(batch.created_at),
            "duration": views.span(batch.created_at, batch.completed_at)}


async def batch_page(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = batch_id_of(request)
    job_query = request.query.get("jobs", "")[:MAX_QUERY_CHARS]
    job_page = request.query.get("jobs_page", "")[:MAX_TOKEN_CHARS]
    batch, groups = await session.calls.gather(
        session.calls.call(backend.batches.GetBatch, bpb.GetBatchRequest(batch_id=batch_id)),
        session.calls.call(backend.groups.ListJobGroups, gpb.ListJobGroupsRequest(
            batch_id=batch_id, page_size=GROUPS_SHOWN)))
    error = None
    jobs: list[job_pb2.Job] = []
    next_jobs = ""
    try:
        answer = await session.calls.call(backend.jobs.ListJobs, jpb.ListJobsRequest(
            batch_id=batch_id, query=job_query, page_size=JOBS_PER_PAGE, page_token=job_page))
        jobs, next_jobs = list(answer.jobs), answer.next_page_token
    except InvalidArgument as e:
        error = query_error(e, job_query)
        if error is None:
            raise
    batch = batch.batch
    return render(request, "batch.html", title=f"Batch {batch_id}", batch=_batch_row(batch),
                  complete=batch.state == batch_pb2.BATCH_STATE_COMPLETE, cancelled=bool(batch.cancellation.cause),
                  cancellation=batch.cancellation, attributes=sorted(batch.attributes.items()),
                  tree=_group_tree(list(groups.job_groups)), more_groups=bool(groups.next_page_token),
                  jobs=[_job_row(j) for j in jobs], job_query=job_query, job_page=job_page, next_jobs=next_jobs,
                  error=error, done=DONE_MESSAGES.get(request.query.get("done", ""), ""),
                  n_jobs=batch.counts.n_jobs, drawn_limit=graphs.MAX_DRAWN_JOBS)


def _job_row(job: job_pb2.Job) -> dict[str, object]:
    return {"id": job.job_id, "name": job.attributes.get("name", ""), "state": views.job_state(job.state),
            "group": job.job_group_id, "exit_code": job.exit_code if job.HasField("exit_code") else "",
            "cost": views.usd(job.cost_micro_usd), "duration": views.span(job.started_at, job.completed_at)}


def _group_tree(groups: list[job_group_pb2.JobGroup]) -> list[dict[str, object]]:
    """The groups as nested nodes ({id, name, state, counts, children}), roots first; a group whose parent is
    not in the list is shown as a root."""
    nodes = {group.job_group_id: {"id": group.job_group_id, "name": group.attributes.get("name", ""),
                                  "state": views.batch_state(group), "counts": views.counts(group.counts),
                                  "children": []} for group in groups}
    roots = []
    for group in groups:
        node = nodes[group.job_group_id]
        parent = group.parent_job_group_id if group.HasField("parent_job_group_id") else None
        if parent is not None and parent in nodes and parent != group.job_group_id:
            nodes[parent]["children"].append(node)  # type: ignore[attr-defined]
        else:
            roots.append(node)
    return roots


async def confirm_cancel(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = batch_id_of(request)
    batch = (await session.calls.call(backend.batches.GetBatch, bpb.GetBatchRequest(batch_id=batch_id))).batch
    return render(request, "confirm.html", title=f"Cancel batch {batch_id}?", batch=_batch_row(batch),
                  action=f"/batches/{batch_id}/cancel", button="Cancel the batch",
                  explain=f"Cancelling stops every job of batch {batch_id} that has not finished "
                          f"({batch.counts.n_running} running, {batch.counts.n_ready + batch.counts.n_pending} "
                          "waiting). Jobs that finished keep their results. This cannot be undone.",
                  back=f"/batches/{batch_id}", token="")


async def cancel(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = batch_id_of(request)
    await session.calls.call(backend.batches.CancelBatch, bpb.CancelBatchRequest(
        batch_id=batch_id, reason=f"cancelled in the web UI by {session.who.username}"))
    raise web.HTTPSeeOther(f"/batches/{batch_id}?done=cancelled")


async def confirm_rerun(request: web.Request) -> web.Response:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = batch_id_of(request)
    batch = (await session.calls.call(backend.batches.GetBatch, bpb.GetBatchRequest(batch_id=batch_id))).batch
    failed = batch.counts.n_failed + batch.counts.n_errored
    return render(request, "confirm.html", title=f"Re-run the failed jobs of batch {batch_id}?",
                  batch=_batch_row(batch), action=f"/batches/{batch_id}/rerun", button="Re-run the failed jobs",
                  explain=f"{failed} job(s) of batch {batch_id} failed or ended in error. Each runs again as a new "
                          "job of the batch, with the same spec; the jobs that depended on it wait for the new one.",
                  back=f"/batches/{batch_id}", token=str(uuid.uuid4()))


async def rerun(request: web.Request) -> web.StreamResponse:
    session = session_of(request)
    backend = request.app[BACKEND]
    batch_id = batch_id_of(request)
    form = await request.post()
    token = str(form.get("token", ""))[:64] or str(uuid.uuid4())
    answer = await session.calls.call(backend.batches.RerunFailedJobs, bpb.RerunFailedJobsRequest(
        batch_id=batch_id, idempotency_token=token))
    raise web.HTTPSeeOther(f"/batches/{batch_id}?done={'rerun' if answer.HasField('update') else 'nothing-to-rerun'}")


def add_routes(router: web.UrlDispatcher) -> None:
    router.add_get("/batches", batch_list)
    router.add_get("/batches/{batch_id}", batch_page)
    router.add_get("/batches/{batch_id}/cancel", confirm_cancel)
    router.add_post("/batches/{batch_id}/cancel", cancel)
    router.add_get("/batches/{batch_id}/rerun", confirm_rerun)
    router.add_post("/batches/{batch_id}/rerun", rerun)
